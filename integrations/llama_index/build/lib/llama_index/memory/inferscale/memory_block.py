"""Memory blocks for LlamaIndex's :class:`~llama_index.core.memory.Memory`.

``Memory`` renders a block's text into a system message of its own template, where no id can travel with it. So
there are two blocks over the same search:

- :class:`InferScaleMemoryBlock` (``BaseMemoryBlock[str]``) returns the memories' text: the Mem0 way, for any LLM.
- :class:`InferScaleKVMemoryBlock` returns them as one tagged system message instead (``List[ChatMessage]``, the
  block content ``Memory`` puts before the history as it is), whose ``additional_kwargs["inferscale_memory_ids"]``
  carries the ids: :class:`~llama_index.memory.inferscale.InferScaleLLM` injects them as K/V and drops the text;
  any other LLM reads the text. Use it with InferScaleLLM, and keep it the only block that renders into a system
  message: ``Memory`` prepends other blocks' template text to the first system message, which is this one, and
  InferScaleLLM refuses that message (``InvalidInputError``) rather than drop their text; build such a ``Memory``
  with ``insert_method="user"``.

Both store what ``Memory`` flushes from its short-term history with ``client.add(infer=...)``. Both use
``async_client`` (an ``AsyncMemoryClient`` on the same store) when given, else run the sync client on a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from llama_index.core.base.llms.types import ChatMessage, ContentBlock, MessageRole
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.memory import BaseMemoryBlock
from llama_index.memory.inferscale._messages import memory_message, search_text, turns_to_add
from llama_index.memory.inferscale._scope import ScopeKwargs, scope_ids_of
from llama_index.memory.inferscale._search import async_search

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.arguments import MAX_LIMIT
from inferscale.kept_search import asearch_kept
from inferscale.storable import is_blank
from inferscale.write_back import astore_turns, store_turns

T = TypeVar("T", str, list[ContentBlock], list[ChatMessage])
"""What a block's ``aget`` returns: the value types ``BaseMemoryBlock`` allows."""


class _InferScaleBlock(BaseMemoryBlock[T], Generic[T]):
    """The fields, the search and the write both blocks share."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    similarity_top_k: int = Field(default=5, ge=0)
    search_msg_limit: int = Field(default=5, ge=0)
    infer: bool = False

    _client: MemoryClient = PrivateAttr()
    _async_client: AsyncMemoryClient | None = PrivateAttr(default=None)

    def __init__(self, client: MemoryClient, *, async_client: AsyncMemoryClient | None = None, **data: Any) -> None:
        super().__init__(**data)
        self._client = client
        self._async_client = async_client
        self._scope_ids()  # a scope is checked now, and read from the fields on every call

    def _scope_ids(self) -> ScopeKwargs:
        """The scope of this call: the fields as they are now (:func:`scope_ids_of`)."""
        return scope_ids_of(self)

    async def _hits(self, messages: list[ChatMessage] | None) -> list[Mapping[str, Any]]:
        """The best ``similarity_top_k`` memories for the recent messages, leaving out those whose text is a user or
        assistant message of ``messages`` (the history ``Memory`` shows the model holds it already: a question an
        earlier session stored, say), as a chat does; the search widens while it leaves some out
        (:func:`inferscale.kept_search.asearch_kept`)."""
        messages = messages or []
        query = search_text(messages, self.search_msg_limit)
        if is_blank(query) or self.similarity_top_k == 0:
            return []
        said = (m for m in messages if m.role in (MessageRole.USER, MessageRole.ASSISTANT))
        shown = {text for m in said if (text := (m.content or "").strip())}
        search = async_search(self._client, self._async_client, query, self._scope_ids())

        def keep(hit: Mapping[str, Any]) -> bool:
            return str(hit["memory"]).strip() not in shown

        extra = min(len(shown), self.similarity_top_k)  # the search widens past it when more are left out
        return await asearch_kept(search, keep, self.similarity_top_k, extra=extra, most=MAX_LIMIT)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        """Store the user and assistant messages LlamaIndex's ``Memory`` flushes to the block, leaving out (with a
        warning) those ``add`` refuses for what they hold (:func:`inferscale.write_back.store_turns`): a flush
        never fails the chat turn that caused it."""
        turns = turns_to_add(messages)
        if not turns:
            return
        scope = self._scope_ids()
        if self._async_client is not None:
            client = self._async_client
            await astore_turns(lambda t: client.add(t, **scope, infer=self.infer), turns)
        else:
            await asyncio.to_thread(store_turns, lambda t: self._client.add(t, **scope, infer=self.infer), turns)


_FIELDS_DOC = """
    Args:
        client: the InferScale ``MemoryClient``.
        async_client: an ``AsyncMemoryClient`` on the same store (optional; else ``client`` runs on a thread).
        user_id, agent_id, run_id: the scope (at least one).
        name: the block's name in ``Memory``.
        similarity_top_k: memories returned per ``aget``.
        search_msg_limit: recent messages the search uses.
        infer: ``client.add(infer=...)`` for flushed messages.

    Raises:
        ScopeError: when no scope id is given.
"""


class InferScaleMemoryBlock(_InferScaleBlock[str]):
    """The scope's memories for the last ``search_msg_limit`` messages, as text (``"- memory"`` lines)."""

    __doc__ = (__doc__ or "") + _FIELDS_DOC

    name: str = Field(default="inferscale_memory", description="The block's name.")

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        hits = await self._hits(messages)
        return "\n".join(f"- {h['memory']}" for h in hits)


class InferScaleKVMemoryBlock(_InferScaleBlock[list[ChatMessage]]):
    """The scope's memories for the last ``search_msg_limit`` messages, as one system message tagged with their
    ids (see the module docstring); an empty list when none is found (build the LLM with ``auto_retrieve=False``
    so that it then injects none rather than retrieving on its own)."""

    __doc__ = (__doc__ or "") + _FIELDS_DOC

    name: str = Field(default="inferscale_kv_memory", description="The block's name.")

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> list[ChatMessage]:
        hits = await self._hits(messages)
        return [memory_message(hits)] if hits else []
