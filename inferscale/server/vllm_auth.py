"""API keys on ``inferscale serve --engine vllm``: the same keys, store and rules as the transformers server.

:class:`ApiKeyMiddleware` is an ASGI middleware that vLLM's server installs outside the memory middleware
(``--middleware``). With keys in the store (:class:`~inferscale.server.keys.KeyStore`, in the memory database) every
request but ``/health``, the OpenAPI schema and docs, and CORS preflights (``OPTIONS``) must carry
``Authorization: Token <key>`` or ``Bearer <key>`` naming a valid key, else 401 ``unauthenticated`` with the
structured error body, and a route that is not a serving one (vLLM's ``/metrics``, ``/load``, cache resets, sleep,
profiling, weight updates: :func:`needs_admin`) needs an admin key (403 ``permission_denied`` otherwise: they act
on or report about every tenant), as the transformers server's ``/metrics`` does; with no key the server is open
(and :func:`inferscale.server.run.check_listen_address` kept it on loopback), and a request whose ``Host`` or
``Origin`` is not a loopback one is refused with 403 ``permission_denied``, as on the transformers server
(:mod:`inferscale.server.local_only`: web pages and DNS rebinding). The decision is
:func:`inferscale.server.auth.caller_for`, the one the transformers server uses; the request's
:class:`~inferscale.server.auth.Caller` is left in the ASGI scope under :data:`CALLER` for the memory middleware, which
picks a chat's user with :meth:`~inferscale.server.auth.Caller.chat_user`.

The memory middleware calls the server's own ``/v1/completions`` with the memory K/V (``kv_transfer_params``) and
its ``cache_salt``. Those internal requests carry a random per-process token (:meth:`KeyGate.internal_headers`) and
need no key; a client's request may not set ``kv_transfer_params`` or a ``cache_salt`` in InferScale's own format
(:func:`checked_client_body`), so no caller can point the connector at stored K/V or reuse a tenant's cache salt.
Every client body that parses as a JSON object is checked, whatever its ``Content-Type`` says: FastAPI reads a body
as JSON with no content type, ``application/json`` and any ``application/*+json`` (a made-up
``application/x-www-form-urlencoded+json`` too), so a check that trusted the header would let such a body through.

This module does not import vLLM.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from inferscale.errors import (
    AuthenticationError,
    InferScaleError,
    InvalidInputError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
)
from inferscale.json_text import JSONDuplicateKeyError, JSONTooDeepError, loads_json
from inferscale.server.auth import caller_for
from inferscale.server.errors import error_response
from inferscale.server.keys import KeyStore
from inferscale.server.local_only import cross_site_reason, is_open

OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Paths answered without a key."""

INTERNAL_HEADER = "x-inferscale-internal"
"""The header of the memory middleware's own requests to the server."""

CALLER = "inferscale.caller"
"""The ASGI scope key holding the request's :class:`~inferscale.server.auth.Caller` (absent on open paths and
internal requests)."""

INTERNAL = "inferscale.internal"
"""The ASGI scope key set to ``True`` on the memory middleware's own requests."""


def needs_key(method: str, path: str) -> bool:
    """Whether a request needs an API key (when the store has keys): all but ``OPTIONS`` and :data:`OPEN_PATHS`.

    Args:
        method: the HTTP method (``"GET"``, ...); ``""`` for a websocket.
        path: the path without the server's root path.
    """
    return method != "OPTIONS" and path not in OPEN_PATHS


SERVING_PATHS = frozenset(
    {"/tokenize", "/detokenize", "/tokenizer_info", "/version", "/ping", "/invocations", "/classify", "/score"}
    | {"/rerank", "/pooling"}
)
"""vLLM's serving routes outside ``/v1/`` and ``/v2/``, which a key bound to scopes may call."""

ADMIN_API_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
"""Routes under ``/v1/`` that change the server for every tenant (an admin key's)."""


def needs_admin(path: str) -> bool:
    """Whether a request needs an admin key: everything but the serving routes (the OpenAI-style API under ``/v1/``
    and ``/v2/``, but loading or unloading a LoRA adapter, and :data:`SERVING_PATHS`). vLLM's operational routes
    act on or report about every tenant: ``/metrics`` (vLLM mounts its Prometheus app for every path that starts
    with it, ``/metricsx`` too), ``/load``, ``/server_info``, cache resets, ``/pause``, ``/sleep``, profiling,
    weight updates, ``/abort_requests``, ``/collective_rpc``; a route a later vLLM adds is an admin's until it is
    listed here.

    Args:
        path: the path without the server's root path.
    """
    if path in SERVING_PATHS:
        return False
    if path.startswith(("/v1/", "/v2/")):
        return path.startswith(ADMIN_API_PATHS)
    return True


