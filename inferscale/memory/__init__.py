"""Message normalisation and LLM fact extraction (the write path's first step)."""

from inferscale.memory.extraction import ExtractedFacts, FactExtractor, facts_json_schema, parse_facts
from inferscale.memory.llm import (
    JSONGenerator,
    OpenAIJSONGenerator,
    TransformersJSONGenerator,
    close_truncated_json,
)
from inferscale.memory.messages import ROLES, Message, normalize_messages
from inferscale.memory.prompts import (
    FACT_EXTRACTION_SYSTEM_PROMPT,
    build_extraction_messages,
    fact_extraction_system_prompt,
)

__all__ = [
    "FACT_EXTRACTION_SYSTEM_PROMPT",
    "ROLES",
    "ExtractedFacts",
    "FactExtractor",
    "JSONGenerator",
    "Message",
    "OpenAIJSONGenerator",
    "TransformersJSONGenerator",
    "build_extraction_messages",
    "close_truncated_json",
    "fact_extraction_system_prompt",
    "facts_json_schema",
    "normalize_messages",
    "parse_facts",
]
