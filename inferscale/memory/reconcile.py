"""Reconcile new facts with stored memories: the LLM decides ADD, UPDATE, DELETE or NONE for each.

The LLM never sees a memory's UUID. The memories it is shown are numbered ``"0"``, ``"1"``, ... (oldest first) and
its answer is mapped back through that numbering; a decision about a number it was not shown is skipped with a
warning while the other decisions still apply. Decoding is constrained to :func:`decisions_json_schema` where
the backend supports it, and the answer is parsed tolerantly (code fences, surrounding prose, truncation)
where it does not. A malformed answer is repaired where it can be; an unusable one is asked for once more, and
then the new facts are added as extracted (:mod:`inferscale.memory.answers` classifies the failures).
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from inferscale.errors import ExtractionError, InvalidInputError
from inferscale.memory.answers import Reading, ask, read_items, repair_text
from inferscale.memory.grounding import comparable, is_cjk
from inferscale.memory.llm import JSONGenerator

log = logging.getLogger(__name__)

Event = Literal["ADD", "UPDATE", "DELETE", "NONE"]
EVENTS: tuple[str, ...] = get_args(Event)

RECONCILE_SYSTEM_PROMPT = (
    "You keep a user's memory up to date. You get the stored memories, each with an id, and new facts. "
    "Answer with one entry per new fact:\n"
    '- "ADD" when the fact is new: "id" is "new", "text" is the fact.\n'
    '- "UPDATE" when the fact changes or adds detail to a stored memory: "id" is that memory\'s id, "text" is '
    'the corrected memory, "old_memory" is its old text (null for the other events).\n'
    '- "DELETE" when the fact makes a stored memory false and replaces nothing: "id" is that memory\'s id.\n'
    '- "NONE" when the fact is already stored: "id" is the memory that holds it.\n'
    "Only use ids from the list. Keep the language of the facts and copy names exactly. "
    'Reply with JSON: {"memory": [{"id": ..., "text": ..., "event": ..., "old_memory": ...}]}.'
)

_EXAMPLE_INPUT = {
    "memories": [{"id": "0", "text": "Likes cheese pizza"}, {"id": "1", "text": "Works at Acme"}],
    "new_facts": ["Loves cheese and pepperoni pizza", "Has a cat named Miso", "Works at Acme"],
}
_EXAMPLE_ANSWER = {  # every key in every entry, as the strict schema requires
    "memory": [
        {"id": "0", "text": "Loves cheese and pepperoni pizza", "event": "UPDATE", "old_memory": "Likes cheese pizza"},
        {"id": "new", "text": "Has a cat named Miso", "event": "ADD", "old_memory": None},
        {"id": "1", "text": "Works at Acme", "event": "NONE", "old_memory": None},
    ]
}


def build_reconcile_messages(shown: Sequence[str], facts: Sequence[str]) -> list[dict[str, str]]:
    """The chat sent to the LLM: instruction, one worked example, then the memories (numbered) and the facts.

    Args:
        shown: texts of the stored memories the LLM may act on; the i-th gets id ``str(i)``.
        facts: the new facts.

    Returns:
        OpenAI-style turns.
    """
    payload = {"memories": [{"id": str(i), "text": t} for i, t in enumerate(shown)], "new_facts": list(facts)}
    return [
        {"role": "system", "content": RECONCILE_SYSTEM_PROMPT},
        {"role": "user", "content": json.dumps(_EXAMPLE_INPUT, ensure_ascii=False)},
        {"role": "assistant", "content": json.dumps(_EXAMPLE_ANSWER, ensure_ascii=False)},
        {"role": "user", "content": json.dumps(payload, ensure_ascii=False)},
    ]


class Decision(BaseModel):
    """One decision of the LLM. ``id`` is the short id it was shown (or anything, for ADD)."""

    model_config = ConfigDict(extra="ignore")

    id: str = ""
    text: str = ""
    event: str
    old_memory: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: object) -> str:
        return "" if value is None else str(value).strip()

    @field_validator("event", mode="before")
    @classmethod
    def _event_upper(cls, value: object) -> str:
        return "" if value is None else str(value).strip().upper()  # null is no event (str(None) read as NONE)


@functools.cache
def _decisions_answer_model(max_items: int, max_text_chars: int) -> type[BaseModel]:
    """The reconcile answer as the LLM must write it: ``{"memory": [<strict Decision>, ...]}``, nothing else."""

    class StrictDecision(Decision):
        model_config = ConfigDict(extra="forbid", title="Decision")

        id: str = Field(max_length=12)
        text: str = Field(max_length=max_text_chars)
        event: Event
        old_memory: Annotated[str, Field(max_length=max_text_chars)] | None

    class MemoryDecisions(BaseModel):
        model_config = ConfigDict(extra="forbid")

        memory: list[StrictDecision] = Field(max_length=max_items)

    return MemoryDecisions


def decisions_json_schema(max_items: int, max_text_chars: int) -> dict[str, Any]:
    """The JSON schema of the reconcile answer ``{"memory": [{"id", "text", "event", "old_memory"}]}``.

    Generated from :class:`Decision` made strict, as grammar-constrained decoding and OpenAI's strict structured
    outputs want it: every key is required (``old_memory`` is a string or ``null``), no other key is allowed
    (``additionalProperties: false``) and ``event`` is one of :data:`EVENTS`. The parser stays lenient
    (:func:`parse_decisions`) because unconstrained endpoints do not follow the schema.

    Args:
        max_items: ``maxItems`` of the list (bounds decode time).
        max_text_chars: ``maxLength`` of a memory text, in characters.

    Returns:
        A JSON schema (a new dict on every call) titled ``"MemoryDecisions"``; the entry schema is under ``$defs``.
    """
    return _decisions_answer_model(max_items, max_text_chars).model_json_schema()


def read_decisions(raw: str) -> Reading[list[Decision]]:
    """Read the reconcile answer tolerantly (plain JSON, fenced, inside prose, truncated, or a bare list), repairing
    what can be repaired (see :mod:`inferscale.memory.answers`): lone surrogates and NUL are dropped, and an entry
    that is not a decision object (for example the half-written last entry of a truncated answer) is dropped. A value
    whose entries are all unusable gives way to the next one read from the answer.

    Returns:
        A :class:`Reading` of the decisions in the order given (events upper-cased; unknown events are kept and
        skipped by :func:`plan`): ``[]`` for ``{"memory": []}``; ``value=None`` when no ``{"memory": [...]}``
        object with a decision can be read: none at all, only ones whose entries are none of them decisions, or one
        cut off before its first decision.
    """
    text, repairs = repair_text(raw)

    def keep(items: list[Any]) -> tuple[list[Decision], list[str]]:
        decisions: list[Decision] = []
        dropped: list[str] = []
        for item in items:
            try:
                decisions.append(Decision.model_validate(item))
            except ValidationError:
                dropped.append(f"dropped an entry that is not a decision: {str(item)[:120]!r}")
        return decisions, dropped

    return read_items(
        text,
        "memory",
        lambda value: (
            value.get("memory") if isinstance(value, dict) and isinstance(value.get("memory"), list) else None
        ),
        keep,
        noun="decision",
        unusable=lambda n: f"none of its {n} entries is a decision object",
        repairs=repairs,
    )


def parse_decisions(raw: str) -> list[Decision]:
    """Parse the reconcile answer tolerantly (:func:`read_decisions`).

    Returns:
        The decisions in the order given (events upper-cased; unknown events are kept and skipped by :func:`plan`).

    Raises:
        ExtractionError: when no ``{"memory": [...]}`` object with a decision (or an empty list) can be read.
    """
    reading = read_decisions(raw)
    if reading.value is None:
        raise ExtractionError(f"{reading.problem}; the LLM answer: {repair_text(raw[:300])[0]!r}")
    for repair in reading.repairs:
        log.warning("reconcile: %s", repair)
    return reading.value


DECISIONS_SHAPE = '{"memory": [{"id": "...", "text": "...", "event": "ADD|UPDATE|DELETE|NONE", "old_memory": null}]}'


@dataclass(frozen=True, slots=True)
class Plan:
    """What to change, in terms of real memory ids.

    Attributes:
        adds: texts to add.
        updates: ``(memory_id, new_text)`` pairs.
        deletes: memory ids to delete.
        confirmed: texts of the stored memories an accepted NONE said already hold a fact.
        skipped: one reason per decision that is not applied (unknown id, ungrounded text, unrelated target,
            repeated id, bad event).
    """

    adds: list[str] = field(default_factory=list)
    updates: list[tuple[str, str]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
HOLDS_MIN_SHARE = 0.6
"""A text "holds" another when it contains at least this share of the other's words (CJK: characters)."""
RELATED_MIN_SHARE = 0.34
"""A stored memory is "related" to a new fact when this share of the memory's words occur in the fact."""


