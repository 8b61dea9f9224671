"""Reading an LLM's JSON answer: tolerant parsing, repair of what no store can hold, one corrective retry.

Every way an extraction or reconcile answer can be malformed falls in one of these classes, handled alike for both:

- invalid Unicode, a lone surrogate as the character or as the escape ``\\ud83d``: repaired, the code point is
  dropped;
- NUL (``\\u0000`` or the raw character) and raw control characters inside a string: repaired, NUL is dropped and
  the others become spaces;
- JSON wrapped in prose or a code fence, or cut off by the token budget: read tolerantly
  (:func:`tolerant_json_reads`); an answer cut off before its first item is nothing usable, not an empty answer;
- not JSON at all (prose only, a refusal, an empty answer) or the wrong shape (``{"facts": "x"}``,
  ``{"items": [...]}``): nothing usable, so the LLM is asked once more, then the caller falls back;
- unusable items (a fact that is not a string, empty or over-long; a decision that is not an object): the item is
  dropped; a value that had items and has none left counts as nothing usable, and the next value read from the
  answer is tried (``I found [2] facts: {"facts": [...]}``).

Repairs need no second call. A retry (:func:`ask`) repeats the conversation with the unusable answer and a turn
naming its problem, so that a greedy decoder (the default local model, or an endpoint at temperature 0), which
would give the same answer to the same prompt, sees a different one. The fallbacks belong to the callers:
extraction stores the user's turns verbatim, reconcile adds the new facts as extracted. Every repair, retry and
fallback is logged as a warning. Reconcile decisions that parse but name an unknown id or event are skipped
later, by :func:`inferscale.memory.reconcile.plan`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic_core import from_json

from inferscale.memory.llm import JSONGenerator

log = logging.getLogger(__name__)

T = TypeVar("T")

_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_MAX_JSON_STARTS = 16  # '{' / '[' positions tried in prose before giving up
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str a valid pair is one code point: any match is lone
# One JSON escape at a time, left to right (so "\\\\u..." is an escaped backslash, not an escape): a surrogate
# pair, a lone surrogate, NUL, or any other escape, which is kept.
_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|(\\u0000)|\\.",
    re.DOTALL,
)
_CONTROL = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f]")  # not valid raw inside a JSON string; \t \n \r are read below
_LINE_BREAKS = re.compile("[\t\n\r]")
MAX_ECHO_CHARS = 2000
"""The most characters of an unusable answer repeated to the LLM when it is asked again."""
RETRY_PROMPT = (
    "That answer could not be used: {problem}. Answer again with only the JSON object the instructions ask for, "
    "shaped like {shape}, and nothing else."
)


@dataclass(frozen=True, slots=True)
class Reading(Generic[T]):
    """What could be read from one LLM answer.

    Attributes:
        value: the usable answer, or ``None`` when nothing usable could be read.
        problem: why ``value`` is ``None`` (``""`` when it is not), for the log and the retry prompt.
        repairs: what was repaired or dropped to get ``value``, one short sentence each.
    """

    value: T | None
    problem: str = ""
    repairs: tuple[str, ...] = ()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def repair_text(raw: str) -> tuple[str, list[str]]:
    """``raw`` with every code point no store or JSON parser takes dropped or replaced, and what was done.

    Lone surrogates (as characters or as ``\\uD800``-``\\uDFFF`` escapes outside a pair) and NUL (as a character
    or as ``\\u0000``) are dropped; other C0 control characters except tab, line feed and carriage return become
    spaces. Valid escapes, surrogate pairs included, are kept.

    Args:
        raw: an LLM answer as the generator returned it.

    Returns:
        ``(text, repairs)``: ``text`` encodes as UTF-8 and holds no NUL; ``repairs`` is empty when nothing changed.
    """
    counts = {"surrogate": 0, "nul": 0}

    def escape(match: re.Match[str]) -> str:
        if match.group(1):
            counts["surrogate"] += 1
            return ""
        if match.group(2):
            counts["nul"] += 1
            return ""
        return match.group(0)

    text, n = _SURROGATE.subn("", raw)
    counts["surrogate"] += n
    counts["nul"] += text.count("\x00")
    text = _ESCAPE.sub(escape, text.replace("\x00", ""))
    text, controls = _CONTROL.subn(" ", text)
    repairs = []
    if counts["surrogate"]:
        repairs.append(f"dropped {_plural(counts['surrogate'], 'lone surrogate')} (not valid Unicode)")
    if counts["nul"]:
        repairs.append(f"dropped {_plural(counts['nul'], 'NUL character')}")
    if controls:
        repairs.append(f"replaced {_plural(controls, 'control character')} with spaces")
    return text, repairs


def _starts(raw: str) -> Iterator[tuple[int, str, int]]:
    """``(n, text, i)`` for each place an answer's JSON may start, most likely first: each ``{``/``[`` (at ``i``)
    of each fenced block, then of the whole answer (the ``n``-th text; at most :data:`_MAX_JSON_STARTS` each)."""
    for n, text in enumerate([m.group(1) for m in _FENCE.finditer(raw)] + [raw]):
        for i in [i for i, ch in enumerate(text) if ch in "{["][:_MAX_JSON_STARTS]:
            yield n, text, i


_DECODER = json.JSONDecoder(strict=False)
_EMPTY_LIST = re.compile(r"\s*\[\s*\]")


def _complete_end(text: str) -> int | None:
    """Where the complete JSON value at the start of ``text`` ends (the text after it is not read), or ``None`` when
    the text is cut off before the value closes (or is not JSON)."""
    try:
        return _DECODER.raw_decode(text)[1]
    except json.JSONDecodeError:
        return None


def _list_cut(text: str, value: Any, list_key: str) -> bool:
    """Whether ``text``, cut off inside ``value``, was cut inside its list (``value`` itself, or ``value[list_key]``):
    an empty list counts as cut unless ``text`` closes it (``{"facts": [] `` is complete, ``{"facts": [`` is not).
    The list read is the last one opened under ``list_key`` (the text ends inside it, or after it)."""
    if (value if isinstance(value, list) else value.get(list_key) if isinstance(value, dict) else None) != []:
        return True
    if isinstance(value, list):
        return _EMPTY_LIST.match(text) is None
    opened = list(re.finditer(rf'"{re.escape(list_key)}"\s*:\s*\[', text))
    return not opened or _EMPTY_LIST.match(text, opened[-1].end() - 1) is None


@dataclass(frozen=True, slots=True)
class JSONRead:
    """One JSON value read from an LLM answer.

    Attributes:
        value: the value (a bare list already wrapped as ``{list_key: list}``).
        cut: whether the text was cut off inside the value's list (the token budget ran out): the list is what was
            complete, a half-written last element dropped.
    """

    value: Any
    cut: bool


def tolerant_json_reads(raw: str, list_key: str) -> Iterator[JSONRead]:
    """Every JSON value that can be read from an LLM answer, most likely first.

    Tries fenced blocks, then each ``{``/``[`` onward, parsing partial (truncated) JSON and stopping at the end of a
    complete value; a candidate that only fails on raw tabs or line breaks inside a string is read with them as
    spaces. A candidate that starts inside a value read before it is part of that value: it is read only when it is
    an object that has ``list_key`` inside one that has not (the answer wrapped, ``{"result": {"facts": [...]}}``),
    so the list in ``{"items": [...]}`` is not read as the answer's list, nor an inner list of an answer that has
    its own. A bare list is wrapped as ``{list_key: list}``. Callers
    take the first value that validates against their schema and has something usable (:func:`read_items`). An
    answer that is not valid Unicode (it holds a lone surrogate) yields nothing: pass it through
    :func:`repair_text` first.
    """
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        return
    read_until: dict[int, int] = {}  # per text: where the outermost value read from it ends
    wrapper: dict[int, bool] = {}  # per text: whether that value lacks list_key (so it may wrap the answer)
    for n, text, start in _starts(raw):
        nested = start < read_until.get(n, -1)
        if nested and not wrapper[n]:
            continue
        candidate = text[start:]
        for variant in (candidate, _LINE_BREAKS.sub(" ", candidate)):
            try:
                value = from_json(variant, allow_partial=True)
            except ValueError:
                continue
            if nested and not (isinstance(value, dict) and list_key in value):
                break
            end = _complete_end(variant)
            if not nested:
                read_until[n] = start + (len(variant) if end is None else end)
                wrapper[n] = not (isinstance(value, list) or (isinstance(value, dict) and list_key in value))
            cut = end is None and _list_cut(variant, value, list_key)
            yield JSONRead({list_key: value} if isinstance(value, list) else value, cut)
            break


def read_items(
    text: str,
    list_key: str,
    items_of: Callable[[Any], list[Any] | None],
    keep: Callable[[list[Any]], tuple[list[T], list[str]]],
    *,
    noun: str,
    unusable: Callable[[int], str],
    repairs: Sequence[str] = (),
) -> Reading[list[T]]:
    """The first value read from an answer (:func:`tolerant_json_reads`) whose list has something usable.

    Args:
        text: the answer, repaired (:func:`repair_text`).
        list_key: the key of the answer's list (``"facts"``, ``"memory"``).
        items_of: the list of a value read, or ``None`` for a value of another shape (skipped).
        keep: the usable items of a list, and one repair sentence per item dropped.
        noun: what one item is, for messages (``"fact"``, ``"decision"``).
        unusable: the problem of a list of ``n`` items none of which is usable.
        repairs: what was repaired before reading (kept in front of the reading's own).

    Returns:
        The items of the first list with a usable item, or of the first empty list that was not cut off (``[]``,
        nothing to remember); else ``value=None`` with the problem of the first list read (none usable, or cut off
        before its first item), or that no list could be read.
    """
    first_problem: tuple[str, list[str]] | None = None
    for read in tolerant_json_reads(text, list_key):
        items = items_of(read.value)
        if items is None:
            continue
        kept, dropped = keep(items)
        if kept or not (items or read.cut):
            cut = [f"the answer was cut off; read up to its last complete {noun}"] if read.cut else []
            return Reading(kept, repairs=(*repairs, *dropped, *cut))
        if first_problem is None:  # a later value may still be usable
            problem = unusable(len(items)) if items else f"it was cut off before its first {noun} was complete"
            first_problem = (problem, dropped)
    if first_problem is not None:
        return Reading(None, first_problem[0], (*repairs, *first_problem[1]))
    return Reading(None, f'no {{"{list_key}": [...]}} JSON object could be read from it', tuple(repairs))


def ask(
    generator: JSONGenerator,
    messages: list[dict[str, str]],
    schema: dict[str, Any],
    max_new_tokens: int,
    read: Callable[[str], Reading[T]],
    *,
    retries: int,
    shape: str,
    what: str,
) -> Reading[T]:
    """Ask ``generator`` for a JSON answer and read it; ask again (at most ``retries`` times) while nothing is usable.

    A retry sends ``messages``, the unusable answer (repaired, at most :data:`MAX_ECHO_CHARS` characters) as an
    assistant turn and :data:`RETRY_PROMPT` naming the problem, so a greedy decoder gets a new prompt. Repairs of
    the reading that is returned and every retry are logged as warnings naming ``what``.

    Args:
        generator: the LLM backend.
        messages: the chat of the first call.
        schema: the answer's JSON schema, sent with every call.
        max_new_tokens: decode budget of each call, in tokens.
        read: turns an answer into a :class:`Reading` (never raises for a malformed answer).
        retries: how many more calls may be made after an unusable answer (0: none).
        shape: the answer's shape as the retry prompt shows it, e.g. ``'{"facts": ["..."]}'``.
        what: the step, for the log (``"extraction"``, ``"reconcile"``).

    Returns:
        The last reading; its ``value`` is ``None`` when no answer was usable, and the caller falls back.

    Raises:
        ExtractionError: when the generator fails to answer (connection, HTTP status, no text content).
    """
    raw = generator.generate_json(messages, schema, max_new_tokens)
    reading = read(raw)
    for _ in range(retries):
        if reading.value is not None:
            break
        log.warning("%s: the LLM answer holds nothing usable (%s); asking once more", what, reading.problem)
        echo, _ = repair_text(raw[:MAX_ECHO_CHARS])
        follow_up = [
            *messages,
            {"role": "assistant", "content": echo},
            {"role": "user", "content": RETRY_PROMPT.format(problem=reading.problem, shape=shape)},
        ]
        raw = generator.generate_json(follow_up, schema, max_new_tokens)
        reading = read(raw)
    for repair in reading.repairs:
        log.warning("%s: repaired the LLM answer: %s", what, repair)
    return reading


__all__ = [
    "MAX_ECHO_CHARS",
    "RETRY_PROMPT",
    "JSONRead",
    "Reading",
    "ask",
    "read_items",
    "repair_text",
    "tolerant_json_reads",
]
