"""Argument checks and resolution shared by the sync and async clients (Mem0 v1 and v2 call shapes).

Every check raises :class:`inferscale.errors.InvalidInputError` (or :class:`~inferscale.errors.ScopeError`)
before anything is written, naming the bad value and the expected shape. The value checks are pydantic
``TypeAdapter`` objects over ``Annotated`` constraints in strict mode (no coercion: ``"5"`` is not a number and ``True``
is not an int); this module only turns their ``ValidationError`` into an :class:`InvalidInputError`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from inferscale.config import MAX_INSTRUCTIONS_CHARS, EncodeMode, Instructions
from inferscale.errors import InvalidInputError, MemoryTooLongError
from inferscale.filters import Filter, parse_filters, required_ids
from inferscale.memory import Message, normalize_messages
from inferscale.scope import SCOPE_KEYS, Scope, ScopeId, check_scope_ids
from inferscale.storable import check_json, check_storable, check_unicode, is_blank
from inferscale.storage import MemoryRecord
from inferscale.storage.validation import check_id, check_key
from inferscale.types import ChatMode
from inferscale.validation_text import shown_input

DEFAULT_LIMIT = 100
"""Results of ``search`` and ``get_all`` when neither ``limit`` nor ``top_k`` is given (Mem0 1.x's default; 2.x's is
20: docs/migration.md)."""

DEFAULT_CHAT_LIMIT = 5
"""Memories retrieved by ``chat`` when neither ``limit`` nor ``top_k`` is given."""

MAX_LIMIT = 1_000_000
"""The largest ``limit``/``top_k`` accepted."""

T = TypeVar("T")


def _not_blank(value: str) -> str:
    if is_blank(value):
        raise ValueError("whitespace only")
    return value


_METADATA = TypeAdapter(dict[Any, Any])  # any Mapping, copied into a dict
_LIMIT = TypeAdapter(Annotated[int, Field(strict=True, ge=0, le=MAX_LIMIT)])
_MAX_NEW_TOKENS = TypeAdapter(Annotated[int, Field(strict=True, ge=1)] | None)
# int or finite float (no bool, NaN or infinity: JSON, and so the remote client, has neither)
_THRESHOLD = TypeAdapter(Annotated[float, Field(strict=True, allow_inf_nan=False)] | None)
# A length constraint makes pydantic-core decode the text, so a lone surrogate (not UTF-8) fails it too.
_QUERY = TypeAdapter(Annotated[str, Field(strict=True, min_length=1), AfterValidator(_not_blank)])
_FLAG = TypeAdapter(Annotated[bool, Field(strict=True)])
_OPTIONAL_FLAG = TypeAdapter(Annotated[bool, Field(strict=True)] | None)
_INSTRUCTIONS = TypeAdapter(Instructions | None)
_VERSION = TypeAdapter(Literal["v1", "v2"] | None)
_TIMEOUT = TypeAdapter(Annotated[float, Field(strict=True, ge=0, le=threading.TIMEOUT_MAX, allow_inf_nan=False)] | None)
"""Seconds a wait may last: up to :data:`threading.TIMEOUT_MAX` (a longer one makes the wait raise OverflowError)."""


def _validated(adapter: TypeAdapter[T], value: object, expected: str) -> T:
    """``value`` as ``adapter`` validates it.

    Raises:
        InvalidInputError: ``"<expected>, got <value!r> (<pydantic's reason>)"`` when it does not validate.
    """
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        reason = exc.errors(include_url=False)[0]["msg"]
        raise InvalidInputError(f"{expected}, got {shown_input(value)} ({reason})") from exc


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """``metadata`` as a plain dict (``{}`` for ``None``).

    Raises:
        InvalidInputError: when it is not a dict (any ``Mapping``), names a scope id (metadata can never set or
            override an id) or ``actor_id`` (the speaker, which only a message's ``name`` sets: Mem0 drops it from
            metadata, so a caller could not make a memory look said by someone else), or is not storable JSON at
            any depth (a non-str key, NaN, an object, a lone surrogate or NUL in a key or value:
            :func:`inferscale.storable.check_json`), before anything is done.
    """
    if metadata is None:
        return {}
    checked = _validated(_METADATA, metadata, "metadata must be a dict")
    check_json(checked, "metadata")
    clash = sorted(set(checked) & set(SCOPE_KEYS))
    if clash:
        raise InvalidInputError(
            f"metadata may not set scope ids {clash}; pass them as keyword arguments (user_id=..., ...)"
        )
    if "actor_id" in checked:
        raise InvalidInputError(
            "metadata may not set actor_id: it is the speaker of a message, set from the message's name "
            '({"role": "user", "name": ..., "content": ...})'
        )
    return checked


def resolve_limit(limit: int | None, top_k: int | None, default: int = DEFAULT_LIMIT) -> int:
    """One result count from Mem0 v1's ``limit`` or v2's ``top_k`` (``chat`` passes ``top_k=None``: its ``top_k``
    is the sampler's).

    Raises:
        InvalidInputError: when both are given with different values, or the one given is not an int from 0 to
            :data:`MAX_LIMIT`, naming the argument it came from.
    """
    if limit is not None and top_k is not None and limit != top_k:
        raise InvalidInputError(f"limit={limit!r} and top_k={top_k!r} disagree; pass one of them")
    name = "top_k" if limit is None and top_k is not None else "limit"
    value = limit if limit is not None else top_k if top_k is not None else default
    return _validated(_LIMIT, value, f"{name} must be a non-negative int, at most {MAX_LIMIT:,}")


def optional_scope(user_id: ScopeId | None, agent_id: ScopeId | None, run_id: ScopeId | None) -> Scope | None:
    """The scope named by the given ids, or ``None`` when none is given (an id-addressed call without a scope)."""
    if user_id is None and agent_id is None and run_id is None:
        return None
    return Scope.of(user_id, agent_id, run_id)


def check_add_messages(messages: Any, infer: Any, max_memory_chars: int) -> list[Message]:
    """Normalised messages of an ``add`` call, checked before anything is written.

    Raises:
        InvalidInputError: for malformed messages, a message ``name`` longer than a stored speaker may be
            (:data:`~inferscale.storage.models.KEY_LENGTH` characters: it is stored as the change's actor and the
            memory's ``actor_id``), a non-bool ``infer``, or (with ``infer=False``) a message longer than
            ``max_memory_chars`` characters: a memory is a fact recalled into a prompt, not a document. All are
            checked before any LLM call.
    """
    infer = check_flag(infer, "infer")
    msgs = normalize_messages(messages)
    for i, m in enumerate(msgs):
        if m.name is not None:
            check_key(m.name, f"message {i}'s name")
    if not infer:
        for i, m in enumerate(msgs):
            if m.role != "system":
                check_memory_length(m.content, max_memory_chars, f"message {i}", "or use infer=True to extract facts")
    return msgs


def check_add_prompt(prompt: Any, infer: bool, configured: str | None) -> str | None:
    """The custom instructions an ``add`` call's extraction follows: its ``prompt`` (Mem0's per-call custom
    instructions) when given, else ``configured`` (``llm.custom_instructions``).

    Args:
        prompt: the call's ``prompt``.
        infer: the call's checked ``infer``.
        configured: the config's custom instructions, already checked.

    Raises:
        InvalidInputError: for a ``prompt`` that is neither ``None`` nor a non-blank string of at most
            :data:`~inferscale.config.MAX_INSTRUCTIONS_CHARS` characters, or one given with ``infer=False``, where
            nothing is extracted (it would change nothing).
    """
    expected = f"prompt must be None or a non-blank str of at most {MAX_INSTRUCTIONS_CHARS:,} characters"
    checked = _validated(_INSTRUCTIONS, prompt, expected)
    if checked is not None and not infer:
        raise InvalidInputError(
            "prompt (custom instructions for fact extraction) needs infer=True: with infer=False the messages are "
            "stored as given and nothing is extracted"
        )
    return checked if checked is not None else configured


def check_memory_length(text: str, max_memory_chars: int, what: str, other_fix: str = "") -> None:
    """Refuse a text a user asks to store as one memory (``add(infer=False)``'s messages, ``update``'s new text) when
    it is longer than ``max_memory_chars`` characters: a memory is a fact recalled into a prompt, not a document.

    Args:
        what: how the message names the text, e.g. ``"message 2"``.
        other_fix: a further fix to name after splitting it or raising the limit, e.g. ``"or use infer=True"``.

    Raises:
        MemoryTooLongError: naming ``what``, its length and the limit.
    """
    if len(text) > max_memory_chars:
        fixes = f"Split it, raise the limit{', ' + other_fix if other_fix else ''}"
        raise MemoryTooLongError(
            f"{what} has {len(text):,} characters; a memory holds at most max_memory_chars={max_memory_chars:,}. "
            f"{fixes}"
        )


def check_flag(value: Any, name: str) -> bool:
    """``value`` when it is ``True`` or ``False`` (no ``1``, ``"yes"`` or ``None``).

    Raises:
        InvalidInputError: ``"<name> must be True or False, got <value!r> (...)"`` for anything else.
    """
    return _validated(_FLAG, value, f"{name} must be True or False")


def check_update(
    memory_id: str,
    text: str | None,
    metadata: Mapping[str, Any] | None,
    data: str | None,
    max_memory_chars: int | None,
) -> tuple[str | None, dict[str, Any] | None]:
    """The new text and metadata of an ``update`` (either may be ``None``: unchanged), checked before the memory is
    looked up.

    Args:
        max_memory_chars: the longest new text (``MemoryConfig.max_memory_chars``), as ``add(infer=False)`` allows;
            ``None`` where the limit is not known here (a remote client: the server checks it).

    Raises:
        InvalidInputError: when ``text`` and ``data`` (Mem0's name for it) disagree, nothing is given, the new
            text is not a str or is longer than ``max_memory_chars``, or the metadata is not storable
            (:func:`check_metadata`).
    """
    if text is not None and data is not None and text != data:
        raise InvalidInputError("text and data are two names for the new text; pass one of them")
    new_text = text if text is not None else data
    if new_text is not None and not isinstance(new_text, str):  # before the lookup, as a remote client's server does
        name, kind = "text" if text is not None else "data", type(new_text).__name__
        raise InvalidInputError(f"{name} must be a str (memory {memory_id!r}'s new text), got {kind}")
    meta = check_metadata(metadata) if metadata is not None else None
    if new_text is None and meta is None:
        raise InvalidInputError(f"nothing to update for memory {memory_id!r}: pass text (or data), metadata or both")
    if isinstance(new_text, str) and max_memory_chars is not None:
        check_memory_length(new_text, max_memory_chars, f"the new text of memory {memory_id!r}")
    return new_text, meta


def check_chat_mode(mode: Any) -> ChatMode:
    """``mode`` when it is ``"kv"`` or ``"prompt"`` (no ``None``: a chat always says how it serves its memories).

    Raises:
        InvalidInputError: ``"mode must be 'kv' or 'prompt', got <mode!r>"`` for anything else.
    """
    if mode not in ("kv", "prompt"):
        raise InvalidInputError(f"mode must be 'kv' or 'prompt', got {mode!r}")
    checked: ChatMode = mode
    return checked


def check_optional_flag(value: Any, name: str) -> bool | None:
    """``value`` when it is ``True``, ``False`` or ``None`` (the config's default).

    Raises:
        InvalidInputError: ``"<name> must be True, False or None, got <value!r> (...)"`` for anything else.
    """
    return _validated(_OPTIONAL_FLAG, value, f"{name} must be True, False or None")


def encode_mode(encode_kv: Any, default: EncodeMode) -> EncodeMode:
    """When an ``add`` encodes its memories' K/V: ``encode_kv=True`` is ``"eager"`` (now), ``False`` is
    ``"lazy"`` (on first use), ``None`` is ``default`` (``config.kv.encode_on_add``).

    Raises:
        InvalidInputError: when ``encode_kv`` is not ``True``, ``False`` or ``None``.
    """
    flag = check_optional_flag(encode_kv, "encode_kv")
    if flag is None:
        return default
    return "eager" if flag else "lazy"


def check_timeout(timeout: Any, name: str = "timeout") -> float | None:
    """``None`` (no limit) or a finite number of seconds from 0 to :data:`threading.TIMEOUT_MAX`, as a float
    (``name``: the argument it came from, for the message).

    Raises:
        InvalidInputError: for anything else (a negative number, a bool, a string, NaN, an infinity, more seconds
            than a wait can take).
    """
    return _validated(
        _TIMEOUT, timeout, f"{name} must be None or a finite number of seconds from 0 to {threading.TIMEOUT_MAX:g}"
    )


def check_query(query: Any, name: str = "query") -> str:
    """A non-empty query string that every backend can take: valid Unicode without NUL, as every other string of a
    call (:func:`inferscale.storable.check_storable`; ``name``: the argument it came from, for the message).

    Raises:
        InvalidInputError: for anything else; a lone surrogate or a NUL is named with its index.
    """
    if isinstance(query, str):
        check_storable(query, name)
    return _validated(_QUERY, query, f"{name} must be a non-empty string of valid Unicode text")


def check_chat_query(query: Any) -> str:
    """A ``chat`` query: the user's message, a non-empty string of valid Unicode. Unlike a search query it may hold
    NUL, as every chat message may: it is not stored (:func:`inferscale.storable.check_unicode`).

    Raises:
        InvalidInputError: for anything else; a lone surrogate is named with its index.
    """
    if isinstance(query, str):
        check_unicode(query, "query")
    return _validated(_QUERY, query, "query must be a non-empty string of valid Unicode text")


def check_query_or_messages(query: object, messages: object) -> None:
    """A ``chat`` call gives exactly one of ``query`` and ``messages``.

    Raises:
        InvalidInputError: naming which mistake it is: neither given, or both.
    """
    if query is None and messages is None:
        raise InvalidInputError("pass a query string or messages=[{'role', 'content'}, ...]: neither was given")
    if query is not None and messages is not None:
        raise InvalidInputError("pass either a query string or messages=[{'role', 'content'}, ...], not both")


def check_max_new_tokens(max_new_tokens: int | None, name: str = "max_new_tokens") -> int | None:
    """``None`` (the config's budget) or a positive int (tokens); ``name``: the argument or request field it came
    from (the server's ``max_tokens``), for the message.

    Raises:
        InvalidInputError: for anything else.
    """
    return _validated(_MAX_NEW_TOKENS, max_new_tokens, f"{name} must be a positive int or None")


def check_threshold(threshold: float | None) -> float | None:
    """``None`` or a finite real number (a cosine-similarity floor), as a float.

    Raises:
        InvalidInputError: for anything else (a string, a bool, NaN, an infinity).
    """
    return _validated(_THRESHOLD, threshold, "threshold must be a finite number or None")


def resolve_scope(
    user_id: ScopeId | None, agent_id: ScopeId | None, run_id: ScopeId | None, filters: Mapping[str, Any] | None
) -> tuple[Scope, Filter | None]:
    """The scope of a call from keyword ids (v1) and ids pinned inside ``filters`` (v2), ANDed together.

    Returns:
        ``(scope, parsed_filter)``; the filter still holds its id conditions (they are redundant with the scope).

    Raises:
        ScopeError: when no id is given either way, or ``filters`` pins an id to two values.
        InvalidInputError: for a malformed filter, or a keyword id that disagrees with the id in ``filters``.
    """
    node = parse_filters(filters)
    # checked (an int made its string) before comparing with the filter's ids, which parse_filters made strings too
    ids = dict(zip(SCOPE_KEYS, check_scope_ids(user_id, agent_id, run_id), strict=True))
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
    _validated(_VERSION, version, "version must be 'v1' or 'v2' (both call shapes are always accepted)")


_MEM0_UNSUPPORTED = {
    "timestamp": "a memory is timestamped when it is added",
    "expiration_date": "memories do not expire",
    "rerank": "there is no reranker; results are ranked by cosine similarity",
    "explain": "scores are cosine similarities, with no explanation",
    "reference_date": "memories do not expire, so there is no date to judge expiry by",
}


def refuse_unsupported_mem0(call: str, **given: Any) -> None:
    """Accept Mem0 2.x arguments InferScale does not implement only at their neutral value (``None`` or ``False``),
    so a migrated program that passes the defaults keeps working and one that relies on the feature is told.

    Args:
        call: the method, for the message (``"add"``, ``"search"``).
        given: the arguments as passed (``timestamp``, ``expiration_date``, ``rerank``, ``explain``,
            ``reference_date``).

    Raises:
        InvalidInputError: naming the first argument set to something else, and why it is not supported.
    """
    for name, value in given.items():
        if value is not None and value is not False:
            raise InvalidInputError(
                f"{call}({name}={value!r}) is a Mem0 argument InferScale does not support: {_MEM0_UNSUPPORTED[name]} "
                "(see docs/migration.md)"
            )


def check_output_format(output_format: str | None) -> None:
    """Accept Mem0's ``output_format`` when it asks for the shape InferScale always returns: ``"v1.1"`` (or
    ``None``), ``{"results": [...]}``.

    Raises:
        InvalidInputError: for another value (Mem0's ``"v1.0"`` bare list is not offered).
    """
    if output_format not in (None, "v1.1"):
        raise InvalidInputError(
            f"output_format={output_format!r}: InferScale always returns Mem0's v1.1 shape {{'results': [...]}}; "
            "pass 'v1.1' or leave it out"
        )


def check_memories(memories: Any) -> list[MemoryRecord | str]:
    """``memory_kv``'s memories: a sequence (not a str, which would be read one character per id) of records or
    ids, each id checked by :func:`~inferscale.storage.validation.check_id`.

    Raises:
        InvalidInputError: otherwise, naming the first bad item.
    """
    if isinstance(memories, str | bytes) or not isinstance(memories, Sequence):
        raise InvalidInputError(
            f"memories must be a list of memory records or id strings, got {type(memories).__name__}"
        )
    return [m if isinstance(m, MemoryRecord) else check_id(m) for m in memories]