@dataclass(frozen=True, slots=True)
class KeyGate:
    """The key store one vLLM server process checks, and the token of its internal requests.

    Attributes:
        keys: the API keys; ``None`` runs the server open.
        internal_token: a random secret of this process (``secrets.token_urlsafe(32)``), sent by the memory
            middleware to the server itself and never to a client.
    """

    keys: KeyStore | None
    internal_token: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    def internal_headers(self) -> dict[str, str]:
        """The headers that mark a request as the memory middleware's own."""
        return {INTERNAL_HEADER: self.internal_token}

    def is_internal(self, header: str | None) -> bool:
        """Whether ``header`` (the :data:`INTERNAL_HEADER` value, or ``None``) is this process's token (compared in
        constant time)."""
        return header is not None and hmac.compare_digest(header.encode(), self.internal_token.encode())


_GATE: KeyGate | None = None


def install_gate(keys: KeyStore | None) -> KeyGate:
    """Set the :class:`KeyGate` the middlewares of this process use (vLLM builds :class:`ApiKeyMiddleware` from its
    import path, without arguments); returns it."""
    global _GATE
    _GATE = KeyGate(keys)
    return _GATE


def installed_gate() -> KeyGate | None:
    """The gate :func:`install_gate` set, or ``None``."""
    return _GATE


def check_client_fields(body: Mapping[str, Any], reserved_salt_prefixes: Sequence[str]) -> None:
    """Refuse a client's JSON request body that sets what only the memory middleware may set.

    Args:
        body: the request's JSON object.
        reserved_salt_prefixes: the starts of InferScale's ``cache_salt`` values (e.g. ``("is1.", "isp.")``).

    Raises:
        PermissionDeniedError: for a ``kv_transfer_params`` that is not ``null``, or a string ``cache_salt`` that
            starts with a reserved prefix.
    """
    if body.get("kv_transfer_params") is not None:
        raise PermissionDeniedError(
            "kv_transfer_params is set by the InferScale memory middleware only; send the chat with OpenAI's `user` "
            "(or a key bound to one user) to get memories"
        )
    salt = body.get("cache_salt")
    if isinstance(salt, str) and salt.startswith(tuple(reserved_salt_prefixes)):
        raise PermissionDeniedError(
            f"cache_salt {salt[:12]!r}... has the form of InferScale's memory salts, which only the server sets; "
            f"use another salt, or none"
        )


async def checked_client_body(request: Request, reserved_salt_prefixes: Sequence[str]) -> dict[str, Any] | None:
    """The JSON object a client's request body holds, checked by :func:`check_client_fields`; ``None`` for an empty
    body, or one that is not a JSON object (a form, a file, a JSON list).

    The body is parsed whatever the request's method and ``Content-Type``: the route behind may read it as JSON
    under any of them (FastAPI does for no content type and every ``application/json`` or ``application/*+json``).

    Raises:
        PermissionDeniedError: for a JSON object that sets what only the memory middleware may set.
        InvalidInputError: for JSON nested deeper than Python's parser reads: no field of it could be checked, so it
            does not reach the route (whose parser could read it, at a shallower stack); and for an object naming a
            key twice, which this check and the route, or a proxy before them, could read differently.
    """
    raw = await request.body()
    if not raw:
        return None
    try:
        body = loads_json(raw, unique_keys=True)
    except (JSONTooDeepError, JSONDuplicateKeyError) as exc:
        raise InvalidInputError(f"the request body is not JSON the server reads: {exc.msg}") from None
    except ValueError:  # not JSON (UnicodeDecodeError is a ValueError too): no route reads it as JSON either
        return None
    if not isinstance(body, dict):
        return None
    check_client_fields(body, reserved_salt_prefixes)
    return body


class ApiKeyMiddleware:
    """ASGI middleware: authenticates every HTTP and websocket request of the vLLM server with the installed
    :class:`KeyGate` (see the module docstring). A refused HTTP request gets 401 ``unauthenticated`` (403
    ``permission_denied`` for a route that is not a serving one with a key that is not an admin's, 429
    ``rate_limited`` for a key not verified before while too many key checks failed lately); a refused
    websocket is closed before it is accepted (code 1008). Without an installed gate every request is answered
    500 ``internal_error``: the server never runs open by mistake.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        gate = _GATE
        if gate is None:
            message = "the API key middleware has no key store: `inferscale serve --engine vllm` installs one"
            await self._refuse(ServerError(message), scope, receive, send)
            return
        headers = Headers(scope=scope)
        if gate.is_internal(headers.get(INTERNAL_HEADER)):
            scope[INTERNAL] = True
            await self.app(scope, receive, send)
            return
        reason = cross_site_reason(headers)
        if reason is not None and await anyio.to_thread.run_sync(is_open, gate.keys):
            await self._refuse(PermissionDeniedError(reason), scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if needs_key(scope.get("method", ""), path):
            try:
                caller = await anyio.to_thread.run_sync(caller_for, gate.keys, headers.getlist("authorization"))
                if needs_admin(path):
                    caller.require_admin(f"{path} (it acts on or reports about every tenant)")
            except (AuthenticationError, PermissionDeniedError, RateLimitedError) as exc:
                await self._refuse(exc, scope, receive, send)
                return
            scope[CALLER] = caller
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(exc: InferScaleError, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": str(exc)[:120]})
            return
        await error_response(exc)(scope, receive, send)