def _tokens(text: str) -> set[str]:
    out: set[str] = set()
    for word in _TOKEN.findall(comparable(text).casefold()):
        if any(is_cjk(ch) for ch in word):
            out.update(word)  # CJK and Hangul are not space-separated: compare characters
        else:
            out.add(word)
    return out


def _share(part: str, whole: str) -> float:
    wanted = _tokens(part)
    return len(wanted & _tokens(whole)) / len(wanted) if wanted else 0.0


def holds(container: str, text: str) -> bool:
    """Whether ``container`` holds at least :data:`HOLDS_MIN_SHARE` of the words of ``text``."""
    return _share(text, container) >= HOLDS_MIN_SHARE


def _drop_repeats(result: Plan, skip: Callable[[str], None]) -> None:
    """Keep one of each ADD or UPDATE text of the answer, compared case-insensitively (an UPDATE's over an ADD's,
    then the first given: the memory it refines keeps the text). A text a stored memory already has is left to the
    write, which compares it in exactly the scope (an ADD of it is skipped, an UPDATE to it deletes the updated
    memory: :func:`~inferscale.storage.row_changes.update_memories`): a shown memory may be of a narrower scope (a
    run's), where the same fact does not make one for the user redundant."""
    written: set[str] = set()

    def first(text: str) -> bool:
        key = text.casefold()
        if key in written:
            skip(f"{text!r} is given by another decision of the answer; it is not stored twice")
            return False
        written.add(key)
        return True

    result.updates[:] = [(memory_id, text) for memory_id, text in result.updates if first(text)]
    result.adds[:] = [text for text in result.adds if first(text)]


