"""Mem0-shaped memory routes: each calls one public method of the async memory client and answers with its result.

Scoped calls pass their ids through :meth:`Caller.scope` (checked against, and completed by, the API key);
id-addressed calls check the ids they name with :meth:`Caller.named`. A key bound to scope lists first reads the
memory and answers 404 when it lies outside its scopes or no longer exists; its ``history``, which outlives the
memory, is read when the scope the rows give lies in the key's lists (404 otherwise, which the remote client reads
as ``[]``, the local client's answer when scope ids are named). An open server and a key that binds no list (an
admin key) leave every answer to the client, exactly as the local client gives it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from inferscale.arguments import check_version
from inferscale.errors import ScopeError
from inferscale.memory_ids import RESERVED_MEMORY_IDS
from inferscale.scope import ScopeIds
from inferscale.server.auth import Caller, CurrentCaller
from inferscale.server.errors import ERROR_RESPONSES
from inferscale.server.routes import route
from inferscale.server.schemas import AddBody, GetAllBody, SearchBody, UpdateBody
from inferscale.server.state import ServerState, State
from inferscale.server.strict_json import StrictJSONRoute

router = APIRouter(tags=["memories"], responses=ERROR_RESPONSES, route_class=StrictJSONRoute)


async def _memory_id(memory_id: str) -> str:
    """The ``{memory_id}`` path parameter. ``GET /v1/memories/search/`` would otherwise ask for the memory "search"
    and be told there is none: a method ``/v1/memories/search/`` does not answer is 405, as on any other route.

    Raises:
        HTTPException: 405 (``method_not_allowed``) for a reserved word.
    """
    if memory_id in RESERVED_MEMORY_IDS:
        raise HTTPException(405, "Method Not Allowed", headers={"Allow": "POST"})
    return memory_id


MemoryId = Annotated[str, Depends(_memory_id)]
"""The ``{memory_id}`` path parameter of the id-addressed routes (not a reserved word)."""

UserId = Annotated[str | None, Query()]
AgentId = Annotated[str | None, Query()]
RunId = Annotated[str | None, Query()]


async def _query_scope(
    caller: CurrentCaller, user_id: UserId = None, agent_id: AgentId = None, run_id: RunId = None
) -> ScopeIds:
    return caller.scope(user_id, agent_id, run_id)


async def _named_scope(
    caller: CurrentCaller, user_id: UserId = None, agent_id: AgentId = None, run_id: RunId = None
) -> ScopeIds:
    return caller.named(user_id, agent_id, run_id)


QueryScope = Annotated[ScopeIds, Depends(_query_scope)]
"""The query's ``user_id``, ``agent_id``, ``run_id`` of a scoped call, checked and completed by
:meth:`Caller.scope`."""

NamedScope = Annotated[ScopeIds, Depends(_named_scope)]
"""The query's ``user_id``, ``agent_id``, ``run_id`` of an id-addressed call, checked by :meth:`Caller.named`."""


@route(router, "POST", "/v1/memories/")
async def add(body: AddBody, caller: CurrentCaller, server: State) -> dict[str, Any]:
    """Remember a conversation (``MemoryClient.add``)."""
    check_version(body.version)
    ids = caller.scope(body.user_id, body.agent_id, body.run_id)
    return await server.client.add(
        body.messages,
        **ids,
        metadata=body.metadata,
        infer=body.infer,
        prompt=body.prompt,
        encode_kv=body.encode_kv,
        timestamp=body.timestamp,
        expiration_date=body.expiration_date,
        output_format=body.output_format,
    )


async def _search(body: SearchBody, caller: Caller, server: ServerState) -> dict[str, Any]:
    ids = caller.scope(body.user_id, body.agent_id, body.run_id, body.filters)
    return await server.client.search(
        body.query,
        **ids,
        filters=body.filters,
        limit=body.limit,
        top_k=body.top_k,
        threshold=body.threshold,
        version=body.version,
        output_format=body.output_format,
        rerank=body.rerank,
        explain=body.explain,
        reference_date=body.reference_date,
        show_expired=body.show_expired,
    )


@route(router, "POST", "/v1/memories/search/")
async def search(body: SearchBody, caller: CurrentCaller, server: State) -> dict[str, Any]:
    """The memories most similar to ``query`` (``MemoryClient.search``, Mem0 v1 call shape)."""
    return await _search(body, caller, server)


@route(router, "POST", "/v2/memories/search/")
async def search_v2(body: SearchBody, caller: CurrentCaller, server: State) -> dict[str, Any]:
    """The memories most similar to ``query`` (``MemoryClient.search``, Mem0 v2 call shape: ``filters``)."""
    return await _search(body, caller, server)


