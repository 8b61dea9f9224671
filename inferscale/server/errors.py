"""Structured error replies: every non-2xx answer is ``{"error": {"code", "type", "message"}}`` with the status of
its code in :data:`inferscale.error_codes.ERROR_CODES`, so the remote client raises the same exception type.

One set of handlers (:func:`install_error_handlers`): InferScale errors by their code; FastAPI's request validation
failures (its 422) as 400 ``invalid_input``; Starlette's HTTP errors by their status with their code (unknown
path 404 ``route_not_found``, wrong method 405 ``method_not_allowed``); any other exception as 500
``internal_error``, logged with its traceback. Every error reply goes through :func:`error_reply`, which tells
clients not to send again a request that would get the same error (``x-should-retry: false``).

Every reply carries an ``X-Request-ID`` header (the caller's, when it sends a UUID4 one; else a new one:
``asgi-correlation-id``'s middleware, :func:`install_request_ids`). The replies whose details stay in the server's
log (a 500, an unreachable database) name it in their message, and the log line names it too, so an operator finds
the traceback of the reply a user reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from asgi_correlation_id import CorrelationIdMiddleware, correlation_id
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferscale.error_codes import ERROR_CODE, ErrorCode, code_of
from inferscale.errors import (
    ConfigError,
    DatabaseUnavailableError,
    EngineClosedError,
    ExtractionError,
    InferScaleError,
    KVFingerprintMismatchError,
    ModelNotAvailableError,
    RateLimitedError,
    SchemaError,
    ServerError,
)
from inferscale.validation_text import describe_errors

log = logging.getLogger(__name__)

_BY_STATUS = {
    401: "unauthenticated",
    403: "permission_denied",
    404: "route_not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


class ErrorDetail(BaseModel):
    """The ``error`` object of a reply that is not 2xx."""

    code: str
    type: str
    message: str


class ErrorReply(BaseModel):
    """A reply that is not 2xx."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorReply, "description": description}
    for status, description in (
        (400, "invalid input (invalid_input, scope_required)"),
        (401, "no, unknown or revoked API key (unauthenticated)"),
        (403, "the API key may not make this call (permission_denied)"),
        (404, "no such memory in the caller's scopes (memory_not_found), or no such route (route_not_found)"),
        (413, "request body over the limit (request_too_large)"),
        (429, "too many API key checks failed lately, and this key was not verified before (rate_limited)"),
        (500, "the server failed (internal_error, config_error)"),
    )
}
"""The error replies every API route may give, for the OpenAPI schema (FastAPI's 422 is never sent: see
:func:`openapi_without_422`)."""


def openapi_without_422(app: FastAPI) -> dict[str, Any]:
    """``app``'s OpenAPI schema without FastAPI's default 422 reply and its schemas, which this server never sends
    (its validation failures are 400 ``invalid_input``, listed as :data:`ERROR_RESPONSES`). Built once and kept, as
    FastAPI's own ``app.openapi`` does; install it with ``app.openapi = lambda: openapi_without_422(app)``."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        schemas = schema.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def error_content(row: ErrorCode, message: str, type_name: str | None = None) -> dict[str, Any]:
    """The JSON body of an error reply: ``{"error": {"code", "type", "message"}}``; ``type`` defaults to the
    exception class of ``row``."""
    return {"error": {"code": row.code, "type": type_name or row.error.__name__, "message": message}}


DATABASE_UNAVAILABLE_MESSAGE = "the memory database is unavailable; the server log has the details"
"""What a caller reads of a :class:`~inferscale.errors.DatabaseUnavailableError` (with the request id,
:func:`logged_message`): its own text names the database's URL (driver, user, host, port, database) and the driver's
message, which are the server's to know."""

EXTRACTION_FAILED_MESSAGE = "the LLM that extracts facts gave no usable answer; the server log has the details"
"""What a caller reads of an :class:`~inferscale.errors.ExtractionError` (with the request id): its own text names the
LLM backend's URL and quotes its reply, which may hold the backend's internal host names or echo its API key (an
operator tester's find), and which, quoting the prompt, may hold the conversation: the server logs it at WARNING,
with only its class at ERROR, so that ``--log-level error`` keeps memory text out of the log."""

KV_MISMATCH_MESSAGE = (
    "a stored K/V entry of a memory this request uses was written for another model, encoding or text, and is never "
    "injected: the operator can delete it to have it encoded again; the server log names it"
)
"""What a caller reads of a :class:`~inferscale.errors.KVFingerprintMismatchError` (with the request id): its own
text names the entry's file on the server and the text hashes it was written for."""