def plan(
    decisions: Sequence[Decision],
    shown: Sequence[tuple[str, str]],
    facts: Sequence[str],
    *,
    max_text_chars: int | None = None,
) -> Plan:
    """Map decisions on short ids back to memory ids, keeping only changes grounded in the new facts.

    Rules, each broken rule skipping the decision with a warning:

    - UPDATE and DELETE need an id the LLM was shown, at most one action per id, and a target memory related
      to one of the facts (:data:`RELATED_MIN_SHARE` of its words occur in a fact), so that a model cannot
      rewrite or delete an unrelated memory.
    - ADD and UPDATE texts must be grounded: the new facts (and, for UPDATE, the old text) hold the text
      (:func:`holds`). A small model's invented text is never stored.
    - ADD and UPDATE texts are at most ``max_text_chars`` long, the bound the answer's schema states (an
      unconstrained endpoint does not follow it).
    - An ADD or UPDATE text that another kept decision of the answer gives (compared case-insensitively) is not
      stored twice (:func:`_drop_repeats`).
    - NONE ("already stored") counts only when the memory it names holds one of the facts and the answer neither
      updates nor deletes that memory. A decision with no event (``null``) has an unknown event.
    - A fact that no kept ADD, UPDATE or NONE accounts for is added as extracted: an answer that forgets or
      garbles a fact must not lose it.

    Args:
        decisions: the parsed LLM answer.
        shown: ``(memory_id, text)`` of the memories shown; index ``i`` is short id ``str(i)``.
        facts: the new facts the LLM was asked about.
        max_text_chars: the longest ADD or UPDATE text kept, in characters (``None``: any length).

    Returns:
        A :class:`Plan`.
    """
    result = Plan()
    by_short = {str(i): item for i, item in enumerate(shown)}
    acted: set[str] = set()
    facts_text = "\n".join(facts)

    def skip(reason: str) -> None:
        log.warning("reconcile: %s", reason)
        result.skipped.append(reason)

    def related(memory: str) -> bool:
        return any(_share(memory, fact) >= RELATED_MIN_SHARE for fact in facts)

    confirmed: list[str] = []  # ids of the memories an accepted NONE names

    for d in decisions:
        text = " ".join(d.text.split())
        if d.event not in EVENTS:
            skip(f"decision {d.model_dump()} has unknown event {d.event!r}")
            continue
        if d.event in ("ADD", "UPDATE") and max_text_chars is not None and len(text) > max_text_chars:
            skip(f"{d.event} of a text of {len(text):,} characters, over max_text_chars ({max_text_chars:,})")
            continue
        if d.event == "ADD":
            if text and holds(facts_text, text):
                result.adds.append(text)
            else:
                skip(f"ADD of {text!r}, which the new facts do not hold")
            continue
        target = by_short.get(d.id)
        if d.event == "NONE":
            if target is not None and any(holds(target[1], fact) for fact in facts):
                confirmed.append(target[0])
            continue
        if target is None:
            skip(f"{d.event} on id {d.id!r}, which the LLM was not shown (shown: {sorted(by_short)})")
            continue
        memory_id, old_text = target
        if memory_id in acted:
            skip(f"second {d.event} on id {d.id!r}; the first decision on it wins")
            continue
        if not related(old_text):
            skip(f"{d.event} of memory {d.id!r} ({old_text!r}), which no new fact is about")
            continue
        if d.event == "UPDATE":
            if not text or not holds(f"{facts_text}\n{old_text}", text):
                skip(f"UPDATE of id {d.id!r} to {text!r}, which the new facts and the old text do not hold")
                continue
            result.updates.append((memory_id, text))
        else:
            result.deletes.append(memory_id)
        acted.add(memory_id)
    _drop_repeats(result, skip)
    texts = dict(shown)
    changed = set(result.deletes) | {memory_id for memory_id, _ in result.updates}
    result.confirmed.extend(dict.fromkeys(texts[i] for i in confirmed if i not in changed))  # what stays as it is
    kept = [*result.adds, *(text for _, text in result.updates), *result.confirmed]
    for fact in facts:
        if not any(holds(text, fact) for text in kept):
            log.warning("reconcile: the answer does not account for the fact %r; adding it", fact)
            result.adds.append(fact)
    return result


