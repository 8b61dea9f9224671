"""Mem0-shaped memory routes: each calls one public method of the async memory client and answers with its result.

Scoped calls pass their ids through :meth:`Caller.scope` (checked against, and completed by, the API key);
id-addressed calls on a keyed server first read the memory and answer 404 when it lies outside the key's scopes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from inferscale.arguments import check_version
from inferscale.server.auth import Caller, CurrentCaller
from inferscale.server.errors import ERROR_RESPONSES
from inferscale.server.routes import route
from inferscale.server.schemas import AddBody, GetAllBody, SearchBody, UpdateBody
from inferscale.server.state import ServerState, State

router = APIRouter(tags=["memories"], responses=ERROR_RESPONSES)

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such memory in the caller's scopes"}}

UserId = Annotated[str | None, Query()]
AgentId = Annotated[str | None, Query()]
RunId = Annotated[str | None, Query()]


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
    caller: CurrentCaller,
    server: State,
    user_id: UserId = None,
    agent_id: AgentId = None,
    run_id: RunId = None,
    limit: Annotated[int | None, Query()] = None,
    top_k: Annotated[int | None, Query()] = None,
) -> dict[str, Any]:
    """The scope's memories, oldest first (``MemoryClient.get_all``, Mem0 v1 call shape)."""
    ids = caller.scope(user_id, agent_id, run_id)
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
    )


@route(router, "DELETE", "/v1/memories/")
async def delete_all(
    caller: CurrentCaller, server: State, user_id: UserId = None, agent_id: AgentId = None, run_id: RunId = None
) -> dict[str, Any]:
    """Delete every memory of a scope (``MemoryClient.delete_all``)."""
    return await server.client.delete_all(**caller.scope(user_id, agent_id, run_id))


async def _visible(memory_id: str, caller: Caller, server: ServerState) -> None:
    """On a keyed server, refuse (404) a memory outside the caller's scopes; an open server leaves it to the
    client."""
    if caller.key is not None:
        caller.require_visible(memory_id, await server.client.get(memory_id))


@route(router, "GET", "/v1/memories/{memory_id}/", responses=_NOT_FOUND)
async def get(
    memory_id: str,
    caller: CurrentCaller,
    server: State,
    user_id: UserId = None,
    agent_id: AgentId = None,
    run_id: RunId = None,
) -> dict[str, Any]:
    """One memory by id (``MemoryClient.get``); 404 ``memory_not_found`` where the client gives ``None``."""
    ids = caller.named(user_id, agent_id, run_id)
    found = await server.client.get(memory_id, **ids)
    caller.require_visible(memory_id, found)
    assert found is not None
    return found


@route(router, "PUT", "/v1/memories/{memory_id}/", responses=_NOT_FOUND)
async def update(
    memory_id: str,
    body: UpdateBody,
    caller: CurrentCaller,
    server: State,
    user_id: UserId = None,
    agent_id: AgentId = None,
    run_id: RunId = None,
) -> dict[str, Any]:
    """Change a memory's text and/or metadata (``MemoryClient.update``)."""
    ids = caller.named(user_id, agent_id, run_id)
    await _visible(memory_id, caller, server)
    return await server.client.update(memory_id, body.text, body.metadata, data=body.data, **ids)


@route(router, "DELETE", "/v1/memories/{memory_id}/", responses=_NOT_FOUND)
async def delete(
    memory_id: str,
    caller: CurrentCaller,
    server: State,
    user_id: UserId = None,
    agent_id: AgentId = None,
    run_id: RunId = None,
) -> dict[str, Any]:
    """Delete one memory, its vector and its K/V (``MemoryClient.delete``)."""
    ids = caller.named(user_id, agent_id, run_id)
    await _visible(memory_id, caller, server)
    return await server.client.delete(memory_id, **ids)


@route(router, "GET", "/v1/memories/{memory_id}/history/", responses=_NOT_FOUND)
async def history(
    memory_id: str,
    caller: CurrentCaller,
    server: State,
    user_id: UserId = None,
    agent_id: AgentId = None,
    run_id: RunId = None,
) -> list[dict[str, Any]]:
    """Every change to a memory, oldest first (``MemoryClient.history``)."""
    ids = caller.named(user_id, agent_id, run_id)
    await _visible(memory_id, caller, server)
    return await server.client.history(memory_id, **ids)


@route(router, "POST", "/v1/reset/")
async def reset(caller: CurrentCaller, server: State) -> dict[str, str]:
    """Delete every memory, history row, vector and stored K/V (``MemoryClient.reset``); admin keys only."""
    caller.require_admin("reset")
    await server.client.reset()
    return {"message": "Reset successful."}
