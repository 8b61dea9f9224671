"""The slices ``inferscale eval fidelity`` runs on: fixed (memories, question) cases.

A case is the memories exactly as they are laid into the prompt (in order) and one question, so every setting of a
run sees the same memories in the same order. Cases come from:

- any JSON file holding a list of ``{"memories": [str, ...], "question": str, "answer": str (optional)}``
  (:func:`load_cases`);
- the bundled demo conversation (:func:`demo_cases`): its messages, retrieved top-k per question;
- a LoCoMo conversation read from the caller's copy of the data set (:func:`locomo_cases`): each turn as
  ``"[<session date>] <Speaker>: <text>"``, the first n questions of categories 1-4, retrieved top-k per question.

Retrieval (for the last two) runs once, here, with the sentence embedder: cosine similarity of the question to
each memory, best first, as :class:`inferscale.MemoryClient.search` ranks them. The retrieved memories are laid out
in that order (``"score"``, the product's default), or in the order the conversation stored them (``"added"``,
oldest first), as :attr:`inferscale.config.MemoryConfig.memory_layout` lays them out: both modes of every setting
then see that order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from inferscale.config import MemoryLayout
from inferscale.errors import InvalidInputError
from inferscale.json_text import loads_json
from inferscale.memory.contexts import turn_contexts
from inferscale.validation_text import describe_errors

if TYPE_CHECKING:
    from inferscale.retrieval import Embedder

__all__ = [
    "MAX_CONTEXT_TURNS",
    "FidelityCase",
    "FidelitySlice",
    "demo_cases",
    "demo_conversation",
    "load_cases",
    "locomo_cases",
    "locomo_conversation",
    "memories_with_contexts",
    "retrieve_cases",
]


class FidelityCase(BaseModel):
    """One question with the memories served for it.

    Attributes:
        memories: the memory texts in layout order (at least one).
        question: the question (the last user turn).
        answer: the gold answer, when known (F1 against gold is reported then).
        contexts: for each memory, the conversation turns that preceded it (oldest first), as ``add`` records them;
            a setting with ``context_window`` w encodes each memory after its last w turns. Empty: no context.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    memories: list[str] = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str | None = None
    contexts: list[list[str]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_context_per_memory(self) -> FidelityCase:
        if self.contexts and len(self.contexts) != len(self.memories):
            raise ValueError(f"contexts has {len(self.contexts)} entries for {len(self.memories)} memories")
        return self

    def context_of(self, index: int) -> list[str]:
        """The turns before memory ``index`` (empty when the case has none)."""
        return self.contexts[index] if self.contexts else []


_CASES = TypeAdapter(list[FidelityCase])


@dataclass(frozen=True)
class FidelitySlice:
    """A named set of cases (one row group of the report)."""

    name: str
    cases: list[FidelityCase]


def load_cases(path: str | Path) -> FidelitySlice:
    """Read a JSON list of cases.

    Raises:
        InvalidInputError: when the file is missing or unreadable (a folder), is not JSON, or an item is not a valid
            case (the message names the item and the field).
    """
    file = Path(path)
    try:
        raw = loads_json(file.read_text("utf-8"))
        cases = _CASES.validate_python(raw)
    except FileNotFoundError as exc:
        raise InvalidInputError(f"no cases file at {file}") from exc
    except OSError as exc:  # a folder, no permission, ...
        raise InvalidInputError(f"cannot read the cases file {file}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{file} is not JSON: {exc}") from exc
    except ValidationError as exc:
        problems = describe_errors(exc.errors(), lambda loc: f"item {loc}" if loc else None, limit=5)
        raise InvalidInputError(
            f"{file} must hold a list of {{'memories': [str, ...], 'question': str, 'answer'?: str, "
            f"'contexts'?: [[str, ...], ...]}}: {problems}"
        ) from exc
    if not cases:
        raise InvalidInputError(f"{file} holds no cases")
    return FidelitySlice(file.stem, cases)


def retrieve_cases(
    name: str,
    memories: Sequence[str],
    questions: Sequence[tuple[str, str | None]],
    k: int,
    embedder: Embedder,
    contexts: Sequence[Sequence[str]] | None = None,
    layout: MemoryLayout = "score",
) -> FidelitySlice:
    """Cases whose memories are the top-``k`` of ``memories`` by cosine similarity to each question.

    Args:
        memories: the texts, in the order the conversation stored them.
        questions: ``(question, gold answer or None)`` pairs.
        contexts: the turns before each memory (one list per memory), carried into the cases.
        layout: ``"score"`` lays each case's memories out best first; ``"added"`` in the order of ``memories``
            (the same top-``k``).

    Raises:
        InvalidInputError: for ``k`` < 1 or no memories.
    """
    import numpy as np

    if k < 1:
        raise InvalidInputError(f"k must be >= 1, got {k}")
    if not memories:
        raise InvalidInputError(f"slice {name!r} has no memories")
    vectors = np.asarray(embedder.embed(list(memories)), dtype=np.float32)
    queries = np.asarray(embedder.embed([q for q, _ in questions]), dtype=np.float32)
    cases = []
    for (question, answer), vector in zip(questions, queries, strict=True):
        scores = vectors @ vector
        top = np.argsort(-scores, kind="stable")[:k]
        if layout == "added":
            top = np.sort(top)
        chosen = [memories[i] for i in top]
        context = [list(contexts[i]) for i in top] if contexts is not None else []
        cases.append(FidelityCase(memories=chosen, question=question, answer=answer, contexts=context))
    return FidelitySlice(name, cases)


def demo_cases(
    k: int, embedder: Embedder, layout: MemoryLayout = "score", *, across_sessions: bool = True
) -> FidelitySlice:
    """The bundled demo: every message of its sessions as a memory, its questions with their expected answers
    (``layout``: :func:`retrieve_cases`; ``across_sessions``: :func:`memories_with_contexts`)."""
    sessions, questions = demo_conversation()
    memories, contexts = memories_with_contexts(sessions, across_sessions=across_sessions)
    return retrieve_cases("demo", memories, questions, k, embedder, contexts, layout)


def demo_conversation() -> tuple[list[list[str]], list[tuple[str, str | None]]]:
    """The bundled demo's sessions (each message's text) and its questions with their expected answers."""
    from inferscale.demo import bundled_script

    script = bundled_script()
    sessions = [[m["content"] for m in messages] for _, messages in script.sessions]
    questions: list[tuple[str, str | None]] = [(q.question, q.expected) for q in script.questions]
    return sessions, questions


def locomo_cases(
    path: str | Path,
    conversation: str,
    n_questions: int,
    k: int,
    embedder: Embedder,
    layout: MemoryLayout = "score",
    *,
    across_sessions: bool = True,
) -> FidelitySlice:
    """One LoCoMo conversation: its turns as memories, its first ``n_questions`` questions of categories 1-4
    (:func:`locomo_conversation`), retrieved top-``k`` per question (``layout``: :func:`retrieve_cases`;
    ``across_sessions``: :func:`memories_with_contexts`)."""
    sessions, questions = locomo_conversation(path, conversation, n_questions)
    memories, contexts = memories_with_contexts(sessions, across_sessions=across_sessions)
    return retrieve_cases(conversation, memories, questions, k, embedder, contexts, layout)


def locomo_conversation(
    path: str | Path, conversation: str, n_questions: int
) -> tuple[list[list[str]], list[tuple[str, str | None]]]:
    """One LoCoMo conversation's sessions, each turn as ``"[<session date>] <Speaker>: <text>"``, and its first
    ``n_questions`` questions of categories 1-4 with their gold answers.

    Temporal questions (category 2) get LoCoMo's hint to answer with a date, as ``inferscale eval locomo`` asks
    them.
    """
    from inferscale.eval.locomo import date_label, get_conversation, load_locomo
    from inferscale.eval.locomo_eval import memory_text
    from inferscale.eval.locomo_settings import ANSWERED_CATEGORIES, TEMPORAL_HINT

    conv = get_conversation(load_locomo(path), conversation)
    sessions = [[memory_text(t, date_label(s.date_time)) for t in s.turns] for s in conv.sessions]
    qa = [q for q in conv.qa if q.category in ANSWERED_CATEGORIES][:n_questions]
    questions: list[tuple[str, str | None]] = [
        (q.question + (TEMPORAL_HINT if q.category == 2 else ""), q.answer) for q in qa
    ]
    return sessions, questions


def memories_with_contexts(
    sessions: Sequence[Sequence[str]], *, across_sessions: bool = True
) -> tuple[list[str], list[list[str]]]:
    """Each distinct text once (a memory store keeps one memory per text), in conversation order, with the context
    ``add(infer=False)`` records for it when each session is added in one call: the texts of the memories stored
    before the call (earlier sessions', oldest first), then the turns before it in its session, the last
    :data:`MAX_CONTEXT_TURNS` (:func:`inferscale.memory.contexts.turn_contexts`, the write path's own rule). Its
    last w entries are then what the product encodes it after at ``kv.context_window=w`` (the scope's last w
    memories, then the call's turns; w <= :data:`MAX_CONTEXT_TURNS`).

    ``across_sessions=False`` keeps only the turns before it in its own session: what the fidelity runs before
    run 23 measured (docs/architecture.md), where a session's first turns had fewer than w turns of context."""
    memories: list[str] = []
    contexts: list[list[str]] = []
    seen: set[str] = set()
    for turns in sessions:
        stored = memories[-MAX_CONTEXT_TURNS:] if across_sessions else []  # the scope's last memories
        for text, context in zip(turns, turn_contexts(stored, turns, MAX_CONTEXT_TURNS), strict=True):
            if text not in seen:
                seen.add(text)
                memories.append(text)
                contexts.append(list(context))
    return memories, contexts


MAX_CONTEXT_TURNS = 16
"""Turns kept before each memory (the largest context window a setting may ask for)."""
