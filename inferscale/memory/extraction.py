"""LLM fact extraction: conversation in, short standalone facts out.

The extractor asks a :class:`~inferscale.memory.llm.JSONGenerator` for ``{"facts": [...]}`` under a JSON schema
and parses the answer tolerantly, because unconstrained endpoints wrap JSON in code fences or prose and may be
cut off by their token budget.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from datetime import date
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import from_json

from inferscale.errors import ExtractionError, InvalidInputError
from inferscale.memory.llm import JSONGenerator
from inferscale.memory.messages import Message
from inferscale.memory.prompts import build_extraction_messages

log = logging.getLogger(__name__)

_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_MAX_JSON_STARTS = 16  # '{' / '[' positions tried in prose before giving up


class ExtractedFacts(BaseModel):
    """The extraction answer as parsed: ``{"facts": ["...", ...]}``. Extra keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    facts: list[str]


@functools.cache
def _facts_answer_model(max_facts: int, max_fact_chars: int) -> type[ExtractedFacts]:
    """:class:`ExtractedFacts` as the LLM must write it: no other key, at most ``max_facts`` non-empty facts."""

    class StrictExtractedFacts(ExtractedFacts):
        model_config = ConfigDict(extra="forbid", title="ExtractedFacts")

        facts: list[Annotated[str, Field(min_length=1, max_length=max_fact_chars)]] = Field(max_length=max_facts)

    return StrictExtractedFacts


def facts_json_schema(max_facts: int, max_fact_chars: int) -> dict[str, Any]:
    """The JSON schema sent with every extraction call, generated from :class:`ExtractedFacts` made strict.

    Strict as grammar-constrained decoding and OpenAI's strict structured outputs want it: ``facts`` is required
    and no other key is allowed (``additionalProperties: false``). The parser stays lenient (extra keys, empty
    facts and truncation are tolerated) because unconstrained endpoints do not follow the schema.

    Args:
        max_facts: ``maxItems`` of the list (bounds decode time on small models, which tend to repeat).
        max_fact_chars: ``maxLength`` of one fact, in characters.

    Returns:
        A JSON schema (a new dict on every call) titled ``"ExtractedFacts"``.
    """
    return _facts_answer_model(max_facts, max_fact_chars).model_json_schema()


def _candidates(raw: str) -> list[str]:
    """Texts that may hold the JSON answer, most likely first: fenced blocks, then each ``{``/``[`` onward."""
    texts = [m.group(1) for m in _FENCE.finditer(raw)] + [raw]
    out: list[str] = []
    for text in texts:
        starts = [i for i, ch in enumerate(text) if ch in "{["][:_MAX_JSON_STARTS]
        out.extend(text[i:] for i in starts)
    return out


def tolerant_json_values(raw: str, list_key: str) -> Iterator[Any]:
    """Every JSON value that can be read from an LLM answer, most likely first.

    Tries fenced blocks, then each ``{``/``[`` onward, parsing partial (truncated) JSON; a bare list is wrapped as
    ``{list_key: list}``. Callers take the first value that validates against their schema. An answer that is not
    valid Unicode (it holds a lone surrogate, which no store or JSON encoder takes) yields nothing, so the caller
    raises its :class:`~inferscale.errors.ExtractionError` and nothing of the call is stored.
    """
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return
    for candidate in _candidates(raw):
        try:
            value = from_json(candidate, allow_partial=True)
        except ValueError:
            continue
        yield {list_key: value} if isinstance(value, list) else value


def parse_facts(raw: str) -> list[str]:
    """Parse an extraction answer tolerantly and clean the facts.

    Accepts plain JSON, JSON inside a Markdown code fence, JSON surrounded by prose, truncated JSON (a
    half-written last fact is dropped) and a bare JSON list of strings. Facts are stripped, inner whitespace
    collapsed, empty ones dropped and duplicates (compared case-insensitively) removed, keeping first-seen
    order.

    Args:
        raw: the generator's answer text.

    Returns:
        The facts, possibly empty when the answer was ``{"facts": []}``.

    Raises:
        ExtractionError: when no ``{"facts": [<strings>]}`` object (or list of strings) can be read from ``raw``.
    """
    for value in tolerant_json_values(raw, "facts"):
        try:
            parsed = ExtractedFacts.model_validate(value)
        except ValidationError:
            continue
        return _clean(parsed.facts)
    raise ExtractionError(f'no {{"facts": [...]}} JSON could be read from the LLM answer: {raw[:300]!r}')


def _clean(facts: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for fact in facts:
        text = " ".join(fact.split())
        key = text.casefold()
        if text and key not in seen:
            seen.add(key)
            out.append(text)
    return out


class FactExtractor:
    """Extracts short standalone facts about the user from a conversation with an LLM.

    Args:
        generator: the LLM backend (constrained local model or OpenAI-compatible endpoint).
        max_new_tokens: decode budget of one extraction, in tokens.
        max_facts: the most facts one call may return (the schema's ``maxItems``).
        max_fact_chars: the longest fact, in characters (the schema's ``maxLength``).
        include_assistant: show assistant turns to the LLM too (better context for large models; a 135M
            model extracts false facts from them, so it is off by default).

    Raises:
        InvalidInputError: for a non-positive budget or limit.
    """

    def __init__(
        self,
        generator: JSONGenerator,
        max_new_tokens: int = 160,
        *,
        max_facts: int = 8,
        max_fact_chars: int = 200,
        include_assistant: bool = False,
    ) -> None:
        for name, value in (
            ("max_new_tokens", max_new_tokens),
            ("max_facts", max_facts),
            ("max_fact_chars", max_fact_chars),
        ):
            if value < 1:
                raise InvalidInputError(f"{name} must be >= 1, got {value}")
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.include_assistant = include_assistant
        self.schema = facts_json_schema(max_facts, max_fact_chars)

    def extract(self, messages: list[Message], today: date | None = None) -> list[str]:
        """Extract the facts of one conversation.

        Args:
            messages: normalised turns (see :func:`~inferscale.memory.normalize_messages`); system turns (and
                assistant turns unless ``include_assistant``) are not shown to the LLM.
            today: the date relative dates are resolved against; ``None`` means :meth:`date.today`.

        Returns:
            Cleaned, de-duplicated facts in the order the LLM gave them; ``[]`` when there is nothing to
            remember or no message is left to show (then the LLM is not called).

        Raises:
            InvalidInputError: when ``messages`` is empty.
            ExtractionError: when the generator fails or its answer holds no parseable facts object.
        """
        if not messages:
            raise InvalidInputError("messages is empty; pass at least one user or assistant message")
        prompt = build_extraction_messages(messages, today or date.today(), include_assistant=self.include_assistant)
        if not prompt:
            return []
        raw = self.generator.generate_json(prompt, self.schema, self.max_new_tokens)
        facts = parse_facts(raw)
        log.debug("extracted %d facts from %d messages", len(facts), len(messages))
        return facts
