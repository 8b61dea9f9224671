"""Who is calling, and which scopes the call may touch.

:func:`caller_for` decides who is calling, as a plain function shared by both servers: with no key in the store (or
no store) the server is open and every call is allowed; otherwise the ``Authorization: Token <key>`` (Mem0's client)
or ``Bearer <key>`` (OpenAI's) header must name a valid key, else 401 ``unauthenticated`` (429 ``rate_limited`` for
a key not verified before while too many key checks failed lately: :mod:`inferscale.server.key_checks`).
:func:`current_caller` is its FastAPI dependency (the transformers server); :mod:`inferscale.server.vllm_auth` calls
it from an ASGI middleware (the vLLM server).

:class:`Caller` applies a key's scope rules:

- a call's scope ids must each lie in the key's lists (403 ``permission_denied``); when the call names no id of a
  kind the key binds to exactly one value, that value is used; when it binds several, the call must name one;
- Mem0 v2 ``filters`` count: the scope is resolved from the keyword ids and the ids ``filters`` pins, exactly as the
  client resolves it (:func:`inferscale.arguments.resolve_scope`), and that resolved scope is checked. Conditions
  under ``OR``/``NOT`` pin nothing, so they only narrow the checked scope further;
- a memory addressed by id that lies outside the key's scopes is reported as not found (404, never 403, so its
  existence does not leak);
- ``reset`` needs an admin key (403);
- a chat that can name only OpenAI's ``user`` (the vLLM server) gets memories by :meth:`Caller.chat_user`: the same
  user rules, and refused (403) for a key bound to agent or run ids, whose scopes such a chat cannot keep to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader
from starlette.concurrency import run_in_threadpool

from inferscale.arguments import resolve_scope
from inferscale.errors import AuthenticationError, MemoryNotFoundError, PermissionDeniedError
from inferscale.filters import parse_filters, required_ids
from inferscale.scope import SCOPE_KEYS, ScopeIds
from inferscale.server.keys import ApiKey, KeyStore
from inferscale.server.state import ServerState, server_state

_AUTHORIZATION = APIKeyHeader(
    name="Authorization",
    auto_error=False,
    description="`Token <key>` or `Bearer <key>`; not needed while the server has no API keys",
)


@dataclass(frozen=True, slots=True)
class Caller:
    """The caller of one request.

    Attributes:
        key: its API key; ``None`` when the server is open (no keys), where every call is allowed.
    """

    key: ApiKey | None

    @property
    def admin(self) -> bool:
        """Whether the caller may reset the store: an open server, or an admin key that binds no list (the store
        refuses to create an admin key with lists; a row holding one anyway is not trusted with every tenant)."""
        return self.key is None or (self.key.admin and self.unbound)

    @property
    def unbound(self) -> bool:
        """Whether the caller may touch every scope: an open server, or a key that binds no list (an admin key)."""
        return self.key is None or all(self.key.bound(field) is None for field in SCOPE_KEYS)

    def require_admin(self, action: str) -> None:
        """Raises:
        PermissionDeniedError: unless the caller is an admin."""
        if not self.admin:
            raise PermissionDeniedError(f"{action} needs an admin API key")

    def scope(
        self,
        user_id: str | None,
        agent_id: str | None,
        run_id: str | None,
        filters: Mapping[str, Any] | None = None,
    ) -> ScopeIds:
        """The scope ids a scoped call (add, search, get_all, delete_all, chat) passes to the client: as given on an
        open server; with a key, checked and completed by the key's lists (see the module docstring).

        Raises:
            PermissionDeniedError: when a named or resolved id lies outside the key's lists, or the key binds
                several ids of a kind and the call names none.
            InvalidInputError, ScopeError: for malformed ``filters`` or ids that disagree, as the client raises.
        """
        given = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
        if self.key is None:
            return ScopeIds(user_id=user_id, agent_id=agent_id, run_id=run_id)
        pinned = required_ids(parse_filters(filters))
        for field in SCOPE_KEYS:
            bound = self.key.bound(field)
            if bound is None:
                continue
            named = [v for v in (given[field], pinned.get(field)) if v is not None]
            if not named and len(bound) == 1:
                given[field] = bound[0]
            elif not named:
                raise PermissionDeniedError(f"this API key may touch {field} {list(bound)}; name one of them")
            for value in named:
                self._check(field, value)
        ids = ScopeIds(user_id=given["user_id"], agent_id=given["agent_id"], run_id=given["run_id"])
        scope, _ = resolve_scope(ids["user_id"], ids["agent_id"], ids["run_id"], filters)
        for field in SCOPE_KEYS:  # the scope the client will use, whatever shape the filters had
            if self.key.bound(field) is not None:
                self._check(field, getattr(scope, field))
        return ids

    def named(self, user_id: str | None, agent_id: str | None, run_id: str | None) -> ScopeIds:
        """The scope ids an id-addressed call (get, update, delete, history) names, each checked against the key
        (none are added: the memory itself is checked with :meth:`require_visible`).

        Raises:
            PermissionDeniedError: when a named id lies outside the key's lists.
        """
        if self.key is not None:
            for field, value in zip(SCOPE_KEYS, (user_id, agent_id, run_id), strict=True):
                if value is not None:
                    self._check(field, value)
        return ScopeIds(user_id=user_id, agent_id=agent_id, run_id=run_id)

    def can_see(self, memory: Mapping[str, Any]) -> bool:
        """Whether every scope id of ``memory`` (a Mem0 memory dict) lies in the key's lists."""
        if self.key is None:
            return True
        return all((bound := self.key.bound(field)) is None or memory.get(field) in bound for field in SCOPE_KEYS)

    def require_visible(self, memory_id: str, memory: Mapping[str, Any] | None) -> None:
        """Raises:
        MemoryNotFoundError: when ``memory`` is ``None`` or outside the key's scopes (the same reply either way).
        """
        if memory is None or not self.can_see(memory):
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")

    def require_history_visible(self, memory_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Raises:
        MemoryNotFoundError: when ``rows`` (a memory's history dicts, which carry its scope ids) are empty, or one
            lies outside the key's scopes; a row whose memory's scope is unknown lies outside every bound list.
        """
        if not rows or not all(self.can_see(row) for row in rows):
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")

    def chat_user(self, user: str | None) -> str | None:
        """The user whose memories answer a chat that can name only OpenAI's ``user`` (no agent or run id, no
        filters: the vLLM server's chat), or ``None`` for a chat without memory.

        On an open server: ``user`` as given. With a key: a ``user`` must lie in the key's ``user_ids``; a chat that
        names none gets the key's one user when it binds exactly one, else no memory (the chat goes to the model as
        sent). Memories are then selected by user alone, across agents and runs, so a key bound to ``agent_ids`` or
        ``run_ids`` cannot have any.

        Args:
            user: OpenAI's ``user`` field, a non-blank string, or ``None`` when the request names none.

        Raises:
            PermissionDeniedError: when ``user`` lies outside the key's ``user_ids``, or the chat would get memories
                and the key binds ``agent_ids`` or ``run_ids``.
        """
        if self.key is None:
            return user
        users = self.key.bound("user_id")
        if user is None:
            if users is None or len(users) != 1:
                return None
            user = users[0]
        self._check("user_id", user)
        narrowed = [f"{field}s" for field in SCOPE_KEYS if field != "user_id" and self.key.bound(field) is not None]
        if narrowed:
            raise PermissionDeniedError(
                f"this API key is bound to {' and '.join(narrowed)}, but a chat on this server selects memories by "
                f"OpenAI's `user` alone (across agents and runs), so it cannot keep to them: use a key bound to "
                f"user_ids only, or the transformers server (`inferscale serve`), whose chats take "
                f"`inferscale.agent_id` / `run_id`"
            )
        return user

    def _check(self, field: str, value: Any) -> None:
        assert self.key is not None
        bound = self.key.bound(field)
        if bound is not None and value not in bound:
            raise PermissionDeniedError(
                f"this API key may not touch {field}={value!r}; it is bound to {field} {list(bound)}"
            )


def header_key(header: str | None) -> str | None:
    """The key in an ``Authorization`` header value (``Token <key>`` or ``Bearer <key>``, scheme in any case), or
    ``None`` for no header, another scheme or an empty key."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() in ("token", "bearer") else None


def caller_for(keys: KeyStore | None, authorization_headers: list[str]) -> Caller:
    """The caller of a request with these ``Authorization`` header values (one per header line; usually none or
    one): an open caller (``Caller(None)``) when ``keys`` is ``None`` or holds no key, else the caller of the valid key
    the one header names. Blocking (reads the key store; scrypt on a key's first use in this process, one at a time:
    :meth:`KeyStore.authenticate`): call it in a worker thread from async code.

    Raises:
        AuthenticationError: when the store has keys and the request has no header, names no key, an unknown one or
            a revoked one, or has more than one header (which one a proxy or the client meant is unknown: the first
            one was taken, a tester's find).
        RateLimitedError: for a key not verified before while the store's budget of failed key checks is spent.
    """
    if keys is None or not keys.has_keys():
        return Caller(None)
    if len(authorization_headers) > 1:
        raise AuthenticationError(
            f"this request has {len(authorization_headers)} Authorization headers: send one, "
            "'Authorization: Token <key>'"
        )
    token = header_key(authorization_headers[0] if authorization_headers else None)
    if token is None:
        raise AuthenticationError(
            "this server needs an API key: send the header 'Authorization: Token <key>' (or 'Bearer <key>')"
        )
    key = keys.authenticate(token)
    if key is None:
        raise AuthenticationError("the API key is unknown or revoked; create one with `inferscale keys create`")
    return Caller(key)


async def current_caller(request: Request, declared: Annotated[str | None, Depends(_AUTHORIZATION)]) -> Caller:
    """FastAPI dependency: the request's :class:`Caller` (:func:`caller_for` on the app's key store and every
    ``Authorization`` header of the request; ``declared``, the first one, is there for the OpenAPI schema's security
    scheme).

    Raises:
        AuthenticationError, RateLimitedError: see :func:`caller_for`.
    """
    state: ServerState = server_state(request)
    return await run_in_threadpool(caller_for, state.keys, request.headers.getlist("authorization"))


CurrentCaller = Annotated[Caller, Depends(current_caller)]
"""A route parameter holding the request's :class:`Caller`."""
