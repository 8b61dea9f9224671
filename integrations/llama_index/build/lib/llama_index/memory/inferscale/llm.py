""":class:`InferScaleLLM`: a LlamaIndex LLM over ``MemoryClient.chat`` that injects tagged memories as K/V."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any, Literal

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.memory.inferscale._messages import MEMORY_IDS_KEY, split_memory
from llama_index.memory.inferscale._scope import ScopeKwargs, scope_ids_of

from inferscale import AsyncMemoryClient, ChatChunk, ChatResult, MemoryClient
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient

_CALL_ARGS = frozenset({"max_new_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty", "stop"})
"""Per-call keyword arguments :class:`InferScaleLLM` passes to ``MemoryClient.chat`` (besides ``memory_ids``)."""


class InferScaleLLM(CustomLLM):
    """A chat model answering with ``MemoryClient.chat`` on its scope (``user_id``/``agent_id``/``run_id``).

    ``chat``/``stream_chat``/``achat``/``astream_chat`` take the message list as it is (not flattened into one
    prompt). A system message tagged with ``additional_kwargs["inferscale_memory_ids"]`` (what
    :class:`~llama_index.memory.inferscale.InferScaleMemory` adds) is removed, text and all, and its ids are passed
    as ``memory_ids``: the memories are injected as K/V and never prefilled as text. With no tagged message the
    client retrieves the scope's top ``limit`` memories for the last user message (``auto_retrieve``), or injects
    none. ``complete`` answers one prompt the same way. Per call, ``memory_ids=[...]`` and the sampling arguments
    of ``MemoryClient.chat`` (``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
    ``repetition_penalty``, ``stop``) may be passed as keyword arguments.

    Every response's ``raw`` (on a stream, the last response's) is ``{"usage": {"prompt_tokens",
    "completion_tokens", "total_tokens"}, "result": ChatResult}``: OpenAI's usage shape, which LlamaIndex's
    ``TokenCountingHandler`` reads, and the :class:`inferscale.ChatResult`. Its ``additional_kwargs`` carry the
    injected ``memory_ids`` and the token counts.

    Async calls use ``async_client`` (an :class:`inferscale.AsyncMemoryClient` on the same store) when given, else
    run the sync client on a thread. A stream the consumer stops reading early is closed (its engine request ends
    and its cache is freed) when the response generator is closed or dropped.

    ``metadata`` never loads the model: its ``context_window`` is the ``context_window`` field when set, else the
    model's own once a call has loaded the model, else LlamaIndex's ``DEFAULT_CONTEXT_WINDOW`` (3900 tokens, a
    conservative stand-in; set ``context_window`` for the exact value from the start).
    """

    user_id: str | None = Field(default=None, description="Scope: the user whose memories are used.")
    agent_id: str | None = Field(default=None, description="Scope: the agent.")
    run_id: str | None = Field(default=None, description="Scope: the run.")
    max_new_tokens: int | None = Field(default=None, gt=0, description="Answer budget (tokens); engine default.")
    temperature: float | None = Field(default=None, ge=0, description="Sampling temperature; 0/None is greedy.")
    top_p: float | None = Field(default=None, description="Nucleus sampling (0, 1].")
    stop: list[str] | None = Field(default=None, description="Strings that end the answer.")
    limit: int | None = Field(default=None, ge=1, description="Memories retrieved for an untagged call (5).")
    auto_retrieve: bool = Field(
        default=True, description="With no tagged message: retrieve for the scope (True) or inject none (False)."
    )
    mode: Literal["kv", "prompt"] = Field(default="kv", description="'kv' injection or the 'prompt' baseline.")
    context_window: int | None = Field(
        default=None, gt=0, description="Tokens for metadata; the model's once loaded by a call when None."
    )

    _client: MemoryClient = PrivateAttr()
    _async_client: AsyncMemoryClient | None = PrivateAttr(default=None)
    _model_window: int | None = PrivateAttr(default=None)  # client.context_window, read after a call loaded it

    def __init__(self, client: MemoryClient, *, async_client: AsyncMemoryClient | None = None, **fields: Any) -> None:
        """Raises: ScopeError when no scope id is given; TypeError for a remote ``client`` or ``async_client``
        (``MemoryClient(host=...)``): this LLM reads the local model's name, context window and answer budget from
        its client, and its async calls answer with that model too."""
        for name, given in (("client", client), ("async_client", async_client)):
            if isinstance(given, RemoteMemoryClient | AsyncRemoteMemoryClient):
                raise TypeError(
                    f"InferScaleLLM needs a local inferscale client as {name}, got a {type(given).__name__}: it reads "
                    "the model's name, context window and answer budget from its client; with a server, use "
                    "InferScaleMemory and the retriever on the remote client, and the server's OpenAI-compatible "
                    "/v1/chat/completions"
                )
        super().__init__(**fields)
        self._client = client
        self._async_client = async_client
        self._scope_ids()  # a scope is checked now, and read from the fields on every call

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleLLM"

    @property
    def client(self) -> MemoryClient:
        """The InferScale client."""
        return self._client

    @property
    def metadata(self) -> LLMMetadata:
        """``model_name`` is ``client.model_name``; ``context_window`` the field, else the model's once a call
        loaded it, else ``DEFAULT_CONTEXT_WINDOW``. Loads nothing (``SimpleChatEngine.from_defaults`` reads it)."""
        window = self.context_window or self._model_window or DEFAULT_CONTEXT_WINDOW
        return LLMMetadata(
            context_window=window,
            num_output=self.max_new_tokens or self._client.config.engine.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=self._client.model_name,
            system_role=MessageRole.SYSTEM,
        )

    # ------------------------------------------------------------------ request building
    def _chat_kwargs(self, messages: Sequence[ChatMessage], call: dict[str, Any]) -> dict[str, Any]:
        """``MemoryClient.chat`` arguments for ``messages`` and a call's keyword arguments.

        Raises:
            TypeError: for a keyword argument ``chat`` does not take.
        """
        conversation, tagged = split_memory(messages)
        explicit = call.pop("memory_ids", None)
        memory_ids = tagged
        if explicit is not None:  # the tagged ids, then the call's, in order without repeats
            memory_ids = list(dict.fromkeys([*(tagged or []), *explicit]))
        unknown = sorted(set(call) - _CALL_ARGS)
        if unknown:
            raise TypeError(
                f"InferScaleLLM got unsupported keyword arguments {unknown}; it takes memory_ids and "
                f"{', '.join(sorted(_CALL_ARGS))}"
            )
        kwargs: dict[str, Any] = {
            "messages": conversation,
            **self._scope_ids(),
            "mode": self.mode,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop,
        }
        if memory_ids is not None:
            kwargs["memory_ids"] = list(memory_ids)
        elif not self.auto_retrieve:
            kwargs["memory_ids"] = []
        else:
            kwargs["limit"] = self.limit
        kwargs.update(call)
        return kwargs

    def _scope_ids(self) -> ScopeKwargs:
        """The scope of this call: the fields as they are now (:func:`scope_ids_of`)."""
        return scope_ids_of(self)

    @staticmethod
    def _prompt_messages(prompt: str) -> list[ChatMessage]:
        return [ChatMessage(role=MessageRole.USER, content=prompt)]

    # ------------------------------------------------------------------ chat
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer the conversation; tagged memory messages are injected by id (K/V)."""
        return self._chat(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the answer: one ``ChatResponse`` per ``ChatChunk`` (``delta`` the new text, ``message`` the text
        so far); the last has ``delta`` ``None`` and ``raw`` its usage and ``ChatResult``. Errors raise here, before any
        response."""
        return self._stream_chat(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """:meth:`chat` on the async client, or on a thread."""
        return await self._achat(messages, kwargs)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """:meth:`stream_chat` on the async client, or the sync stream read on a thread chunk by chunk."""
        return await self._astream_chat(messages, kwargs)

    def _chat(self, messages: Sequence[ChatMessage], call: dict[str, Any]) -> ChatResponse:
        result = self._client.chat(**self._chat_kwargs(messages, call))
        self._note_window()
        return _chat_response(result.answer, None, result)

    def _stream_chat(self, messages: Sequence[ChatMessage], call: dict[str, Any]) -> ChatResponseGen:
        chunks = self._client.chat(**self._chat_kwargs(messages, call), stream=True)
        self._note_window()
        return _chat_stream(chunks)

    async def _achat(self, messages: Sequence[ChatMessage], call: dict[str, Any]) -> ChatResponse:
        request = self._chat_kwargs(messages, call)
        if self._async_client is not None:
            result = await self._async_client.chat(**request)
        else:
            result = await asyncio.to_thread(lambda: self._client.chat(**request))
        self._note_window()
        return _chat_response(result.answer, None, result)

    async def _astream_chat(self, messages: Sequence[ChatMessage], call: dict[str, Any]) -> ChatResponseAsyncGen:
        request = self._chat_kwargs(messages, call)
        if self._async_client is not None:
            chunks: AsyncIterator[ChatChunk] = await self._async_client.chat(**request, stream=True)
        else:
            sync_chunks = await asyncio.to_thread(lambda: self._client.chat(**request, stream=True))
            chunks = _on_thread(sync_chunks)
        self._note_window()
        return _achat_stream(chunks)

    def _note_window(self) -> None:
        """Keep the model's context window for :attr:`metadata` once a call has loaded the model (then reading it
        costs nothing)."""
        if self._model_window is None and self.context_window is None:
            self._model_window = self._client.context_window

    # ------------------------------------------------------------------ completion
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` as one user turn (memories: ``auto_retrieve``, or ``memory_ids=``)."""
        return _completion(self._chat(self._prompt_messages(prompt), kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream the answer to ``prompt`` (see :meth:`stream_chat`)."""
        responses = self._stream_chat(self._prompt_messages(prompt), kwargs)

        def gen() -> CompletionResponseGen:
            with contextlib.closing(responses):
                for response in responses:
                    yield _completion(response)

        return gen()

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """:meth:`complete` on the async path."""
        return _completion(await self._achat(self._prompt_messages(prompt), kwargs))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        """:meth:`stream_complete` on the async path."""
        responses = await self._astream_chat(self._prompt_messages(prompt), kwargs)

        async def gen() -> CompletionResponseAsyncGen:
            try:
                async for response in responses:
                    yield _completion(response)
            finally:
                await responses.aclose()

        return gen()


def _chat_response(text: str, delta: str | None, result: ChatResult | None) -> ChatResponse:
    """A ``ChatResponse`` with the text so far; on the final one, the ``ChatResult`` and its report."""
    extra: dict[str, Any] = {}
    if result is not None:
        extra = {
            MEMORY_IDS_KEY: list(result.memory_ids),
            "prompt_tokens": result.prompt_tokens,
            "memory_tokens": result.memory_tokens,
            "completion_tokens": result.generated_tokens,
            "finish_reason": result.finish_reason,
        }
    raw = None if result is None else {"usage": _usage(result), "result": result}
    message = ChatMessage(role=MessageRole.ASSISTANT, content=text)
    return ChatResponse(message=message, delta=delta or None, raw=raw, additional_kwargs=extra)


def _usage(result: ChatResult) -> dict[str, int]:
    """OpenAI's usage keys, which LlamaIndex's ``TokenCountingHandler`` reads from ``raw["usage"]`` (it read the
    ``ChatResult`` itself as a dict and raised ``TypeError`` on every call): prompt = the whole prompt, memory
    segment included."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.generated_tokens,
        "total_tokens": result.prompt_tokens + result.generated_tokens,
    }


def _chat_stream(chunks: Generator[ChatChunk, None, None]) -> ChatResponseGen:
    """The responses of a sync stream; closing this generator (or stopping early) closes ``chunks``."""
    text = ""
    with contextlib.closing(chunks):
        for chunk in chunks:
            text += chunk.delta
            yield _chat_response(text, chunk.delta, chunk.result)


async def _achat_stream(chunks: AsyncIterator[ChatChunk]) -> ChatResponseAsyncGen:
    """The responses of an async stream; closing this generator (or stopping early) closes ``chunks``."""
    text = ""
    try:
        async for chunk in chunks:
            text += chunk.delta
            yield _chat_response(text, chunk.delta, chunk.result)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _on_thread(chunks: Generator[ChatChunk, None, None]) -> AsyncIterator[ChatChunk]:
    """Read a sync stream chunk by chunk on a worker thread, so that decoding never blocks the event loop; closed
    on its thread when the consumer stops early or is cancelled."""
    done = object()
    try:
        while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
            yield chunk  # type: ignore[misc]
    finally:
        await asyncio.to_thread(chunks.close)


def _completion(response: ChatResponse) -> CompletionResponse:
    return CompletionResponse(
        text=response.message.content or "",
        delta=response.delta,
        raw=response.raw,
        additional_kwargs=response.additional_kwargs,
    )
