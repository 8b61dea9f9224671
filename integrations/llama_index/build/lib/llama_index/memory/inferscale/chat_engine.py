"""A ``SimpleChatEngine`` wired for K/V: :class:`InferScaleLLM` and :class:`InferScaleMemory` on one scope."""

from __future__ import annotations

from typing import Any

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.memory.inferscale._scope import InferScaleContext
from llama_index.memory.inferscale.base import DEFAULT_TOKEN_LIMIT, InferScaleMemory
from llama_index.memory.inferscale.llm import InferScaleLLM

from inferscale import AsyncMemoryClient, MemoryClient


def simple_chat_engine(
    client: MemoryClient,
    *,
    user_id: str | None = None,
    agent_id: str | None = None,
    run_id: str | None = None,
    system_prompt: str | None = None,
    token_limit: int = DEFAULT_TOKEN_LIMIT,
    similarity_top_k: int = 5,
    search_msg_limit: int = 5,
    infer: bool = False,
    async_client: AsyncMemoryClient | None = None,
    **llm_fields: Any,
) -> SimpleChatEngine:
    """``SimpleChatEngine.from_defaults(llm=InferScaleLLM(...), memory=InferScaleMemory(...))`` on one scope: each
    turn the memory recalls the scope's memories and tags them, and the LLM injects them by id as K/V. The memory
    alone chooses: the LLM is built with ``auto_retrieve=False`` (unless ``llm_fields`` say otherwise), so a turn
    without a memory message injects none.

    Args:
        client: the InferScale ``MemoryClient`` both use.
        user_id, agent_id, run_id: the scope (at least one).
        system_prompt: the engine's system prompt (sent every turn, before the history).
        token_limit, similarity_top_k, search_msg_limit, infer: :class:`InferScaleMemory`'s.
        async_client: for ``achat``/``astream_chat`` and the memory's ``aget``/``aput`` (see :class:`InferScaleLLM`).
        llm_fields: other :class:`InferScaleLLM` fields (``max_new_tokens``, ``temperature``, ``stop``...).

    Raises:
        ScopeError: when no scope id is given.
    """
    scope = InferScaleContext.of(user_id=user_id, agent_id=agent_id, run_id=run_id)
    llm = InferScaleLLM(client, async_client=async_client, **scope.ids(), **{"auto_retrieve": False, **llm_fields})
    memory = InferScaleMemory.from_client(
        context=scope.ids(),
        client=client,
        async_client=async_client,
        search_msg_limit=search_msg_limit,
        token_limit=token_limit,
        similarity_top_k=similarity_top_k,
        infer=infer,
    )
    return SimpleChatEngine.from_defaults(llm=llm, memory=memory, system_prompt=system_prompt)
