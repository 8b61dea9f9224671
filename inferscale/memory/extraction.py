"""LLM fact extraction: conversation in, short standalone facts out.

The extractor asks a :class:`~inferscale.memory.llm.JSONGenerator` for ``{"facts": [...]}`` under a JSON schema
and parses the answer tolerantly, because unconstrained endpoints wrap JSON in code fences or prose and may be
cut off by their token budget. A malformed answer never loses the conversation: what can be repaired is, an
unusable answer is asked for once more, and when that fails too the user's turns are kept verbatim
(:mod:`inferscale.memory.answers` classifies the failures).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from inferscale.errors import ExtractionError, InvalidInputError
from inferscale.memory.answers import Reading, ask, read_items, repair_text
from inferscale.memory.llm import JSONGenerator
from inferscale.memory.messages import Message, user_turns
from inferscale.memory.prompts import build_extraction_messages
from inferscale.storable import is_blank

log = logging.getLogger(__name__)


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


_ITEM_REJECTS = "not a string, empty, or longer than max_fact_chars"


def _collapse(value: object) -> object:
    """A str fact with its inner whitespace collapsed, and empty when it shows nothing (invisible characters only:
    :func:`~inferscale.storable.is_blank`), so that it is dropped as an empty one is."""
    if not isinstance(value, str):
        return value
    return "" if is_blank(value) else " ".join(value.split())


@functools.cache
def _fact_adapter(max_fact_chars: int | None) -> TypeAdapter[str]:
    """Validates one fact as it is stored: a string (no coercion), inner whitespace collapsed, 1 to
    ``max_fact_chars`` characters (no upper bound for ``None``)."""
    return TypeAdapter(
        Annotated[str, StringConstraints(min_length=1, max_length=max_fact_chars), BeforeValidator(_collapse)]
    )


class _AnyFacts(BaseModel):
    """The answer's shape before its items are checked: ``{"facts": [<anything>, ...]}``."""

    model_config = ConfigDict(extra="ignore")

    facts: list[Any]


def read_facts(raw: str, max_fact_chars: int | None = None) -> Reading[list[str]]:
    """Read an extraction answer tolerantly, repairing what can be repaired (see :mod:`inferscale.memory.answers`).

    Accepts plain JSON, JSON inside a Markdown code fence, JSON surrounded by prose, truncated JSON (a
    half-written last fact is dropped) and a bare JSON list (not one inside another object: ``{"items": [...]}``
    is the wrong shape). A value whose facts are all unusable gives way to the next one read from the answer. Lone
    surrogates and NUL are dropped first. Facts get their whitespace collapsed; a fact that is not a string, is
    empty or is longer than ``max_fact_chars`` is dropped, and so is a repeat (compared case-insensitively),
    keeping first-seen order.

    Args:
        raw: the generator's answer text.
        max_fact_chars: the longest fact kept, in characters; ``None`` keeps any length.

    Returns:
        A :class:`Reading` of the facts: ``[]`` for ``{"facts": []}`` (nothing to remember); ``value=None`` when
        no ``{"facts": [...]}`` object with a usable fact could be read: none at all, only ones whose facts are
        all unusable, or one cut off before its first fact (which is not "nothing to remember").
    """
    text, repairs = repair_text(raw)
    adapter = _fact_adapter(max_fact_chars)

    def facts_of(value: Any) -> list[Any] | None:
        try:
            return _AnyFacts.model_validate(value).facts
        except ValidationError:
            return None

    def keep(items: list[Any]) -> tuple[list[str], list[str]]:
        kept: list[str] = []
        dropped: list[str] = []
        seen: set[str] = set()
        for item in items:
            try:
                fact = adapter.validate_python(item)
            except ValidationError as exc:
                dropped.append(f"dropped the fact {str(item)[:80]!r}: {exc.errors()[0]['msg']}")
                continue
            if fact.casefold() not in seen:
                seen.add(fact.casefold())
                kept.append(fact)
        return kept, dropped

    return read_items(
        text,
        "facts",
        facts_of,
        keep,
        noun="fact",
        unusable=lambda n: f"none of its {n} facts is usable ({_ITEM_REJECTS})",
        repairs=repairs,
    )


def parse_facts(raw: str) -> list[str]:
    """Parse an extraction answer tolerantly and clean the facts (:func:`read_facts`, any fact length).

    Args:
        raw: the generator's answer text.

    Returns:
        The facts, possibly empty when the answer was ``{"facts": []}``.

    Raises:
        ExtractionError: when no ``{"facts": [...]}`` object (or list) with a usable fact can be read from ``raw``.
    """
    reading = read_facts(raw)
    if reading.value is None:
        raise ExtractionError(f"{reading.problem}; the LLM answer: {repair_text(raw[:300])[0]!r}")
    return reading.value


