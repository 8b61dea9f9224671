"""``InferScaleMemoryMiddleware``: long-term memory for ``langchain.agents.create_agent``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from inferscale.async_client import AsyncMemoryClient
from inferscale.client import MemoryClient
from langchain_inferscale.chat_models import ChatInferScale
from langchain_inferscale.messages import with_memory_block

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

_SCOPE_KEYS = ("user_id", "agent_id", "run_id")


class InferScaleMemoryMiddleware(AgentMiddleware):
    """Recall the scope's memories before each model call, and remember the turn after the run.

    Before each model call (``wrap_model_call``), it recalls the ``limit`` memories of the scope closest to the last
    user message. With a :class:`~langchain_inferscale.ChatInferScale` model it passes their ids through
    ``request.model_settings`` (``memory_ids`` and the scope reach the model as call kwargs) and adds **no text**: the
    model injects them as K/V. With any other chat model it appends their text to the system message, tagged with the
    ids (the Mem0 way; see :mod:`langchain_inferscale.messages`).

    After the run (``after_agent``) it stores the last user message and the agent's final answer with
    ``client.add(..., infer=infer)``.

    The scope is the constructor's ids, overridden per run by the same keys in the runtime context when it is a dict
    (``agent.invoke(..., context={"user_id": "maya"})``), so one agent serves many users.

    Example:
        .. code-block:: python

            agent = create_agent(
                model=ChatInferScale(client=client, max_tokens=32),
                middleware=[InferScaleMemoryMiddleware(client, user_id="maya")],
            )
            agent.invoke({"messages": [{"role": "user", "content": "What is my dog called?"}]})

    Args:
        client: the memory store; ids it recalls must live in the same store as the model's client.
        async_client: used by the async hooks; without one they run ``client`` on a worker thread.
        user_id, agent_id, run_id: the default scope.
        limit: memories recalled per model call.
        infer: ``add``'s ``infer`` for the turn written back (``False`` stores the messages as they are).
        remember: write the turn back at all.
        header: the line before the memories on the text path.
    """

    def __init__(
        self,
        client: MemoryClient,
        *,
        async_client: AsyncMemoryClient | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 5,
        infer: bool = False,
        remember: bool = True,
        header: str = "Memories about the user:",
    ) -> None:
        super().__init__()
        self.client = client
        self.async_client = async_client
        self.scope = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
        self.limit = limit
        self.infer = infer
        self.remember = remember
        self.header = header

    # ------------------------------------------------------------------ before the model
    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse | AIMessage:
        query = _last_user_text(request.messages)
        if query is None:
            return handler(request)
        memories = self._recalled(self.client.search(query, **self._scope(request.runtime), limit=self.limit))
        return handler(self._with_memories(request, memories))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse | AIMessage:
        query = _last_user_text(request.messages)
        if query is None:
            return await handler(request)
        scope = self._scope(request.runtime)
        if self.async_client is not None:
            found = await self.async_client.search(query, **scope, limit=self.limit)
        else:
            found = await asyncio.to_thread(self.client.search, query, **scope, limit=self.limit)
        return await handler(self._with_memories(request, self._recalled(found)))

    def _with_memories(self, request: ModelRequest, memories: list[tuple[str, str]]) -> ModelRequest:
        if isinstance(request.model, ChatInferScale):
            scope = self._scope(request.runtime)
            settings = {
                **request.model_settings,
                "memory_ids": [memory_id for memory_id, _ in memories],
                "user_id": scope["user_id"],
                "agent_id": scope["agent_id"],
                "memory_run_id": scope["run_id"],
            }
            return request.override(model_settings=settings)
        if not memories:
            return request
        return request.override(system_message=with_memory_block(request.system_message, memories, self.header))

    # ------------------------------------------------------------------ after the run
    def after_agent(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        turn = _last_turn(state["messages"])
        if self.remember and turn:
            self.client.add(turn, **self._scope(runtime), infer=self.infer)
        return None

    async def aafter_agent(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        turn = _last_turn(state["messages"])
        if self.remember and turn:
            if self.async_client is not None:
                await self.async_client.add(turn, **self._scope(runtime), infer=self.infer)
            else:
                await asyncio.to_thread(self.client.add, turn, **self._scope(runtime), infer=self.infer)
        return None

    # ------------------------------------------------------------------ helpers
    def _scope(self, runtime: Runtime | None) -> dict[str, str | None]:
        context = getattr(runtime, "context", None)
        if isinstance(context, Mapping):
            return {key: context.get(key, self.scope[key]) for key in _SCOPE_KEYS}
        return dict(self.scope)

    @staticmethod
    def _recalled(found: Mapping[str, Any]) -> list[tuple[str, str]]:
        return [(r["id"], r["memory"]) for r in found["results"]]


def _last_user_text(messages: Sequence[BaseMessage]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text or None
    return None


def _last_turn(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """The run's last user message and the agent's final answer after it, as ``add`` takes them."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            turn = [{"role": "user", "content": messages[i].text}]
            answers = [m for m in messages[i + 1 :] if isinstance(m, AIMessage) and m.text and not m.tool_calls]
            if answers:
                turn.append({"role": "assistant", "content": answers[-1].text})
            return turn
    return []
