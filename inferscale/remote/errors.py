"""Server replies back to results and exceptions, without I/O.

A non-2xx reply carries ``{"error": {"code", "type", "message"}}``; its ``code`` is turned back into the exception
the server raised (:func:`inferscale.error_codes.error_from_code`), so a remote call fails with the local client's
error types. A reply in any other shape (a proxy's error page, a server of another kind) is a
:class:`~inferscale.errors.ServerError` that quotes the status and the start of the body.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from inferscale.error_codes import error_from_code
from inferscale.errors import InferScaleError, MemoryNotFoundError, RateLimitedError, ServerError
from inferscale.json_text import loads_json
from inferscale.remote.calls import ApiCall

T = TypeVar("T")

BODY_QUOTED = 300
"""Characters of an unexpected body quoted in an error message."""


def decoded_error(body: Any) -> InferScaleError | None:
    """The exception an ``{"error": {"code", "message"}}`` object stands for, or ``None`` for another shape."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(code, str) and isinstance(message, str):
        return error_from_code(code, message)
    return None


def _json_or_none(content: bytes) -> Any:
    try:
        return loads_json(content)
    except ValueError:  # also UnicodeDecodeError
        return None


def is_error_reply(content: bytes) -> bool:
    """Whether ``content`` is an InferScale error reply (the server's own, typed answer), not a proxy's page."""
    return decoded_error(_json_or_none(content)) is not None


def error_of(status: int, content: bytes, what: str, retry_after_s: float | None = None) -> InferScaleError:
    """The exception of a non-2xx reply: its code's type with its message, or a :class:`ServerError` naming
    ``what`` (e.g. ``"POST http://host/v1/memories/"``), the status and the start of the body. A
    :class:`~inferscale.errors.RateLimitedError` takes its ``retry_after_s`` from the reply's ``Retry-After``
    (``retry_after_s``, rounded up to whole seconds, at least 1) where the reply had one."""
    text = content.decode("utf-8", errors="replace")
    error = decoded_error(_json_or_none(content))
    if error is None:
        return ServerError(f"{what} answered HTTP {status}, not with an InferScale error: {text[:BODY_QUOTED]!r}")
    if isinstance(error, RateLimitedError) and retry_after_s is not None:
        error.retry_after_s = max(1, math.ceil(retry_after_s))
    return error


def unsent_value(call: ApiCall[T], unroutable_id: str) -> T:
    """The result of ``call``, not sent because no path carries ``unroutable_id`` to its route: the server's answer
    for a memory it does not hold (``call.decode(None)`` for a ``missing_ok`` call).

    Raises:
        MemoryNotFoundError: for any other call.
    """
    if call.missing_ok:
        return call.decode(None)
    raise MemoryNotFoundError(f"no memory with id {unroutable_id!r}")


def reply_value(call: ApiCall[T], status: int, content: bytes, what: str, retry_after_s: float | None = None) -> T:
    """The result of ``call`` from its reply's status and body.

    Returns:
        ``call.decode`` of the JSON body of a 2xx reply; ``call.decode(None)`` for a ``memory_not_found`` reply to a
        call that is ``missing_ok``.

    Raises:
        InferScaleError: the type of a non-2xx reply's code (see :func:`error_of`, which ``retry_after_s`` is
            passed to).
        ServerError: for a 2xx body that is not JSON, or not the JSON the call answers with.
    """
    if 200 <= status < 300:
        try:
            body = loads_json(content) if content else None
        except ValueError as exc:
            raise ServerError(
                f"{what} answered HTTP {status} with a body that is not JSON: {content[:BODY_QUOTED]!r}"
            ) from exc
        return call.decode(body)
    error = error_of(status, content, what, retry_after_s)
    if call.missing_ok and isinstance(error, MemoryNotFoundError):
        return call.decode(None)
    raise error