SERVER_SETUP_MESSAGES: dict[type[ConfigError], str] = {
    SchemaError: "the memory database's schema is not one this server reads; the server log has the details",
    ModelNotAvailableError: "the server's model is not available; the server log has the details",
    ConfigError: "the server cannot use its configuration or files for this request; the server log has the details",
}
"""What a caller reads of the errors of the server's own setup (with the request id): their own texts name its files
and folders (an index file, a model folder), which are the operator's to know and to fix (a review's find)."""

_LOGGED_ONLY: tuple[tuple[type[InferScaleError], str], ...] = (
    (DatabaseUnavailableError, DATABASE_UNAVAILABLE_MESSAGE),
    (ExtractionError, EXTRACTION_FAILED_MESSAGE),
    (KVFingerprintMismatchError, KV_MISMATCH_MESSAGE),
    *SERVER_SETUP_MESSAGES.items(),  # the subclasses first: the first match answers
)

REQUEST_ID_HEADER = "X-Request-ID"
"""The header every reply carries its request id in (and a caller may send one in, a UUID4)."""


def request_id() -> str:
    """The id of the request being answered (:data:`REQUEST_ID_HEADER`), or ``"-"`` outside one."""
    return correlation_id.get() or "-"


def logged_message(message: str) -> str:
    """``message`` for a reply whose details are only in the server's log: ``"...; the server log has the details"``
    with the request id the log line names, e.g. ``"...; the server log has the details (request 3f2a...)"``."""
    return f"{message} (request {request_id()})"


SHOULD_RETRY_HEADER = "x-should-retry"
"""The header that tells the OpenAI SDKs (and other clients generated as they are) whether to send a request again;
they otherwise retry a 408, 409, 429 and any 5xx."""


