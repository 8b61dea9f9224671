"""Typed errors raised by InferScale.

Every error names the bad value and, where there is one, the fix. Nothing already stored is lost when one is
raised: validation happens before any write.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class InferScaleError(Exception):
    """Base class of every error InferScale raises on purpose."""


class InvalidInputError(InferScaleError, ValueError):
    """An argument has the wrong type, shape or value (for example a message without ``content``)."""


class ScopeError(InvalidInputError):
    """A call that reads or writes memories was given no ``user_id``, ``agent_id`` or ``run_id``."""


class MemoryTooLongError(InvalidInputError):
    """A text is too long to be one memory: more characters than ``max_memory_chars`` (``add(infer=False)``'s
    messages, ``update``'s new text), or more tokens than the model's context holds after the system prefix. The
    server answers it with code ``memory_too_long``. The framework packages' write-back leaves such a message out
    (:mod:`inferscale.write_back`)."""


class ContextLengthError(InvalidInputError):
    """A chat's prompt (system prefix, memories, conversation) and answer budget do not fit the model's context
    window. The message names each part's size in tokens and what would make it fit: fewer memories (only when the
    prompt holds some), a shorter conversation, or a lower answer budget, under the caller's name for it (its last
    word: :func:`budget_named`). The server answers it with code ``context_length_exceeded``, as OpenAI does."""

    _LOWER = " or lower "

    @classmethod
    def of(cls, reason: str, memory_tokens: int, budget: str = "max_new_tokens") -> ContextLengthError:
        """The error for a prompt that does not fit: ``reason`` gives the sizes (tokens), ``memory_tokens`` the
        memories' share, and the advice names ``budget``."""
        fewer = "retrieve fewer memories (limit), " if memory_tokens else ""
        return cls(f"{reason}; {fewer}send a shorter conversation{cls._LOWER}{budget}")

    def for_budget(self, budget: str) -> ContextLengthError:
        """This error advising to lower ``budget`` (``max_tokens`` in an OpenAI request) instead of the name it ends
        with; itself when its message gives no advice (one built otherwise than by :meth:`of`)."""
        advice, lower, _ = str(self).rpartition(self._LOWER)
        return type(self)(f"{advice}{lower}{budget}") if lower else self


@contextlib.contextmanager
def budget_named(budget: str) -> Iterator[None]:
    """Within the block, a :class:`ContextLengthError` advises lowering ``budget``, the caller's name for the answer
    budget: the OpenAI routes' request field (``max_tokens``), the remote client's argument (``max_new_tokens``,
    where the wire's field is ``max_tokens``). Every other exception passes unchanged."""
    try:
        yield
    except ContextLengthError as exc:
        raise exc.for_budget(budget).with_traceback(exc.__traceback__) from None  # where the prompt was refused


class MemoryNotFoundError(InferScaleError, KeyError, ValueError):
    """No memory has the given id (or it belongs to another scope). A ``KeyError``, and a ``ValueError`` as Mem0's
    ``update`` and ``delete`` raise for an unknown id, so a migrated ``except ValueError`` still catches it."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else "memory not found"


class APIKeyNotFoundError(InferScaleError, KeyError):
    """No API key of the server's key store has the given id (``inferscale keys revoke``)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else "API key not found"


class ConfigError(InferScaleError, ValueError):
    """The configuration names something that cannot be loaded (a missing model folder, a bad URL)."""


class SchemaError(ConfigError):
    """The database's schema is not one this InferScale can use: it is at a revision this version does not know
    (a newer InferScale wrote it), or it holds InferScale's tables from before the schema was versioned that differ
    from the first versioned schema. Raised on a store's first use, before anything is changed; and by any call
    once its tables are gone (the database was dropped and made again under the running process)."""


class DatabaseUnavailableError(InferScaleError, ConnectionError):
    """The memory database cannot be used now: it could not be connected to (its server refused or did not answer,
    or the URL names a database, role or password it does not accept), the connection was lost during the call, a
    SQLite file stayed locked by another writer past the busy timeout or is on a full or read-only disk, or a
    PostgreSQL lock stayed held by another transaction past the lock timeout. The call's
    transaction did not commit (unless a connection was lost during the commit itself); the call can be made again
    once the database is usable."""


class ModelNotAvailableError(ConfigError):
    """A default model package is not installed, or a configured model path does not exist."""


class UnsupportedModelError(InferScaleError, NotImplementedError):
    """The model's architecture or rotary embedding cannot be handled exactly (for example dynamic NTK RoPE)."""


class EngineClosedError(InferScaleError, RuntimeError):
    """The engine was closed (``close()`` of the client or engine) while a streamed answer was still being read."""


class KVFingerprintMismatchError(InferScaleError):
    """A stored KV entry was built by another model, dtype, rope configuration or tokenizer."""


class ExtractionError(InferScaleError):
    """The LLM backend gave no answer (unreachable, an HTTP error status, no text content), or a low-level parser
    (``parse_facts``, ``parse_decisions``) found nothing usable. ``add(infer=True)`` raises it only for the first:
    a malformed answer is repaired or falls back (:mod:`inferscale.memory.answers`)."""


class RequestTooLargeError(InvalidInputError):
    """A request to the InferScale server was larger than its limit (``ServerOptions.max_request_bytes``)."""


class RouteNotFoundError(InvalidInputError):
    """A request to the InferScale server named a path it does not serve (HTTP 404, code ``route_not_found``)."""


class MethodNotAllowedError(InvalidInputError):
    """A request to the InferScale server used a method its path does not answer (HTTP 405, code
    ``method_not_allowed``)."""


class AuthenticationError(InferScaleError):
    """The InferScale server was called with no API key, an unknown one or a revoked one."""


class RateLimitedError(InferScaleError):
    """The InferScale server refused the request for now (HTTP 429, code ``rate_limited``, with a ``Retry-After``
    header): too many API key checks failed lately, and this request's key is not one the server has verified before
    (``ServeSettings.failed_key_checks_per_s`` and ``failed_key_check_burst``). The same request may pass later.

    Attributes:
        retry_after_s: when to try again (whole seconds, at least 1); a remote client's error takes it from the
            reply's ``Retry-After`` header (rounded up), or holds the default, 1, when the reply had none it could
            read. The remote clients send the request again themselves first, unless the wait is over 60 s
            (:mod:`inferscale.remote.retry`).
    """

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermissionDeniedError(InferScaleError):
    """The API key is valid but may not make this call (an admin-only route, or a scope outside the key's)."""


class ServerError(InferScaleError):
    """The InferScale server failed (a 5xx reply), or could not be reached after the client's retries."""