@route(router, "GET", "/v1/memories/")
async def get_all(
    ids: QueryScope,
    server: State,
    limit: Annotated[int | None, Query()] = None,
    top_k: Annotated[int | None, Query()] = None,
) -> dict[str, Any]:
    """The scope's memories, oldest first (``MemoryClient.get_all``, Mem0 v1 call shape)."""
    return await server.client.get_all(**ids, limit=limit, top_k=top_k)


@route(router, "POST", "/v2/memories/")
async def get_all_v2(body: GetAllBody, caller: CurrentCaller, server: State) -> dict[str, Any]:
    """The scope's memories matching ``filters``, oldest first (``MemoryClient.get_all``, Mem0 v2 call shape)."""
    ids = caller.scope(body.user_id, body.agent_id, body.run_id, body.filters)
    return await server.client.get_all(
        **ids,
        filters=body.filters,
        limit=body.limit,
        top_k=body.top_k,
        version=body.version,
        output_format=body.output_format,
        show_expired=body.show_expired,
    )


@route(router, "DELETE", "/v1/memories/")
async def delete_all(
    caller: CurrentCaller, server: State, user_id: UserId = None, agent_id: AgentId = None, run_id: RunId = None
) -> dict[str, Any]:
    """Delete every memory of a scope (``MemoryClient.delete_all``). The request must name the scope: a key's bound
    id is never filled in here, so a request naming none (or a misspelt one) never empties the key's whole scope.

    Raises:
        ScopeError: when the query names no ``user_id``, ``agent_id`` or ``run_id`` (400 ``scope_required``, as the
            client raises).
    """
    if user_id is None and agent_id is None and run_id is None:
        raise ScopeError(
            "delete_all needs a user_id, agent_id or run_id in the query; it never means every memory of the API "
            "key's scope (name it) or of the store (that is reset)"
        )
    return await server.client.delete_all(**caller.scope(user_id, agent_id, run_id))


async def _visible(memory_id: str, caller: Caller, server: ServerState) -> None:
    """For a key bound to scope lists, refuse (404) a memory outside its scopes, or gone; a caller that may touch
    every scope (open server, admin key) leaves the answer to the client."""
    if not caller.unbound:
        caller.require_visible(memory_id, await server.client.get(memory_id))


@route(router, "GET", "/v1/memories/{memory_id}/")
async def get(
    memory_id: MemoryId,
    ids: NamedScope,
    caller: CurrentCaller,
    server: State,
) -> dict[str, Any]:
    """One memory by id (``MemoryClient.get``); 404 ``memory_not_found`` where the client gives ``None``."""
    found = await server.client.get(memory_id, **ids)
    caller.require_visible(memory_id, found)
    assert found is not None
    return found


@route(router, "PUT", "/v1/memories/{memory_id}/")
async def update(
    memory_id: MemoryId,
    body: UpdateBody,
    ids: NamedScope,
    caller: CurrentCaller,
    server: State,
) -> dict[str, Any]:
    """Change a memory's text and/or metadata (``MemoryClient.update``)."""
    await _visible(memory_id, caller, server)
    expiration_date = body.expiration_date  # refused by the client unless null (memories do not expire)
    return await server.client.update(
        memory_id, body.text, body.metadata, data=body.data, expiration_date=expiration_date, **ids
    )


@route(router, "DELETE", "/v1/memories/{memory_id}/")
async def delete(
    memory_id: MemoryId,
    ids: NamedScope,
    caller: CurrentCaller,
    server: State,
) -> dict[str, Any]:
    """Delete one memory, its vector and its K/V (``MemoryClient.delete``)."""
    await _visible(memory_id, caller, server)
    return await server.client.delete(memory_id, **ids)


@route(router, "GET", "/v1/memories/{memory_id}/history/")
async def history(
    memory_id: MemoryId,
    ids: NamedScope,
    caller: CurrentCaller,
    server: State,
) -> list[dict[str, Any]]:
    """Every change to a memory, oldest first, also after it was deleted (``MemoryClient.history``). A key bound to
    scope lists reads it when the memory's recorded scope lies in them (404 otherwise, as for an unknown id)."""
    found = await server.client.history(memory_id, **ids)
    if not caller.unbound:
        caller.require_history_visible(memory_id, found)
    return found


@route(router, "POST", "/v1/reset/")
async def reset(caller: CurrentCaller, server: State) -> dict[str, str]:
    """Delete every memory, history row, vector and stored K/V (``MemoryClient.reset``); admin keys only."""
    caller.require_admin("reset")
    await server.client.reset()
    return {"message": "Reset successful."}