def error_reply(
    content: dict[str, Any], row: ErrorCode, status: int | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error reply: ``content`` with ``status`` (default ``row``'s) and ``headers``, plus
    ``x-should-retry: false`` when the same request would get the same error again (:attr:`ErrorCode.repeats`:
    the SDK sent a request refused with 409 ``kv_fingerprint_mismatch`` three times, a helper's find)."""
    sent = dict(headers or {})
    if row.repeats:
        sent[SHOULD_RETRY_HEADER] = "false"
    return JSONResponse(content, status_code=status or row.status, headers=sent)


def error_response(exc: InferScaleError) -> JSONResponse:
    """The reply for ``exc``: its code's status and body (:func:`error_body`), and :func:`error_reply`'s headers;
    a :class:`~inferscale.errors.RateLimitedError` adds ``Retry-After`` (its ``retry_after_s``, whole seconds)."""
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, RateLimitedError) else None
    return error_reply(error_body(exc), code_of(exc), headers=headers)


def error_body(exc: InferScaleError) -> dict[str, Any]:
    """The body of the reply for ``exc`` (``type`` is the exception's own class name), in a reply or in a stream's
    error event. Errors whose text is the server's to know are answered with a fixed message and the request id
    (:func:`logged_message`), their own text logged under that id: a database that cannot be connected to
    (:data:`DATABASE_UNAVAILABLE_MESSAGE`: its URL and the driver's message), an extraction LLM that gave no answer
    (:data:`EXTRACTION_FAILED_MESSAGE`: its URL and reply), a stored K/V entry that does not match
    its memory (:data:`KV_MISMATCH_MESSAGE`: the file's path on the server and text hashes, a helper's find), the
    server's own setup (:data:`SERVER_SETUP_MESSAGES`: a config error, an unknown schema, a missing model), and an
    InferScale error with no code of its own (an unreadable K/V file, say), answered as an unexpected exception
    (:func:`internal_error_content`)."""
    row = code_of(exc)
    if row.code == "internal_error" and not isinstance(exc, ServerError):
        log.error("request %s: %s", request_id(), exc, exc_info=exc)
        return internal_error_content(exc)
    message = str(exc)
    fixed = next((text for kind, text in _LOGGED_ONLY if isinstance(exc, kind)), None)
    if fixed is not None:
        if isinstance(exc, ExtractionError):  # its reply may quote the conversation: the text stays at WARNING
            log.error("request %s: %s (its reply is at WARNING level)", request_id(), type(exc).__name__)
            log.warning("request %s: %s", request_id(), message)
        else:
            log.error("request %s: %s", request_id(), message)
        message = logged_message(fixed)
    return error_content(row, message, type(exc).__name__)


def internal_error_content(exc: BaseException) -> dict[str, Any]:
    """The body of a 500 for an unexpected exception: names its class and the request id (:func:`logged_message`),
    not its text (which may hold internals). Log the exception with :func:`request_id` where it is caught."""
    message = logged_message(f"internal server error ({type(exc).__name__}); the server log has the details")
    return error_content(ERROR_CODE["internal_error"], message, ServerError.__name__)


def _validation_message(exc: RequestValidationError, content_type: str | None) -> str:
    """The message of a request that failed validation; a body that is not JSON says so, with the parser's reason
    and where it stopped (FastAPI reports it as an error at ``body.<character>`` with the input ``{}``), and a body
    sent without a JSON ``content_type`` (FastAPI leaves it unparsed, so the error read "Input should be a valid
    dictionary" for a well-formed JSON object: ``curl -d`` sends form data, a tester's find) names the header."""
    errors = exc.errors()
    broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if broken is not None:
        reason = str(broken.get("ctx", {}).get("error", "not JSON")).removesuffix(" at")  # json's "...character at"
        at = broken.get("loc", ())[-1:]
        where = f" at character {at[0]}" if at and isinstance(at[0], int) else ""
        return f"invalid request: the body is not valid JSON: {reason}{where}"
    media_type = (content_type or "").partition(";")[0].strip().lower()
    is_json = media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )
    if not is_json and any(tuple(e.get("loc", ()))[:1] == ("body",) for e in errors):
        sent = f"is {content_type!r}" if content_type else "is missing"
        return (
            "invalid request: the body must be a JSON object sent with the header 'Content-Type: application/json' "
            f"(this request's Content-Type {sent})"
        )
    return "invalid request: " + describe_errors(errors, limit=5, show_input=True)


async def _inferscale_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InferScaleError)
    return error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    row = ERROR_CODE["invalid_input"]
    return error_reply(error_content(row, _validation_message(exc, request.headers.get("content-type"))), row)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _BY_STATUS.get(exc.status_code, "invalid_input" if exc.status_code < 500 else "internal_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_reply(error_content(ERROR_CODE[code], message), ERROR_CODE[code], exc.status_code, exc.headers)


SHUT_DOWN_MESSAGE = (
    "the server shut down before answering this request; it may have been applied (a retried add skips what was "
    "stored): make it again once the server is back"
)
"""The message of the 503 ``engine_closed`` a request cancelled by the server's shutdown gets."""


class UnexpectedErrors:
    """ASGI middleware: any exception that no handler took becomes a 500 ``internal_error``, logged once with its
    traceback. (Starlette's own handler for ``Exception`` answers and then re-raises, so the server logs it
    again.) A request cancelled before its reply started (the server's shutdown grace ended) gets a 503
    ``engine_closed`` (:data:`SHUT_DOWN_MESSAGE`), and the cancellation goes on. An exception after the reply has
    started cannot be answered: it is logged and the connection closed.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as exc:  # answered (or, once started, cut short) and logged here
            log.error("request %s: %s %s failed", request_id(), scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                await error_reply(internal_error_content(exc), ERROR_CODE["internal_error"])(scope, receive, send)
        except asyncio.CancelledError:
            # The server cancels the requests still running when its shutdown grace ends: uvicorn answered them with
            # a plain-text 500, which a client cannot tell from a bug; a 503 engine_closed says "try again elsewhere"
            if not started:
                with contextlib.suppress(Exception):  # the connection may be gone already
                    await error_response(EngineClosedError(SHUT_DOWN_MESSAGE))(scope, receive, send)
            raise


class RequestIdMiddleware(CorrelationIdMiddleware):
    """``asgi-correlation-id``'s middleware on :data:`REQUEST_ID_HEADER`, built from the app alone, as vLLM's
    ``--middleware`` builds one: the request ids of both servers (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app, header_name=REQUEST_ID_HEADER)


def install_request_ids(app: FastAPI) -> None:
    """Give every request of ``app`` an id (:data:`REQUEST_ID_HEADER`; see the module docstring). Add it as the
    outermost middleware, so every reply carries it and every error logged names it."""
    app.add_middleware(RequestIdMiddleware)


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers on ``app`` (see the module docstring); add :class:`UnexpectedErrors` as the innermost
    middleware too, and :func:`install_request_ids` as the outermost."""
    app.add_exception_handler(InferScaleError, _inferscale_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
