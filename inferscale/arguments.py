"""Argument checks and resolution shared by the sync and async clients (Mem0 v1 and v2 call shapes).

Every check raises :class:`inferscale.errors.InvalidInputError` (or :class:`~inferscale.errors.ScopeError`)
before anything is written, naming the bad value and the expected shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferscale.errors import InvalidInputError
from inferscale.filters import Filter, parse_filters, required_ids
from inferscale.memory import Message, normalize_messages
from inferscale.scope import SCOPE_KEYS, Scope
from inferscale.storage import MemoryRecord

DEFAULT_LIMIT = 100
"""Results of ``search`` and ``get_all`` when neither ``limit`` nor ``top_k`` is given (Mem0's default)."""

DEFAULT_CHAT_LIMIT = 5
"""Memories retrieved by ``chat`` when neither ``limit`` nor ``top_k`` is given."""

MAX_LIMIT = 1_000_000
"""The largest ``limit``/``top_k`` accepted."""


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """``metadata`` as a plain dict.

    Raises:
        InvalidInputError: when it is not a dict or names a scope id (metadata can never set or override an id).
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    clash = sorted(set(metadata) & set(SCOPE_KEYS))
    if clash:
        raise InvalidInputError(
            f"metadata may not set scope ids {clash}; pass them as keyword arguments (user_id=..., ...)"
        )
    return dict(metadata)


def resolve_limit(limit: int | None, top_k: int | None, default: int = DEFAULT_LIMIT) -> int:
    """One result count from Mem0 v1's ``limit`` or v2's ``top_k``.

    Raises:
        InvalidInputError: when both are given with different values, or one is not a non-negative int.
    """
    if limit is not None and top_k is not None and limit != top_k:
        raise InvalidInputError(f"limit={limit!r} and top_k={top_k!r} disagree; pass one of them")
    value = limit if limit is not None else top_k if top_k is not None else default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"limit/top_k must be a non-negative int, got {value!r}")
    if value > MAX_LIMIT:
        raise InvalidInputError(f"limit/top_k must be at most {MAX_LIMIT:,}, got {value:,}")
    return value


def optional_scope(user_id: str | None, agent_id: str | None, run_id: str | None) -> Scope | None:
    """The scope named by the given ids, or ``None`` when none is given (an id-addressed call without a scope)."""
    if user_id is None and agent_id is None and run_id is None:
        return None
    return Scope(user_id, agent_id, run_id)


def in_scope(record: MemoryRecord, scope: Scope | None) -> bool:
    """Whether ``record`` belongs to ``scope`` (every id the scope sets is equal); ``True`` for no scope."""
    return scope is None or all(getattr(record, key) == value for key, value in scope.as_dict().items())


def check_add_messages(messages: Any, infer: Any, max_memory_chars: int) -> list[Message]:
    """Normalised messages of an ``add`` call, checked before anything is written.

    Raises:
        InvalidInputError: for malformed messages, a non-bool ``infer``, or (with ``infer=False``) a message
            longer than ``max_memory_chars`` characters: a memory is a fact recalled into a prompt, not a document.
    """
    if not isinstance(infer, bool):
        raise InvalidInputError(f"infer must be True or False, got {infer!r}")
    msgs = normalize_messages(messages)
    if not infer:
        for i, m in enumerate(msgs):
            if m.role != "system" and len(m.content) > max_memory_chars:
                raise InvalidInputError(
                    f"message {i} has {len(m.content):,} characters; a memory holds at most "
                    f"max_memory_chars={max_memory_chars:,}. Split it, raise the limit, or use infer=True to "
                    "extract facts from it"
                )
    return msgs


def check_query(query: Any) -> str:
    """A non-empty query string that encodes as UTF-8.

    Raises:
        InvalidInputError: for anything else.
    """
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError(f"query must be a non-empty string, got {query!r}")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"query is not valid Unicode text ({exc.reason} at {exc.start})") from exc
    return query


def check_max_new_tokens(max_new_tokens: int | None) -> int | None:
    """``None`` (the config's budget) or a positive int (tokens).

    Raises:
        InvalidInputError: for anything else.
    """
    if max_new_tokens is None:
        return None
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be a positive int or None, got {max_new_tokens!r}")
    return max_new_tokens


def check_threshold(threshold: float | None) -> float | None:
    """``None`` or a real number (a cosine-similarity floor).

    Raises:
        InvalidInputError: for anything else.
    """
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold != threshold:
        raise InvalidInputError(f"threshold must be a number or None, got {threshold!r}")
    return float(threshold)


def resolve_scope(
    user_id: str | None, agent_id: str | None, run_id: str | None, filters: Mapping[str, Any] | None
) -> tuple[Scope, Filter | None]:
    """The scope of a call from keyword ids (v1) and ids pinned inside ``filters`` (v2), ANDed together.

    Returns:
        ``(scope, parsed_filter)``; the filter still holds its id conditions (they are redundant with the scope).

    Raises:
        ScopeError: when no id is given either way, or ``filters`` pins an id to two values.
        InvalidInputError: for a malformed filter, or a keyword id that disagrees with the id in ``filters``.
    """
    node = parse_filters(filters)
    ids: dict[str, str | None] = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
    for key, value in required_ids(node).items():
        given = ids[key]
        if given is not None and given != value:
            raise InvalidInputError(f"{key}={given!r} disagrees with filters {key}={value!r}; pass one of them")
        ids[key] = value
    return Scope(ids["user_id"], ids["agent_id"], ids["run_id"]), node


def check_version(version: str | None) -> None:
    """Accept Mem0's ``version`` argument (``"v1"``, ``"v2"`` or ``None``); both call shapes are always on.

    Raises:
        InvalidInputError: for any other value.
    """
    if version not in (None, "v1", "v2"):
        raise InvalidInputError(f"version must be 'v1' or 'v2' (both call shapes are always accepted), got {version!r}")
