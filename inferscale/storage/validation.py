"""Checks that run before anything is written: each returns the value in the form it is stored, or raises
:class:`~inferscale.errors.InvalidInputError` naming the bad value.

Every string that is stored or used in a query (texts, ids, metadata keys and values at any depth, context turns)
passes :func:`inferscale.storable.check_storable`: no lone surrogate, no NUL, on both backends alike. The write path
(:mod:`inferscale.storage.change_sets`) checks a whole change set before its transaction starts, so a refused value
leaves nothing written, whether it came from a caller or from the extraction LLM."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from inferscale.errors import InvalidInputError
from inferscale.scope import Scope
from inferscale.storable import MAX_JSON_DEPTH, check_json, check_storable, is_blank
from inferscale.storage.models import KEY_LENGTH
from inferscale.validation_text import shown_input


def check_text(text: object, name: str = "text") -> str:
    """``text`` when it is a str that shows something (:func:`~inferscale.storable.is_blank`) and every backend can
    store.

    Raises:
        InvalidInputError: otherwise (a lone surrogate or NUL included), naming ``name``.
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"{name} must be a str, got {type(text).__name__}")
    if is_blank(text):
        raise InvalidInputError(f"{name} must not be empty, whitespace or invisible characters only, got {text!r}")
    return check_storable(text, name)


def check_key(value: object, name: str, max_length: int = KEY_LENGTH) -> str:
    """``value`` when it is a non-blank str of at most ``max_length`` characters (default
    :data:`~inferscale.storage.models.KEY_LENGTH`).

    Raises:
        InvalidInputError: otherwise, naming ``name``.
    """
    text = check_text(value, name)
    if len(text) > max_length:
        raise InvalidInputError(f"{name} is {len(text)} characters; at most {max_length} are stored")
    return text


def check_id(memory_id: object) -> str:
    """``memory_id`` when it is a non-empty str that every backend can query with.

    Raises:
        InvalidInputError: otherwise (a lone surrogate or NUL included).
    """
    if not isinstance(memory_id, str) or not memory_id:
        raise InvalidInputError(f"memory_id must be a non-empty str, got {memory_id!r}")
    return check_storable(memory_id, "memory_id")


def check_new_id(memory_id: object) -> str:
    """``memory_id`` when it is a UUID in its canonical text form (lower-case hex, ``8-4-4-4-12``): the only form a
    memory's id is stored in (it names the memory's K/V folder, and a URL path carries it as it is).

    Raises:
        InvalidInputError: otherwise.
    """
    text = check_id(memory_id)
    try:
        canonical = str(uuid.UUID(text))
    except ValueError:
        canonical = None
    if canonical != text:
        raise InvalidInputError(
            f"a new memory's id must be a UUID in its canonical form, e.g. {str(uuid.UUID(int=0))!r}, got {text!r}"
        )
    return text


