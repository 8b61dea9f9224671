"""Typed loader for the LoCoMo benchmark file (``locomo10.json``).

The data set is licensed CC BY-NC and is never copied into this repository: callers pass the path of a local
copy (the project keeps one under ``../shared/data/locomo/``). The loader reads only what the memory
evaluation needs (the dialogue turns with their session dates, and the QA items) and smooths over the
file's known quirks:

* sessions are counted from the ``session_<N>`` keys, not the ``session_<N>_date_time`` keys (``conv-26``
  has date keys for sessions 20-35 but no turns for them), and are returned sorted by ``N``;
* QA answers are always ``str``: integer answers are converted with ``str()``, and category-5
  (adversarial) items without an ``answer`` get :data:`UNANSWERABLE`, with the tempting wrong answer
  kept in :attr:`LocomoQA.adversarial_answer`;
* evidence ids are parsed defensively: strings holding several ids are split on ``;`` and whitespace,
  zero padding is stripped (``D30:05`` -> ``D30:5``), ``D:11:26`` is read as ``D11:26`` and strings with
  no id at all are dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from inferscale.errors import InvalidInputError
from inferscale.json_text import loads_json

__all__ = [
    "DATE_TIME_FORMAT",
    "UNANSWERABLE",
    "LocomoConversation",
    "LocomoQA",
    "LocomoSession",
    "LocomoTurn",
    "date_label",
    "get_conversation",
    "load_locomo",
    "parse_evidence",
    "turn_text",
]

DATE_TIME_FORMAT = "%I:%M %p on %d %B, %Y"
"""``strptime`` format of every ``session_<N>_date_time`` value, e.g. ``"9:05 pm on 1 January, 2024"``."""

UNANSWERABLE = "Not mentioned in the conversation"
"""Answer given to category-5 (adversarial) items that carry no ``answer`` key in the file."""

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;\s]+")
_EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")


@dataclass(frozen=True)
class LocomoTurn:
    """One utterance of a LoCoMo dialogue.

    Attributes:
        speaker: The speaker's first name (always ``speaker_a`` or ``speaker_b`` of the conversation).
        dia_id: The turn id, ``"D<session>:<turn>"``.
        text: What was said.
        blip_caption: BLIP caption of the photo shared with this turn, or ``None`` when no photo was shared.
    """

    speaker: str
    dia_id: str
    text: str
    blip_caption: str | None = None


@dataclass(frozen=True)
class LocomoSession:
    """One session (a sitting) of a LoCoMo conversation.

    Attributes:
        index: The session number ``N`` from the ``session_<N>`` key (starts at 1).
        date_time: When the session took place, parsed from ``session_<N>_date_time``.
        turns: The session's turns in file order.
    """

    index: int
    date_time: datetime
    turns: list[LocomoTurn]


@dataclass(frozen=True)
class LocomoQA:
    """One annotated question of a LoCoMo conversation.

    Attributes:
        question: The question text.
        answer: The gold answer, always a ``str`` (see the module docstring for how it is normalised).
        category: The numeric category code, 1-5 (LoCoMo's own mapping: 1 multi-hop, 2 temporal,
            3 open-domain, 4 single-hop, 5 adversarial). Report results by this code.
        evidence: The supporting turn ids, normalised to ``"D<session>:<turn>"`` (may be empty).
        adversarial_answer: For category 5, the tempting wrong answer; ``None`` otherwise.
    """

    question: str
    answer: str
    category: int
    evidence: list[str] = field(default_factory=list)
    adversarial_answer: str | None = None


@dataclass(frozen=True)
class LocomoConversation:
    """One LoCoMo conversation between two peer speakers, with its QA items.

    Attributes:
        sample_id: The conversation id, e.g. ``"conv-26"``.
        speaker_a: First speaker's name.
        speaker_b: Second speaker's name.
        sessions: The sessions, sorted by :attr:`LocomoSession.index`.
        qa: The QA items in file order.
    """

    sample_id: str
    speaker_a: str
    speaker_b: str
    sessions: list[LocomoSession]
    qa: list[LocomoQA]

    @property
    def turns(self) -> list[LocomoTurn]:
        """All turns of every session, in session order."""
        return [turn for session in self.sessions for turn in session.turns]


def turn_text(turn: LocomoTurn) -> str:
    """Render a turn as one line of text, keeping the photo caption when there is one.

    The caption is appended the way the LoCoMo authors' RAG code does it, because some answers appear only
    in the caption: ``"Ann: Look at this! [shares a photo of a red kite over a beach]"``.

    Args:
        turn: The turn to render.

    Returns:
        ``"<speaker>: <text>"``, followed by `` [shares <caption>]`` when the turn has a caption.
    """
    line = f"{turn.speaker}: {turn.text}"
    if turn.blip_caption:
        line += f" [shares {turn.blip_caption}]"
    return line


def date_label(session_date: datetime) -> str:
    """A session date as memories show it: ``datetime(2023, 5, 8, 13, 56)`` → ``"8 May 2023"``."""
    return f"{session_date.day} {session_date:%B %Y}"


def parse_evidence(raw: Iterable[Any]) -> list[str]:
    """Normalise a raw ``evidence`` list into well-formed ``"D<session>:<turn>"`` ids.

    Args:
        raw: The ``evidence`` value of a QA item.

    Returns:
        The ids in order, with multi-id strings split, zero padding stripped and unparseable pieces dropped.
        Ids that are well formed but point at a missing turn are kept.
    """
    ids: list[str] = []
    for item in raw:
        for piece in _EVIDENCE_SPLIT.split(str(item).strip()):
            match = _EVIDENCE_ID.fullmatch(piece)
            if match is not None:
                ids.append(f"D{int(match.group(1))}:{int(match.group(2))}")
    return ids


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Load and validate a LoCoMo file such as ``locomo10.json``.

    Args:
        path: Path of the JSON file (a list of conversation objects).

    Returns:
        The conversations in file order.

    Raises:
        InvalidInputError: The path does not exist, is not a file, is not valid JSON, or the JSON does not
            have the LoCoMo shape (a non-empty list). The message names the path (and the conversation, where known).
    """
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"LoCoMo file not found: {str(file)!r} (pass the path of locomo10.json)")
    try:
        raw = loads_json(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"cannot read LoCoMo file {str(file)!r}: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        got = "an empty list" if isinstance(raw, list) else type(raw).__name__
        raise InvalidInputError(f"LoCoMo file {str(file)!r} must hold a JSON list of conversations, got {got}")
    conversations: list[LocomoConversation] = []
    for position, item in enumerate(raw):
        try:
            conversations.append(_parse_conversation(item))
        except (KeyError, TypeError, ValueError) as exc:
            sample_id = item.get("sample_id") if isinstance(item, Mapping) else None
            where = repr(sample_id) if sample_id is not None else f"#{position}"
            raise InvalidInputError(f"malformed conversation {where} in LoCoMo file {str(file)!r}: {exc}") from exc
    return conversations


def get_conversation(convs: Sequence[LocomoConversation], sample_id: str) -> LocomoConversation:
    """Return the conversation with the given ``sample_id``.

    Args:
        convs: Conversations returned by :func:`load_locomo`.
        sample_id: The id to look for, e.g. ``"conv-26"``.

    Returns:
        The matching conversation.

    Raises:
        InvalidInputError: No conversation has that id; the message lists the available ids.
    """
    for conv in convs:
        if conv.sample_id == sample_id:
            return conv
    available = ", ".join(conv.sample_id for conv in convs) or "none"
    raise InvalidInputError(f"no LoCoMo conversation {sample_id!r}; available: {available}")


def _parse_conversation(item: Any) -> LocomoConversation:
    """Build a :class:`LocomoConversation` from one raw list element (raises ``KeyError``/``TypeError``)."""
    if not isinstance(item, Mapping):
        raise TypeError(f"expected an object, got {type(item).__name__}")
    conv = item["conversation"]
    if not isinstance(conv, Mapping):
        raise TypeError(f"'conversation' must be an object, got {type(conv).__name__}")
    sessions: list[LocomoSession] = []
    for key, turns in conv.items():
        match = _SESSION_KEY.fullmatch(key)
        if match is None:
            continue
        index = int(match.group(1))
        date_key = f"session_{index}_date_time"
        try:
            date_time = datetime.strptime(str(conv[date_key]).strip(), DATE_TIME_FORMAT)
        except KeyError:
            raise KeyError(f"{key} has no {date_key}") from None
        if not isinstance(turns, list):
            raise TypeError(f"{key} must be a list of turns, got {type(turns).__name__}")
        sessions.append(LocomoSession(index=index, date_time=date_time, turns=[_parse_turn(t) for t in turns]))
    sessions.sort(key=lambda session: session.index)
    qa_items = item.get("qa", [])
    if not isinstance(qa_items, list):
        raise TypeError(f"'qa' must be a list, got {type(qa_items).__name__}")
    return LocomoConversation(
        sample_id=str(item["sample_id"]),
        speaker_a=str(conv["speaker_a"]),
        speaker_b=str(conv["speaker_b"]),
        sessions=sessions,
        qa=[_parse_qa(q) for q in qa_items],
    )


def _parse_turn(raw: Any) -> LocomoTurn:
    """Build a :class:`LocomoTurn` from a raw turn object (extra keys such as ``img_url`` are ignored)."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"a turn must be an object, got {type(raw).__name__}")
    caption = raw.get("blip_caption")
    return LocomoTurn(
        speaker=str(raw["speaker"]),
        dia_id=str(raw["dia_id"]),
        text=str(raw["text"]),
        blip_caption=str(caption) if caption is not None else None,
    )


def _parse_qa(raw: Any) -> LocomoQA:
    """Build a :class:`LocomoQA` from a raw QA object, normalising the answer to ``str``."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"a qa item must be an object, got {type(raw).__name__}")
    category = int(raw["category"])
    if "answer" in raw and raw["answer"] is not None:
        answer = str(raw["answer"])
    elif category == 5:
        answer = UNANSWERABLE
    else:
        raise KeyError(f"qa item {raw.get('question')!r} (category {category}) has no answer")
    adversarial = raw.get("adversarial_answer")
    evidence = raw.get("evidence", [])
    if not isinstance(evidence, list):
        raise TypeError(f"evidence of {raw.get('question')!r} must be a list, got {type(evidence).__name__}")
    return LocomoQA(
        question=str(raw["question"]),
        answer=answer,
        category=category,
        evidence=parse_evidence(evidence),
        adversarial_answer=str(adversarial) if adversarial is not None else None,
    )
