"""Memory tools named and shaped as Mem0's LangChain recipe: ``add_memory``, ``search_memory``, ``get_all_memory``.

Mem0's recipe builds three ``StructuredTool``s over a client with these argument schemas; recipe code that swaps
its client for InferScale's and calls :func:`memory_tools` keeps its tool names and arguments.

- ``add_memory(messages: [{"role", "content"}], user_id, output_format, metadata=None)`` → ``client.add``;
- ``search_memory(query, filters)`` → ``client.search`` (filters in Mem0's v2 shape, scope ids inside);
- ``get_all_memory(version, filters, page=1, page_size=50)`` → ``client.get_all``, one page of it.

``output_format`` (``"v1.1"``, the shape always returned) and ``version`` (``"v1"`` or ``"v2"``) are passed through
to the client, which refuses other values. With ``async_client`` the tools also run natively under ``ainvoke``.

Bound to a scope (``memory_tools(client, user_id="alex")``), every call runs in that scope: an argument naming
another scope id fails (``InvalidInputError`` from the client), so one user's agent cannot reach another's
memories. Unbound, the scope comes from the arguments, as in Mem0's recipe.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field

from inferscale import InvalidInputError
from inferscale.async_client import AsyncMemoryClient
from inferscale.client import MemoryClient
from inferscale.scope import ScopeIds


class Message(BaseModel):
    """One message to remember."""

    role: str = Field(description="Role of the message sender (user or assistant)")
    content: str = Field(description="Content of the message")


class AddMemoryInput(BaseModel):
    """Arguments of ``add_memory``."""

    messages: list[Message] = Field(description="List of messages to add to memory")
    user_id: str | None = Field(default=None, description="ID of the user associated with these messages")
    output_format: str | None = Field(default=None, description="Version format for the output (v1.1)")
    metadata: dict[str, Any] | None = Field(default=None, description="Additional metadata for the messages")


class SearchMemoryInput(BaseModel):
    """Arguments of ``search_memory``."""

    query: str = Field(description="The search query string")
    filters: dict[str, Any] | None = Field(default=None, description="Filters to apply to the search")


class GetAllMemoryInput(BaseModel):
    """Arguments of ``get_all_memory``."""

    version: str | None = Field(default=None, description="Version of the memory API to use (v1 or v2)")
    filters: dict[str, Any] | None = Field(default=None, description="Filters to apply to the retrieval")
    page: int = Field(default=1, ge=1, description="Page number for pagination")
    page_size: int = Field(default=50, ge=1, description="Number of items per page")


def memory_tools(
    client: MemoryClient,
    *,
    async_client: AsyncMemoryClient | None = None,
    user_id: str | None = None,
    agent_id: str | None = None,
    run_id: str | None = None,
    infer: bool = True,
) -> list[StructuredTool]:
    """``[add_memory, search_memory, get_all_memory]`` over ``client``, bound to a scope when ids are given.

    Args:
        client: the memory store.
        async_client: answers the tools' async calls (``ainvoke``); without one, LangChain runs the sync functions
            on its executor.
        user_id, agent_id, run_id: the scope every call runs in; none: each call names its own (Mem0's recipe).
        infer: ``add``'s ``infer`` (``True``: the LLM extracts facts, as Mem0 does).
    """
    scope = ScopeIds(user_id=user_id, agent_id=agent_id, run_id=run_id)

    def add_args(
        messages: list[Message], user_id: str | None, output_format: str | None, metadata: dict[str, Any] | None
    ) -> dict[str, Any]:
        ids = ScopeIds(**scope)
        if user_id is not None:
            if scope["user_id"] not in (None, user_id):
                raise InvalidInputError(f"user_id={user_id!r}: these tools are bound to user {scope['user_id']!r}")
            ids["user_id"] = user_id
        dicts = [m.model_dump() if isinstance(m, Message) else dict(m) for m in messages]
        return {"messages": dicts, **ids, "metadata": metadata, "infer": infer, "output_format": output_format}

    def get_all_args(version: str | None, filters: dict[str, Any] | None, page: int, page_size: int) -> dict[str, Any]:
        return {**scope, "filters": filters, "limit": page * page_size, "version": version}

    def one_page(found: dict[str, Any], page: int, page_size: int) -> dict[str, Any]:
        return {"page": page, "page_size": page_size, "results": found["results"][(page - 1) * page_size :]}

    def add_memory(
        messages: list[Message],
        user_id: str | None = None,
        output_format: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Add messages to memory with associated user ID and metadata."""
        return client.add(**add_args(messages, user_id, output_format, metadata))

    def search_memory(query: str, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        """Search memory with the given query and filters."""
        return client.search(query, **scope, filters=filters)

    def get_all_memory(
        version: str | None = None, filters: dict[str, Any] | None = None, page: int = 1, page_size: int = 50
    ) -> dict[str, Any]:
        """Retrieve all memories matching the specified criteria, one page."""
        return one_page(client.get_all(**get_all_args(version, filters, page, page_size)), page, page_size)

    async def aadd_memory(
        messages: list[Message],
        user_id: str | None = None,
        output_format: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        assert async_client is not None  # only given to the tools with one
        return await async_client.add(**add_args(messages, user_id, output_format, metadata))

    async def asearch_memory(query: str, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        assert async_client is not None
        return await async_client.search(query, **scope, filters=filters)

    async def aget_all_memory(
        version: str | None = None, filters: dict[str, Any] | None = None, page: int = 1, page_size: int = 50
    ) -> dict[str, Any]:
        assert async_client is not None
        found = await async_client.get_all(**get_all_args(version, filters, page, page_size))
        return one_page(found, page, page_size)

    native = async_client is not None
    return [
        StructuredTool.from_function(
            func=add_memory,
            coroutine=aadd_memory if native else None,
            name="add_memory",
            description="Add new messages to memory with associated metadata",
            args_schema=AddMemoryInput,
        ),
        StructuredTool.from_function(
            func=search_memory,
            coroutine=asearch_memory if native else None,
            name="search_memory",
            description="Search through memories with a query and filters",
            args_schema=SearchMemoryInput,
        ),
        StructuredTool.from_function(
            func=get_all_memory,
            coroutine=aget_all_memory if native else None,
            name="get_all_memory",
            description="Retrieve all memories matching specified filters",
            args_schema=GetAllMemoryInput,
        ),
    ]