def check_utc_time(value: object, name: str) -> datetime:
    """``value`` when it is a tz-aware ``datetime``, converted to UTC.

    Raises:
        InvalidInputError: for a naive ``datetime`` (its zone would be a guess), one whose UTC time is out of
            ``datetime``'s range (years 1 to 9999), or any other type.
    """
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(f"{name} {value.isoformat()!r} has no time zone: give one (e.g. +00:00 for UTC)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is a year past datetime's last one in UTC
        raise InvalidInputError(f"{name} {value.isoformat()!r} is out of datetime's range in UTC") from None


def check_ids(memory_ids: object) -> list[str]:
    """The distinct ids of ``memory_ids`` (a sequence of ids, not one id), each checked by :func:`check_id`, sorted.

    Raises:
        InvalidInputError: when ``memory_ids`` is a str (it would be read one character per id) or not a
            sequence, or when an id is not a non-empty str.
    """
    if isinstance(memory_ids, str) or not isinstance(memory_ids, Sequence):
        raise InvalidInputError(f"memory_ids must be a list of ids, not {type(memory_ids).__name__} {memory_ids!r}")
    return sorted({check_id(memory_id) for memory_id in memory_ids})


def check_scope(scope: object) -> Scope:
    """``scope`` when it is a :class:`~inferscale.scope.Scope`.

    Raises:
        InvalidInputError: otherwise (e.g. a plain dict of ids).
    """
    if not isinstance(scope, Scope):
        raise InvalidInputError(
            f"scope must be an inferscale.scope.Scope, got {type(scope).__name__}; e.g. Scope(user_id='alice')"
        )
    return scope


def check_actor(actor: object) -> str | None:
    """``actor`` when it is ``None`` or a non-blank str of at most ``KEY_LENGTH`` characters.

    Raises:
        InvalidInputError: otherwise.
    """
    if actor is None:
        return None
    return check_key(actor, "actor")


def check_positive(value: object, name: str) -> int:
    """``value`` when it is a positive int.

    Raises:
        InvalidInputError: otherwise (``bool`` and ``None`` included), naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive int, got {shown_input(value)}")
    return value


def check_limit(limit: object) -> int | None:
    """``limit`` when it is ``None`` (no limit) or a positive int.

    Raises:
        InvalidInputError: otherwise (``bool`` included).
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"limit must be a positive int or None, got {shown_input(limit)}")
    return limit


def json_copy(value: Any) -> Any:
    """A deep copy of checked JSON ``value`` with tuples turned into lists, as a JSON column stores them."""
    if isinstance(value, dict):
        return {key: json_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_copy(item) for item in value]
    return value


def same_json(a: Any, b: Any) -> bool:
    """Whether two checked JSON values are the same JSON: types included, object key order aside. Python's ``==``
    is not enough: it calls ``True`` equal to ``1`` and ``1.0`` equal to ``1``, which JSON (and a filter on the
    value) tells apart."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_metadata(metadata: object) -> dict[str, Any]:
    """A deep copy of ``metadata`` (``None`` → ``{}``), tuples turned into lists as JSON stores them.

    Raises:
        InvalidInputError: when ``metadata`` is not a dict of plain JSON (see :func:`check_json`).
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    check_json(metadata, "metadata")
    return {key: json_copy(item) for key, item in metadata.items()}


def check_context(context: object) -> list[str]:
    """The conversation turns of ``context`` as a new list (``None`` → ``[]``).

    Raises:
        InvalidInputError: when ``context`` is a str or not a sequence of str.
    """
    if context is None:
        return []
    if isinstance(context, str) or not isinstance(context, Sequence):
        raise InvalidInputError(f"context must be a list of str (conversation turns), got {context!r}")
    turns = list(context)
    for i, turn in enumerate(turns):
        if not isinstance(turn, str):
            raise InvalidInputError(f"context[{i}] must be a str, got {type(turn).__name__}")
        check_storable(turn, f"context[{i}]")
    return turns


def check_count(value: object, name: str) -> int:
    """``value`` as an int when it is a non-negative int or numpy integer (not a bool).

    Raises:
        InvalidInputError: otherwise, naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidInputError(f"{name} must be a non-negative int, got {shown_input(value)}")
    return int(value)


def check_vector_ids(ids: object) -> list[int]:
    """``ids`` as a list of Python ints: a 1-D integer array or a sequence of ints (int64 vector ids).

    Raises:
        InvalidInputError: for another array shape or dtype, a str, or an item that is not an int.
    """
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise InvalidInputError(f"ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        return [int(i) for i in ids]
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise InvalidInputError(f"ids must be a sequence of int, got {type(ids).__name__}")
    out: list[int] = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise InvalidInputError(f"vector ids must be int, got {i!r}")
        out.append(int(i))
    return out


__all__ = [
    "MAX_JSON_DEPTH",
    "check_actor",
    "check_context",
    "check_count",
    "check_id",
    "check_json",
    "check_key",
    "check_limit",
    "check_metadata",
    "check_new_id",
    "check_positive",
    "check_scope",
    "check_text",
    "check_utc_time",
    "check_vector_ids",
    "json_copy",
    "same_json",
]
