"""The stable error codes of the InferScale server, one per exception type, shared by the server and the remote
client so that an error raised on one side is raised as the same type on the other.

A reply that is not 2xx carries ``{"error": {"code", "type", "message"}}``; ``code`` and the HTTP status come from
:data:`ERROR_CODES`, and the remote client turns ``code`` back into the exception with :func:`error_from_code`.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferscale.errors import (
    APIKeyNotFoundError,
    AuthenticationError,
    ConfigError,
    ContextLengthError,
    DatabaseUnavailableError,
    EngineClosedError,
    ExtractionError,
    InferScaleError,
    InvalidInputError,
    KVFingerprintMismatchError,
    MemoryNotFoundError,
    MemoryTooLongError,
    MethodNotAllowedError,
    ModelNotAvailableError,
    PermissionDeniedError,
    RateLimitedError,
    RequestTooLargeError,
    RouteNotFoundError,
    SchemaError,
    ScopeError,
    ServerError,
    UnsupportedModelError,
)


@dataclass(frozen=True, slots=True)
class ErrorCode:
    """One row of the table: the wire ``code``, the HTTP ``status`` and the exception type it stands for.

    ``repeats``: the same request gets the same error until the request, the server's files or its setup change.
    Such a reply tells clients not to send it again (``x-should-retry: false``, which the OpenAI SDKs read: they
    otherwise retry a 409 or any 5xx). ``False`` for what may pass on its own: a database or an extraction endpoint
    that is down, a server shutting down, an unexpected exception.
    """

    code: str
    status: int
    error: type[InferScaleError]
    repeats: bool = True


ERROR_CODES: tuple[ErrorCode, ...] = (
    ErrorCode("invalid_input", 400, InvalidInputError),
    ErrorCode("scope_required", 400, ScopeError),
    ErrorCode("context_length_exceeded", 400, ContextLengthError),
    ErrorCode("memory_too_long", 400, MemoryTooLongError),
    ErrorCode("request_too_large", 413, RequestTooLargeError),
    ErrorCode("unauthenticated", 401, AuthenticationError),
    ErrorCode("permission_denied", 403, PermissionDeniedError),
    ErrorCode("memory_not_found", 404, MemoryNotFoundError),
    ErrorCode("api_key_not_found", 404, APIKeyNotFoundError),
    ErrorCode("route_not_found", 404, RouteNotFoundError),
    ErrorCode("method_not_allowed", 405, MethodNotAllowedError),
    ErrorCode("kv_fingerprint_mismatch", 409, KVFingerprintMismatchError),
    ErrorCode("rate_limited", 429, RateLimitedError, repeats=False),
    ErrorCode("extraction_failed", 502, ExtractionError, repeats=False),
    ErrorCode("config_error", 500, ConfigError),
    ErrorCode("schema_error", 500, SchemaError),
    ErrorCode("model_not_available", 503, ModelNotAvailableError),
    ErrorCode("database_unavailable", 503, DatabaseUnavailableError, repeats=False),
    ErrorCode("unsupported_model", 501, UnsupportedModelError),
    ErrorCode("engine_closed", 503, EngineClosedError, repeats=False),
    ErrorCode("internal_error", 500, ServerError, repeats=False),
)
"""Every code the server sends. ``internal_error`` stands for any exception that is not an InferScale error."""

ERROR_CODE: dict[str, ErrorCode] = {row.code: row for row in ERROR_CODES}
"""The rows of :data:`ERROR_CODES` by wire code."""

_INTERNAL = ERROR_CODE["internal_error"]


def code_of(exc: BaseException) -> ErrorCode:
    """The row for ``exc``: that of its most specific InferScale class (``ScopeError`` before ``InvalidInputError``);
    ``internal_error`` for any other exception."""
    for cls in type(exc).__mro__:
        for row in ERROR_CODES:
            if row.error is cls:
                return row
    return _INTERNAL


def error_from_code(code: str, message: str) -> InferScaleError:
    """The exception a reply's ``code`` stands for, with the server's ``message``; an unknown code (a newer server)
    gives :class:`ServerError` naming it."""
    row = ERROR_CODE.get(code)
    if row is None:
        return ServerError(f"{message} (error code {code!r})")
    return row.error(message)
