"""The memory API's calls as HTTP requests, built without I/O (the contract in docs/server.md's wire table).

Each builder turns one public method's arguments into an :class:`ApiCall`: method, path, query, JSON body, whether
the call may be retried, and how its 2xx reply becomes the method's result. The sync and async remote clients send
the same :class:`ApiCall` values through their own transport, so the wire format lives here once.

Arguments are passed through as given: the server validates them and answers with the same typed errors as the
local client. What JSON or a URL cannot carry faithfully is refused here instead, with the local client's check and
error: a scope id that is not a storable non-empty string (:func:`inferscale.scope.check_scope_id`: a URL query, or
a JSON body the server reads into a str field, cannot give the local answer), a value that is not plain JSON at any
depth (:func:`inferscale.storable.check_json`: a non-str object key, which JSON would quietly turn into a string, NaN
or an infinity, an object), a memory id that cannot be a path segment, and text in the URL that is not valid Unicode
(a lone surrogate has no UTF-8 form to escape).

A ``None`` is left out of a body, so the server takes its default: that is the local client's answer only where the
local default is ``None`` too. The arguments whose local default is not (``add``'s ``infer``, ``search``'s
``show_expired`` here; ``chat``'s ``mode`` and ``stream`` in :func:`inferscale.remote.chat.chat_call`) are therefore
checked before sending with the local client's own checks, which refuse ``None``. Mem0's unsupported arguments are
neutral at ``None`` and at ``False`` (:func:`inferscale.arguments.refuse_unsupported_mem0`); those the server's schema
types as text or a number (``timestamp``, ``expiration_date``, ``reference_date``) are left out at ``False``, which
the schema would refuse.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from dataclasses import fields as dataclass_fields
from datetime import date
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from inferscale.arguments import (
    check_add_prompt,
    check_flag,
    check_timeout,
    check_update,
    refuse_unsupported_mem0,
)
from inferscale.errors import InvalidInputError, ServerError
from inferscale.filters import parse_filters
from inferscale.memory_ids import routable
from inferscale.scope import SCOPE_KEYS, check_scope_ids
from inferscale.storable import MAX_JSON_DEPTH, check_json, check_unicode

T = TypeVar("T")

# ------------------------------------------------------------------------------------------------------- the call


def reply_dict(reply: Any) -> dict[str, Any]:
    """A 2xx reply that must be a JSON object.

    Raises:
        ServerError: for any other JSON value.
    """
    if not isinstance(reply, dict):
        raise ServerError(f"the server answered {type(reply).__name__} where a JSON object was expected")
    return reply


def reply_list(reply: Any) -> list[dict[str, Any]]:
    """A 2xx reply that must be a JSON list (``history``).

    Raises:
        ServerError: for any other JSON value.
    """
    if not isinstance(reply, list):
        raise ServerError(f"the server answered {type(reply).__name__} where a JSON list was expected")
    return reply


def reply_none(reply: Any) -> None:
    """A 2xx reply whose content the method does not return (``reset``)."""
    return None


@dataclass(frozen=True, slots=True)
class ApiCall(Generic[T]):
    """One request of the remote client and how its reply is read.

    Attributes:
        method: the HTTP method.
        path: the path under the server's base URL, with path segments already escaped.
        params: the URL query (values are text).
        content: the JSON body as UTF-8 bytes, or ``None`` for a request without a body.
        idempotent: whether sending it twice answers what sending it once does (GET, PUT, the search and get_all
            POSTs; not the DELETEs, whose second request answers for what the first deleted): such a call is
            retried on 502, 503 and 504 replies. Every call is retried on connection errors, which happen before
            the request is sent.
        decode: the method's result from the reply's JSON.
        missing_ok: a ``memory_not_found`` error reply means the result ``decode(None)`` (``get`` answers ``None``,
            ``history`` ``[]``: the local client's answers for a memory it cannot show).
        unroutable_id: a memory id that no path can carry to its route (:func:`~inferscale.memory_ids.routable`),
            or ``None``. Such a call is not sent, and answers as the server does for a memory it does not hold
            (``decode(None)`` when ``missing_ok``, else :class:`~inferscale.errors.MemoryNotFoundError`).
    """

    method: str
    path: str
    decode: Callable[[Any], T]
    params: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    idempotent: bool = True
    missing_ok: bool = False
    unroutable_id: str | None = None


# ------------------------------------------------------------------------------------------------ JSON and URLs


def _plain(value: Any, name: str, *, dates: bool = False, depth: int = 0) -> Any:
    """``value`` with the containers the client accepts made plain (a dataclass such as ``ChatMessage`` a dict, any
    ``Mapping`` a dict, any other non-text ``Sequence`` a list), at any depth; keys and scalars as they are, but with
    ``dates`` a date or datetime becomes ISO 8601 text (a filter's timestamp operand, which the server reads back
    alike; naive still means UTC).

    Args:
        value: an argument's value, or a part of it.
        name: the argument's name, for the message.
        dates: turn dates and datetimes into ISO 8601 text (``filters``).
        depth: how many lists and dicts hold ``value`` in the argument (0 for the argument itself).

    Raises:
        InvalidInputError: the local client's error for a value nested deeper than
            :data:`~inferscale.storable.MAX_JSON_DEPTH` (a cycle included: it would recurse until Python's
            ``RecursionError``), naming the argument ``name``.
    """
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(f"{name} nests deeper than {MAX_JSON_DEPTH} levels (is it cyclic?)")
    if dates and isinstance(value, date):  # datetime included
        return value.isoformat()
    if is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclass_fields(value)}  # one level; depth counted below
    if isinstance(value, Mapping):
        return {key: _plain(item, name, dates=dates, depth=depth + 1) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return [_plain(item, name, dates=dates, depth=depth + 1) for item in value]
    return value


def check_sendable(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` without their ``None`` values, each made plain and checked to have a faithful JSON form.

    Args:
        fields: argument name -> value (the name is the root of the path a message names, e.g.
            ``"metadata['a']"``).

    Raises:
        InvalidInputError: the local client's error (:func:`inferscale.storable.check_json`) for a non-str object key
            at any depth (JSON would send ``1`` as ``"1"``), NaN or an infinity, a value of another type, or nesting
            deeper than :data:`~inferscale.storable.MAX_JSON_DEPTH` (a cycle included); for ``filters``, what
            :func:`inferscale.filters.parse_filters` refuses.
    """
    if isinstance(fields.get("filters"), Mapping):
        parse_filters(fields["filters"])  # the local client's checks and errors, dates and datetimes only as timestamps
    given = {name: _plain(value, name, dates=name == "filters") for name, value in fields.items() if value is not None}
    for name, value in given.items():
        check_json(value, name, strings=False)
    return given


def encode_json(body: Mapping[str, Any]) -> bytes:
    """``body`` without its ``None`` values (the server's defaults), as JSON bytes.

    Non-ASCII text is escaped (``\\uXXXX``), so text that is not valid Unicode (a lone surrogate) still reaches the
    server, which refuses it with the local client's error.

    Raises:
        InvalidInputError: for a value with no faithful JSON form (see :func:`check_sendable`), naming the field.
    """
    return json.dumps(check_sendable(body), allow_nan=False).encode("ascii")


def _unless_false(value: Any) -> Any:
    """``value``, or ``None`` (not sent) for ``False``: a Mem0 argument's neutral value the schema does not type."""
    return None if value is False else value


def segment(memory_id: Any) -> str:
    """``memory_id`` as one escaped path segment (``..`` cannot change the route; a ``/`` can: see
    :func:`inferscale.memory_ids.routable`).

    Raises:
        InvalidInputError: when ``memory_id`` is not a non-empty str (it would name no memory, or another route),
            or holds a lone surrogate.
    """
    if not isinstance(memory_id, str) or not memory_id:
        raise InvalidInputError(f"memory_id must be a non-empty str, got {memory_id!r}")
    check_unicode(memory_id, "memory_id")
    escaped = quote(memory_id, safe="")
    return escaped.replace(".", "%2E") if set(memory_id) == {"."} else escaped


def scope_params(user_id: Any, agent_id: Any, run_id: Any) -> dict[str, str]:
    """The given scope ids, each checked as the local client checks it (:func:`inferscale.scope.check_scope_id`),
    as a URL query; the body of a call that sends them in JSON uses the same check.

    Raises:
        ScopeError: for an id that is neither a non-empty str nor an int (an int is sent as its string).
        InvalidInputError: for an id that is too long or holds a lone surrogate or NUL, as the local client.
    """
    ids = check_scope_ids(user_id, agent_id, run_id)
    return {key: value for key, value in zip(SCOPE_KEYS, ids, strict=True) if value is not None}


def _memory_call(
    method: str,
    memory_id: Any,
    decode: Callable[[Any], T],
    params: dict[str, str],
    *,
    suffix: str = "",
    content: bytes | None = None,
    idempotent: bool = True,
    missing_ok: bool = False,
) -> ApiCall[T]:
    """A call on ``/v1/memories/{memory_id}/{suffix}``, not to be sent when the id is not
    :func:`~inferscale.memory_ids.routable`."""
    path = f"/v1/memories/{segment(memory_id)}/{suffix}"
    unroutable = None if routable(memory_id) else memory_id
    return ApiCall(
        method,
        path,
        decode,
        params=params,
        content=content,
        idempotent=idempotent,
        missing_ok=missing_ok,
        unroutable_id=unroutable,
    )


# ------------------------------------------------------------------------------------------------ the builders


def ping() -> ApiCall[dict[str, Any]]:
    """``GET /v1/ping/``: whether the server answers, and what the API key may touch."""
    return ApiCall("GET", "/v1/ping/", reply_dict)


def add(
    messages: Any,
    *,
    user_id: Any,
    agent_id: Any,
    run_id: Any,
    metadata: Any,
    infer: Any,
    prompt: Any,
    encode_kv: Any,
    timestamp: Any,
    expiration_date: Any,
    output_format: Any,
    version: Any,
) -> ApiCall[dict[str, list[dict[str, Any]]]]:
    """``POST /v1/memories/`` (never retried once sent: a second add could store the memories twice).

    ``infer`` and ``prompt`` are checked here with the local client's checks, and Mem0's unsupported ``timestamp``
    and ``expiration_date`` are not sent when ``False`` (see the module's docstring).
    """
    user_id, agent_id, run_id = check_scope_ids(user_id, agent_id, run_id)
    check_add_prompt(prompt, check_flag(infer, "infer"), None)
    body = {
        "messages": messages,
        "user_id": user_id,
        "agent_id": agent_id,
        "run_id": run_id,
        "metadata": metadata,
        "infer": infer,
        "prompt": prompt,
        "encode_kv": encode_kv,
        "timestamp": _unless_false(timestamp),
        "expiration_date": _unless_false(expiration_date),
        "output_format": output_format,
        "version": version,
    }
    return ApiCall("POST", "/v1/memories/", reply_dict, content=encode_json(body), idempotent=False)


def search(
    query: Any,
    *,
    user_id: Any,
    agent_id: Any,
    run_id: Any,
    filters: Any,
    limit: Any,
    top_k: Any,
    threshold: Any,
    version: Any,
    output_format: Any,
    rerank: Any,
    explain: Any,
    reference_date: Any,
    show_expired: Any,
) -> ApiCall[dict[str, list[dict[str, Any]]]]:
    """``POST /v2/memories/search/`` for ``version="v2"``, else ``POST /v1/memories/search/`` (the same body).

    ``show_expired`` is checked here with the local client's check, and Mem0's unsupported ``reference_date`` is not
    sent when ``False`` (see the module's docstring)."""
    user_id, agent_id, run_id = check_scope_ids(user_id, agent_id, run_id)
    check_flag(show_expired, "show_expired")
    body = {
        "query": query,
        "user_id": user_id,
        "agent_id": agent_id,
        "run_id": run_id,
        "filters": filters,
        "limit": limit,
        "top_k": top_k,
        "threshold": threshold,
        "version": version,
        "output_format": output_format,
        "rerank": rerank,
        "explain": explain,
        "reference_date": _unless_false(reference_date),
        "show_expired": show_expired,
    }
    path = "/v2/memories/search/" if version == "v2" else "/v1/memories/search/"
    return ApiCall("POST", path, reply_dict, content=encode_json(body))


def _is_count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def get_all(
    *,
    user_id: Any,
    agent_id: Any,
    run_id: Any,
    filters: Any,
    limit: Any,
    top_k: Any,
    version: Any,
    output_format: Any,
    show_expired: Any,
) -> ApiCall[dict[str, list[dict[str, Any]]]]:
    """Mem0's v1 ``GET /v1/memories/`` when the call fits in a URL query (int counts, no filters, no v2 or output
    format asked for); else the v2 ``POST /v2/memories/``, which carries every argument with its JSON type. The
    scope ids are checked either way (:func:`~inferscale.scope.check_scope_ids`), and ``show_expired`` with the local
    client's check (it changes nothing, so it is not sent)."""
    user_id, agent_id, run_id = check_scope_ids(user_id, agent_id, run_id)
    check_flag(show_expired, "show_expired")
    params = scope_params(user_id, agent_id, run_id)
    fits_query = (
        filters is None and version in (None, "v1") and output_format is None and _is_count(limit) and _is_count(top_k)
    )
    if fits_query:
        params.update({k: str(v) for k, v in (("limit", limit), ("top_k", top_k)) if v is not None})
        return ApiCall("GET", "/v1/memories/", reply_dict, params=params)
    body = {
        "user_id": user_id,
        "agent_id": agent_id,
        "run_id": run_id,
        "filters": filters,
        "limit": limit,
        "top_k": top_k,
        "version": version,
        "output_format": output_format,
    }
    return ApiCall("POST", "/v2/memories/", reply_dict, content=encode_json(body))


def _optional_dict(reply: Any) -> dict[str, Any] | None:
    return None if reply is None else reply_dict(reply)


def get(memory_id: Any, *, user_id: Any, agent_id: Any, run_id: Any) -> ApiCall[dict[str, Any] | None]:
    """``GET /v1/memories/{memory_id}/``; a ``memory_not_found`` reply is the result ``None``."""
    params = scope_params(user_id, agent_id, run_id)
    return _memory_call("GET", memory_id, _optional_dict, params, missing_ok=True)


def update(
    memory_id: Any,
    *,
    text: Any,
    metadata: Any,
    data: Any,
    expiration_date: Any,
    user_id: Any,
    agent_id: Any,
    run_id: Any,
) -> ApiCall[dict[str, Any]]:
    """``PUT /v1/memories/{memory_id}/`` (setting the same values twice changes nothing the second time). For an id
    that is not sent (:attr:`ApiCall.unroutable_id`), the local client's checks of the new values come first, as
    they come before its lookup. Mem0's ``expiration_date`` is refused here unless ``None`` or ``False``, as the
    local client refuses it, and never sent."""
    refuse_unsupported_mem0("update", expiration_date=expiration_date)
    body = encode_json({"text": text, "data": data, "metadata": metadata})
    params = scope_params(user_id, agent_id, run_id)
    call = _memory_call("PUT", memory_id, reply_dict, params, content=body)
    if call.unroutable_id is not None:
        check_update(call.unroutable_id, text, metadata, data, max_memory_chars=None)  # the server's limit
    return call


def delete(memory_id: Any, *, user_id: Any, agent_id: Any, run_id: Any) -> ApiCall[dict[str, Any]]:
    """``DELETE /v1/memories/{memory_id}/``, not retried on a proxy's 5xx: the first request may have deleted the
    memory, and a second would then answer ``memory_not_found`` for a delete that happened."""
    params = scope_params(user_id, agent_id, run_id)
    return _memory_call("DELETE", memory_id, reply_dict, params, idempotent=False)


def delete_all(*, user_id: Any, agent_id: Any, run_id: Any) -> ApiCall[dict[str, Any]]:
    """``DELETE /v1/memories/`` with the scope in the query (the server refuses an empty scope), not retried on a
    proxy's 5xx: a second request would count 0 memories deleted after the first deleted them."""
    params = scope_params(user_id, agent_id, run_id)
    return ApiCall("DELETE", "/v1/memories/", reply_dict, params=params, idempotent=False)


def _history_rows(reply: Any) -> list[dict[str, Any]]:
    return [] if reply is None else reply_list(reply)


def history(memory_id: Any, *, user_id: Any, agent_id: Any, run_id: Any) -> ApiCall[list[dict[str, Any]]]:
    """``GET /v1/memories/{memory_id}/history/``; a ``memory_not_found`` reply (a keyed server's answer for a memory
    outside the key's scopes) is ``[]``, the local client's answer for a memory it cannot show."""
    params = scope_params(user_id, agent_id, run_id)
    return _memory_call("GET", memory_id, _history_rows, params, suffix="history/", missing_ok=True)


ENCODING_WAIT_SLICE_S = 30.0
"""The longest wait one request of a remote ``wait_for_encoding`` asks for (seconds; at most half the client's
``timeout``, so the reply comes before a read times out). The server may answer sooner (it waits 60 s at most)."""


def _done(reply: Any) -> bool:
    done = reply_dict(reply).get("done")
    if not isinstance(done, bool):
        raise ServerError(f"the server answered done={done!r} where true or false was expected")
    return done


def wait_for_encoding(timeout: Any, http_timeout: float) -> Iterator[ApiCall[bool]]:
    """``POST /v1/encoding/wait/`` requests, one after another, that together wait ``timeout`` seconds (``None``:
    without end): each asks for what is left, at most :data:`ENCODING_WAIT_SLICE_S` and half ``http_timeout``. At
    least one is made (``timeout=0`` asks once whether the queue is empty); the caller stops at the first ``True``.

    Raises:
        InvalidInputError: the local client's error for a ``timeout`` that is not ``None`` or a finite number of
            seconds from 0 to :data:`threading.TIMEOUT_MAX` (raised by the first ``next``).
    """
    limit = check_timeout(timeout)
    longest = min(ENCODING_WAIT_SLICE_S, http_timeout / 2)
    deadline = None if limit is None else time.monotonic() + limit
    while True:
        left = longest if deadline is None else max(0.0, deadline - time.monotonic())
        yield ApiCall("POST", "/v1/encoding/wait/", _done, content=encode_json({"timeout": min(left, longest)}))
        if deadline is not None and left <= longest:
            return


def reset() -> ApiCall[None]:
    """``POST /v1/reset/`` (an admin key's call; not retried on a 5xx reply: it is no read)."""
    return ApiCall("POST", "/v1/reset/", reply_none, idempotent=False)
