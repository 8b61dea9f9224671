"""``InferScaleMemoryMiddleware``: long-term memory for ``langchain.agents.create_agent``."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from inferscale.arguments import MAX_LIMIT
from inferscale.async_client import AsyncMemoryClient
from inferscale.client import MemoryClient
from inferscale.kept_search import asearch_kept, search_kept
from inferscale.scope import ScopeIds
from inferscale.storable import is_blank
from inferscale.write_back import astore_turns, store_turns
from langchain_inferscale.chat_models import ChatInferScale
from langchain_inferscale.messages import with_memory_block

if TYPE_CHECKING:
    from langgraph.runtime import Runtime


class InferScaleMemoryMiddleware(AgentMiddleware):
    """Recall the scope's memories before each model call, and remember the turn after the run.

    Before each model call (``wrap_model_call``), it recalls the ``limit`` memories of the scope closest to the last
    user message, leaving out any memory whose text is one of the user or assistant messages being sent: with
    ``infer=False`` the turns it stored earlier are memories too, and an identical question would otherwise recall
    itself first and push a fact out. With a :class:`~langchain_inferscale.ChatInferScale` model it passes the ids
    through ``request.model_settings`` (``memory_ids`` and the run's scope reach the model as call kwargs; no ids
    when nothing was recalled, so the model never retrieves on its own under its default scope) and adds **no
    text**: the model injects them as K/V. With any other chat model it appends their text to the system message,
    tagged with the ids (the Mem0 way; see :mod:`langchain_inferscale.messages`).

    After the run (``after_agent``) it stores the last user message and the agent's final answer with
    ``client.add(..., infer=infer)``; a message with no text (an image alone) is left out, as ``add`` leaves out
    a message with no text part. Storing the turn never fails a run whose model has answered over what a message
    holds: a message ``add`` refuses (with ``infer=False``, one longer than ``max_memory_chars`` or than the
    model's context) is not stored, with a warning logged that names the reason, and the turn's other message is
    stored alone (:func:`inferscale.write_back.store_turns`). Any other error of the write-back (a database down, a
    scope the key may not write) is raised.

    The scope is the constructor's ids, unless the runtime context sets any of ``user_id``, ``agent_id``,
    ``run_id`` (as keys of a dict, or attributes of a dataclass or pydantic ``context_schema``): then it is exactly
    the context's ids, the others ``None`` (``agent.invoke(..., context={"user_id": "bob"})``), so one agent serves
    many users and a run never mixes the constructor's user with the context's agent.

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
        self.scope = ScopeIds(user_id=user_id, agent_id=agent_id, run_id=run_id)
        self.limit = limit
        self.infer = infer
        self.remember = remember
        self.header = header

    # ------------------------------------------------------------------ before the model
    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse | AIMessage:
        scope = self._scope(request.runtime)
        query = _last_user_text(request.messages)
        memories: list[tuple[str, str]] = []
        if query is not None:
            sent = _sent_texts(request.messages)

            def search(k: int) -> list[dict[str, Any]]:
                return list(self.client.search(query, **scope, limit=k)["results"])

            memories = _pairs(search_kept(search, _unsent_in(sent), self.limit, extra=len(sent), most=MAX_LIMIT))
        return handler(self._with_memories(request, scope, memories))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse | AIMessage:
        scope = self._scope(request.runtime)
        query = _last_user_text(request.messages)
        memories: list[tuple[str, str]] = []
        if query is not None:
            sent = _sent_texts(request.messages)

            async def search(k: int) -> list[dict[str, Any]]:
                if self.async_client is not None:
                    return list((await self.async_client.search(query, **scope, limit=k))["results"])
                return list((await asyncio.to_thread(self.client.search, query, **scope, limit=k))["results"])

            memories = _pairs(await asearch_kept(search, _unsent_in(sent), self.limit, extra=len(sent), most=MAX_LIMIT))
        return await handler(self._with_memories(request, scope, memories))

    def _with_memories(self, request: ModelRequest, scope: ScopeIds, memories: list[tuple[str, str]]) -> ModelRequest:
        if isinstance(request.model, ChatInferScale):
            # always the run's scope and the recalled ids (maybe none): the model never retrieves on its own,
            # under its own default scope
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
            scope = self._scope(runtime)
            store_turns(lambda messages: self.client.add(messages, **scope, infer=self.infer), turn)
        return None

    async def aafter_agent(self, state: AgentState, runtime: Runtime) -> dict[str, Any] | None:
        turn = _last_turn(state["messages"])
        if self.remember and turn:
            scope = self._scope(runtime)
            if self.async_client is not None:
                client = self.async_client
                await astore_turns(lambda messages: client.add(messages, **scope, infer=self.infer), turn)
            else:
                add = functools.partial(self.client.add, **scope, infer=self.infer)
                await asyncio.to_thread(store_turns, add, turn)
        return None

    # ------------------------------------------------------------------ helpers
    def _scope(self, runtime: Runtime | None) -> ScopeIds:
        """The run's scope: the context's ids when it sets any (the others ``None``), else the constructor's."""
        ids = _context_ids(getattr(runtime, "context", None))
        if any(value is not None for value in ids.values()):
            return ids
        return ScopeIds(**self.scope)


def _context_ids(context: object) -> ScopeIds:
    """The scope ids a runtime context sets (``None`` for those it does not): keys of a dict, attributes of anything
    else (LangGraph's ``context_schema`` is often a dataclass or a pydantic model). The client checks their types."""
    if isinstance(context, Mapping):
        return ScopeIds(user_id=context.get("user_id"), agent_id=context.get("agent_id"), run_id=context.get("run_id"))
    return ScopeIds(
        user_id=getattr(context, "user_id", None),
        agent_id=getattr(context, "agent_id", None),
        run_id=getattr(context, "run_id", None),
    )


def _last_user_text(messages: Sequence[BaseMessage]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.text or None
    return None


def _unsent_in(sent: set[str]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a search hit's text is none of ``sent`` (a memory repeating a message of the request is there
    already: the next ones take its place, as in ``MemoryClient.chat``)."""
    return lambda hit: hit["memory"].strip() not in sent


def _pairs(hits: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``(id, text)`` of each search hit, in order."""
    return [(hit["id"], hit["memory"]) for hit in hits]


def _sent_texts(messages: Sequence[BaseMessage]) -> set[str]:
    """The texts of the user and assistant messages about to be sent (what a stored turn would repeat)."""
    return {text for m in messages if isinstance(m, (HumanMessage, AIMessage)) and not is_blank(text := m.text.strip())}


def _last_turn(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """The run's last user message and the agent's final answer after it, as ``add`` takes them; either left out
    when it has no text."""
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            turn = [] if is_blank(messages[i].text) else [{"role": "user", "content": messages[i].text}]
            answers = [
                m for m in messages[i + 1 :] if isinstance(m, AIMessage) and not is_blank(m.text) and not m.tool_calls
            ]
            if answers:
                turn.append({"role": "assistant", "content": answers[-1].text})
            return turn
    return []