@dataclass(frozen=True, slots=True)
class Extraction:
    """The facts of one conversation chunk.

    Attributes:
        facts: the facts to store, in the order given.
        verbatim: ``True`` when no LLM answer was usable and ``facts`` are the chunk's user turns as they were
            written (:func:`~inferscale.memory.messages.user_turns`); they need no grounding check.
    """

    facts: list[str]
    verbatim: bool = False


FACTS_SHAPE = '{"facts": ["<fact>", ...]}'


class FactExtractor:
    """Extracts short standalone facts about the user from a conversation with an LLM.

    Args:
        generator: the LLM backend (constrained local model or OpenAI-compatible endpoint).
        max_new_tokens: decode budget of one extraction, in tokens.
        max_facts: the most facts one call may return (the schema's ``maxItems``).
        max_fact_chars: the longest fact, in characters (the schema's ``maxLength``).
        include_assistant: show assistant turns to the LLM too (better context for large models; a 135M
            model extracts false facts from them, so it is off by default).
        retries: how many more times the LLM is asked when an answer holds nothing usable (see
            :func:`~inferscale.memory.answers.ask`); 0 falls back at once.
        max_memory_chars: the longest user turn stored as one memory by that fallback, in characters; a longer
            one is cut into pieces (:func:`~inferscale.memory.messages.user_turns`).
        instructions: the app's custom instructions, shown after the prompt's own rules
            (:func:`~inferscale.memory.prompts.fact_extraction_system_prompt`); ``None`` for none. Checked by the
            caller (:data:`inferscale.config.Instructions`).

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
        retries: int = 1,
        max_memory_chars: int = 4000,
        instructions: str | None = None,
    ) -> None:
        if retries < 0:
            raise InvalidInputError(f"retries must be >= 0, got {retries}")
        for name, value in (
            ("max_new_tokens", max_new_tokens),
            ("max_facts", max_facts),
            ("max_fact_chars", max_fact_chars),
            ("max_memory_chars", max_memory_chars),
        ):
            if value < 1:
                raise InvalidInputError(f"{name} must be >= 1, got {value}")
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.include_assistant = include_assistant
        self.max_fact_chars = max_fact_chars
        self.max_facts = max_facts
        self.retries = retries
        self.max_memory_chars = max_memory_chars
        self.instructions = instructions
        self.schema = facts_json_schema(max_facts, max_fact_chars)

    def extract(self, messages: list[Message], today: date | None = None) -> Extraction:
        """Extract the facts of one conversation.

        A malformed answer is repaired where it can be (lone surrogates and NUL dropped; facts that are not
        strings, empty or longer than ``max_fact_chars`` dropped). When nothing usable is left the LLM is asked
        once more (``retries``), and then the user's turns are returned verbatim. Each step is logged as a warning.

        Args:
            messages: normalised turns (see :func:`~inferscale.memory.normalize_messages`); system turns (and
                assistant turns unless ``include_assistant``) are not shown to the LLM.
            today: the date relative dates are resolved against; ``None`` means :meth:`date.today`.

        Returns:
            An :class:`Extraction`: cleaned, de-duplicated facts in the order the LLM gave them (``[]`` when
            there is nothing to remember or no message is left to show; then the LLM is not called), or the
            user's turns verbatim when no answer was usable.

        Raises:
            InvalidInputError: when ``messages`` is empty.
            ExtractionError: when the generator fails to answer (connection, HTTP status, no text content).
        """
        if not messages:
            raise InvalidInputError("messages is empty; pass at least one user or assistant message")
        prompt = build_extraction_messages(
            messages, today or date.today(), include_assistant=self.include_assistant, instructions=self.instructions
        )
        if not prompt:
            return Extraction([])
        reading = ask(
            self.generator,
            prompt,
            self.schema,
            self.max_new_tokens,
            lambda raw: read_facts(raw, self.max_fact_chars),
            retries=self.retries,
            shape=FACTS_SHAPE,
            what="extraction",
        )
        if reading.value is None:
            verbatim = user_turns(messages, self.max_memory_chars)
            log.warning(
                "extraction: no usable LLM answer (%s); storing %d user turns verbatim", reading.problem, len(verbatim)
            )
            return Extraction(verbatim, verbatim=True)
        facts = reading.value
        if len(facts) > self.max_facts:  # an endpoint that ignores the schema's maxItems
            log.warning("extraction: the LLM answer gave %d facts; keeping the first %d", len(facts), self.max_facts)
            facts = facts[: self.max_facts]
        log.debug("extracted %d facts from %d messages", len(facts), len(messages))
        return Extraction(facts)
