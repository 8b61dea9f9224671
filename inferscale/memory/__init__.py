"""Message normalisation, LLM fact extraction and reconcile (the write path's first steps)."""

from inferscale.memory.chunking import chunk_messages, estimate_tokens, split_text
from inferscale.memory.extraction import ExtractedFacts, Extraction, FactExtractor, facts_json_schema, parse_facts
from inferscale.memory.grounding import ungrounded_reason
from inferscale.memory.llm import JSONGenerator, OpenAIJSONGenerator, TransformersJSONGenerator
from inferscale.memory.messages import ROLES, Message, normalize_messages, user_turns
from inferscale.memory.prompts import (
    FACT_EXTRACTION_SYSTEM_PROMPT,
    build_extraction_messages,
    fact_extraction_system_prompt,
)
from inferscale.memory.reconcile import Decision, Plan, Reconciler, decisions_json_schema, parse_decisions

__all__ = [
    "FACT_EXTRACTION_SYSTEM_PROMPT",
    "ROLES",
    "Decision",
    "ExtractedFacts",
    "Extraction",
    "FactExtractor",
    "JSONGenerator",
    "Message",
    "OpenAIJSONGenerator",
    "Plan",
    "Reconciler",
    "TransformersJSONGenerator",
    "build_extraction_messages",
    "chunk_messages",
    "decisions_json_schema",
    "estimate_tokens",
    "fact_extraction_system_prompt",
    "facts_json_schema",
    "normalize_messages",
    "parse_decisions",
    "parse_facts",
    "split_text",
    "ungrounded_reason",
    "user_turns",
]