class Reconciler:
    """Asks a :class:`JSONGenerator` what to do with new facts given similar stored memories.

    Args:
        generator: the LLM backend.
        max_new_tokens: decode budget of one answer (tokens).
        max_items: the most decisions in one answer.
        max_text_chars: the longest memory text in an answer (characters).
        retries: how many more times the LLM is asked when an answer holds nothing usable (see
            :func:`~inferscale.memory.answers.ask`); 0 falls back at once.

    Raises:
        InvalidInputError: for a non-positive budget or limit, or negative ``retries``.
    """

    def __init__(
        self,
        generator: JSONGenerator,
        max_new_tokens: int = 256,
        *,
        max_items: int = 16,
        max_text_chars: int = 200,
        retries: int = 1,
    ) -> None:
        if min(max_new_tokens, max_items, max_text_chars) < 1:
            raise InvalidInputError("max_new_tokens, max_items and max_text_chars must be >= 1")
        if retries < 0:
            raise InvalidInputError(f"retries must be >= 0, got {retries}")
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.retries = retries
        self.max_text_chars = max_text_chars
        self.schema = decisions_json_schema(max_items, max_text_chars)

    def decide(self, shown: Sequence[tuple[str, str]], facts: Sequence[str]) -> Plan:
        """Decide for ``facts`` against ``shown`` memories.

        Args:
            shown: ``(memory_id, text)`` of the stored memories the LLM may act on (at least one).
            facts: the new facts (at least one).

        Only grounded changes are kept, and a fact the answer does not account for is added (see :func:`plan`).
        A malformed answer is repaired where it can be (lone surrogates and NUL dropped, entries that are not
        decisions dropped); when nothing usable is left the LLM is asked once more (``retries``), and then every
        fact is added as extracted. Each step is logged as a warning.

        Returns:
            The :class:`Plan` in real memory ids.

        Raises:
            InvalidInputError: when ``shown`` or ``facts`` is empty.
            ExtractionError: when the generator fails to answer (connection, HTTP status, no text content).
        """
        if not shown or not facts:
            raise InvalidInputError("reconcile needs at least one stored memory and one new fact")
        messages = build_reconcile_messages([text for _, text in shown], facts)
        reading = ask(
            self.generator,
            messages,
            self.schema,
            self.max_new_tokens,
            read_decisions,
            retries=self.retries,
            shape=DECISIONS_SHAPE,
            what="reconcile",
        )
        if reading.value is None:
            log.warning(
                "reconcile: no usable LLM answer (%s); adding the %d new facts as extracted",
                reading.problem,
                len(facts),
            )
            return Plan(adds=list(facts))
        return plan(reading.value, shown, facts, max_text_chars=self.max_text_chars)


__all__ = [
    "EVENTS",
    "RECONCILE_SYSTEM_PROMPT",
    "Decision",
    "Plan",
    "Reconciler",
    "build_reconcile_messages",
    "decisions_json_schema",
    "holds",
    "parse_decisions",
    "plan",
    "read_decisions",
]
