"""``ChatInferScale``: a LangChain chat model answered by :meth:`inferscale.MemoryClient.chat`, memory as K/V."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal, Self

from langchain_core.caches import BaseCache
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, model_validator
from sqlalchemy import make_url

from inferscale import ChatChunk, InvalidInputError
from inferscale import ChatResult as InferScaleResult
from inferscale.async_client import AsyncMemoryClient
from inferscale.client import MemoryClient
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient
from langchain_inferscale.messages import prepare

_CALL_SCOPE = ("user_id", "agent_id", "memory_run_id")
_CALL_KWARGS = frozenset(
    {*_CALL_SCOPE, "memory_ids", "filters", "limit", "mode", "temperature", "max_tokens", "model", "stream"}
)


class ChatInferScale(BaseChatModel):
    """A chat model whose memory is injected as K/V: each call is one :meth:`inferscale.MemoryClient.chat`.

    The model retrieves the scope's top ``limit`` memories for the last user message, or injects exactly the ids it
    is given: per call (``memory_ids=[...]``, e.g. from :class:`~langchain_inferscale.InferScaleMemoryMiddleware`)
    or through a tagged system message (see :mod:`langchain_inferscale.messages`), whose text it drops.

    Example:
        .. code-block:: python

            from inferscale import MemoryClient
            from langchain_inferscale import ChatInferScale

            client = MemoryClient()
            client.add("My dog is called Biscuit.", user_id="maya", infer=False)
            model = ChatInferScale(client=client, user_id="maya", max_tokens=32)
            model.invoke("What is my dog called?").content

    Per call (``invoke(..., **kwargs)`` or ``bind(**kwargs)``): ``user_id``, ``agent_id``, ``memory_run_id`` (the
    run scope: LangChain reserves ``run_id`` for its tracing run), ``memory_ids``, ``filters``, ``limit``, ``mode``,
    ``temperature``, ``max_tokens``, ``model`` (only this model's name), and ``stream`` (langchain-core's routing
    between the streaming and the whole-answer path; the answer is the same). Any other keyword raises
    ``TypeError``.

    Tool calling is not implemented: ``bind_tools`` raises ``NotImplementedError``.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)

    client: MemoryClient | None = Field(default=None, exclude=True)
    """The client that answers sync calls; built from ``config`` when not given."""
    async_client: AsyncMemoryClient | None = Field(default=None, exclude=True)
    """The client that answers async calls; without one, async calls run the sync client on LangChain's executor."""
    config: dict[str, Any] | None = None
    """A :class:`inferscale.MemoryConfig` dict (or Mem0-shaped dict) to build ``client`` from."""
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    """Scope ids: whose memories (at least one, here or per call)."""
    limit: int | None = None
    """Memories retrieved per call when no ids are given (the client's default, 5, when ``None``)."""
    mode: Literal["kv", "prompt"] = "kv"
    """``"kv"``: memories injected as K/V; ``"prompt"``: the same tokens prefilled as text (the baseline)."""
    temperature: float | None = None
    """Sampling temperature; ``None`` or 0 decodes greedily."""
    max_tokens: int | None = None
    """Answer budget in tokens (the engine config's ``max_new_tokens`` when ``None``)."""
    stop: list[str] | None = None
    """Strings that end the answer (not included)."""
    timeout: float | None = None
    """Seconds a call may run, checked between generated tokens (prefill is not interrupted); ``TimeoutError``."""
    max_retries: int = Field(default=2, ge=0)
    """Accepted as LangChain chat models take it; unused: the client answers in process, with no network call to
    retry."""
    streaming: bool = False
    """Answer ``invoke`` through the streaming path (callbacks see each token). langchain-core routes the call
    (``BaseChatModel._should_stream``), so ``disable_streaming`` and a per-call ``stream=False`` still win."""
    model_name: str | None = Field(default=None, alias="model")
    """The model's name in ``response_metadata`` and traces; ``client.model_name`` when ``None``."""
    cache: BaseCache | bool | None = Field(default=False, exclude=True)
    """LangChain's response cache. Off by default, and the global cache (``set_llm_cache``) is not used: an answer
    depends on the memories stored when it was given, and a cached one would be served after they are changed or
    deleted. ``True`` or a cache opts in; its key holds the store and the scope ids, so no two users (of one store
    or of two) share an entry."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_a_remote_client(cls, data: Any) -> Any:
        """A remote client (``MemoryClient(host=...)``) is refused with what to use instead; pydantic's own error
        only said that a ``RemoteMemoryClient`` is not a ``MemoryClient`` (a new user's report).

        Raises:
            TypeError: for a remote ``client`` or ``async_client``.
        """
        given = data if isinstance(data, Mapping) else {}
        for name in ("client", "async_client"):
            if isinstance(given.get(name), RemoteMemoryClient | AsyncRemoteMemoryClient):
                raise TypeError(
                    f"ChatInferScale needs a local inferscale client as {name}=, got a {type(given[name]).__name__}: "
                    "it generates with the client's own model; with a server, use InferScaleRetriever, "
                    "InferScaleMemoryMiddleware or memory_tools on the remote client, and chat through the server's "
                    "OpenAI-compatible /v1/chat/completions"
                )
        return data

    @model_validator(mode="after")
    def _resolve_client(self) -> Self:
        if self.client is None and self.async_client is None:
            # Construction does no I/O: the database and models open on the first call.
            self.client = MemoryClient(self.config)
        elif self.config is not None:
            raise ValueError("pass either client/async_client or config, not both")
        if self.model_name is None:
            self.model_name = (self.client or self.async_client).model_name  # type: ignore[union-attr]
        return self

    # ------------------------------------------------------------------ LangChain surface
    @property
    def _llm_type(self) -> str:
        return "inferscale"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """What a response depends on besides the messages (langchain-core's cache key): the model and sampling, the
        scope, and the store (:meth:`_store_key`, digested: a database URL may hold a password)."""
        return {
            "model_name": self.model_name,
            "store": hashlib.sha256(self._store_key().encode()).hexdigest()[:16],
            "user_id": self.user_id,
            "agent_id": self.agent_id,
            "run_id": self.run_id,
            "mode": self.mode,
            "limit": self.limit,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
        }

    def get_token_ids(self, text: str) -> list[int]:
        """``text``'s token ids under the served model's own tokenizer, without special tokens, for LangChain's
        token counting (``get_num_tokens``, ``trim_messages(token_counter=model)``). Loads the model on first use;
        langchain-core's default tokenizer (GPT-2's) would be fetched from the Hugging Face Hub."""
        return list(self._any_client().engine.tokenizer.encode(text, add_special_tokens=False))

    def _store_key(self) -> str:
        """Which store answers: a SQLite file by its absolute path (a relative one names another file in another
        working directory), an in-memory database by its client (it lives in this process only), any other database
        by its URL."""
        client = self._any_client()
        url = make_url(client.config.database_url())
        if url.get_backend_name() != "sqlite":
            return url.render_as_string(hide_password=False)
        if url.database in (None, "", ":memory:"):
            return f"sqlite-in-memory:{id(client)}"
        return f"sqlite:{os.path.abspath(url.database)}"

    def _any_client(self) -> MemoryClient | AsyncMemoryClient:
        """The sync client, else the async one (the validator makes sure there is one)."""
        if self.client is not None:
            return self.client
        if self.async_client is not None:
            return self.async_client
        raise ValueError("this ChatInferScale has no client: pass client=, async_client= or config=")

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="inferscale",
            ls_model_name=kwargs.get("model", self._name),
            ls_model_type="chat",
            ls_temperature=kwargs.get("temperature", self.temperature),
        )
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop := stop or self.stop:
            params["ls_stop"] = stop
        return params

    # ------------------------------------------------------------------ sync
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        deltas: list[str] = []
        for chunk in self._chat_chunks(messages, stop, kwargs):
            if chunk.result is not None:
                return _chat_result("".join(deltas), chunk.result, self._name)
            deltas.append(chunk.delta)
        raise RuntimeError("the InferScale stream ended without its result")  # the client always ends with one

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in self._chat_chunks(messages, stop, kwargs):
            generation = _generation_chunk(chunk, self._name)
            if run_manager and chunk.delta:
                run_manager.on_llm_new_token(chunk.delta, chunk=generation)
            yield generation

    def _chat_chunks(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> Iterator[ChatChunk]:
        client = self._sync_client()
        request = self._request(messages, stop, kwargs)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        chunks = client.chat(**request, stream=True)
        with contextlib.closing(chunks):  # leaving early ends the request and frees its KV cache
            for chunk in chunks:
                _check_deadline(deadline, self.timeout)
                yield chunk

    # ------------------------------------------------------------------ async
    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.async_client is None:
            return await super()._agenerate(messages, stop, run_manager, **kwargs)
        deltas: list[str] = []
        async for chunk in self._achat_chunks(messages, stop, kwargs):
            if chunk.result is not None:
                return _chat_result("".join(deltas), chunk.result, self._name)
            deltas.append(chunk.delta)
        raise RuntimeError("the InferScale stream ended without its result")

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        if self.async_client is None:
            async for generation in super()._astream(messages, stop, run_manager, **kwargs):
                yield generation
            return
        async for chunk in self._achat_chunks(messages, stop, kwargs):
            generation = _generation_chunk(chunk, self._name)
            if run_manager and chunk.delta:
                await run_manager.on_llm_new_token(chunk.delta, chunk=generation)
            yield generation

    async def _achat_chunks(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> AsyncIterator[ChatChunk]:
        assert self.async_client is not None  # callers check
        request = self._request(messages, stop, kwargs)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        chunks = await self.async_client.chat(**request, stream=True)
        try:
            async for chunk in chunks:
                _check_deadline(deadline, self.timeout)
                yield chunk
        finally:
            await chunks.aclose()

    # ------------------------------------------------------------------ request
    @property
    def _name(self) -> str:
        assert self.model_name is not None  # set by the validator
        return self.model_name

    def _sync_client(self) -> MemoryClient:
        if self.client is None:
            raise ValueError("this ChatInferScale has only an async_client: call it with ainvoke/astream")
        return self.client

    def _request(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The keyword arguments of ``client.chat`` for one call: the fields, overridden by the call's kwargs."""
        unknown = sorted(set(kwargs) - _CALL_KWARGS)
        if unknown:
            raise TypeError(f"ChatInferScale got unexpected call arguments {unknown}; it takes {sorted(_CALL_KWARGS)}")
        if "model" in kwargs and kwargs["model"] != self.model_name:
            raise InvalidInputError(f"model={kwargs['model']!r}: this ChatInferScale serves {self.model_name!r} only")
        prepared = prepare(messages)
        memory_ids = prepared.memory_ids
        if kwargs.get("memory_ids") is not None:
            memory_ids = list(dict.fromkeys([*(memory_ids or []), *kwargs["memory_ids"]]))
        request: dict[str, Any] = {
            "messages": prepared.messages,
            "user_id": kwargs.get("user_id", self.user_id),
            "agent_id": kwargs.get("agent_id", self.agent_id),
            "run_id": kwargs.get("memory_run_id", self.run_id),
            "mode": kwargs.get("mode", self.mode),
            "temperature": kwargs.get("temperature", self.temperature),
            "max_new_tokens": kwargs.get("max_tokens", self.max_tokens),
            "stop": stop if stop is not None else self.stop,
        }
        if memory_ids is not None:
            request["memory_ids"] = memory_ids
        else:
            request["limit"] = kwargs.get("limit", self.limit)
            request["filters"] = kwargs.get("filters")
        return request


# ---------------------------------------------------------------------- results
def _usage(result: InferScaleResult) -> UsageMetadata:
    """Token counts: input = the whole prompt (memory segment included), output = the tokens decoded. In KV mode the
    memory tokens were read from stored K/V, not prefilled: reported as ``cache_read``."""
    usage = UsageMetadata(
        input_tokens=result.prompt_tokens,
        output_tokens=result.generated_tokens,
        total_tokens=result.prompt_tokens + result.generated_tokens,
    )
    if result.mode == "kv":
        usage["input_token_details"] = {"cache_read": result.memory_tokens}
    return usage


def _response_metadata(result: InferScaleResult, model_name: str) -> dict[str, Any]:
    return {
        "model_name": model_name,
        "finish_reason": result.finish_reason,
        "memory_ids": list(result.memory_ids),
        "mode": result.mode,
        "memory_tokens": result.memory_tokens,
        "timings": {
            "retrieval_ms": result.timings.retrieval_ms,
            "kv_assembly_ms": result.timings.kv_assembly_ms,
            "prefill_ms": result.timings.prefill_ms,
            "ttft_ms": result.timings.ttft_ms,
            "total_ms": result.timings.total_ms,
        },
    }


def _chat_result(answer: str, result: InferScaleResult, model_name: str) -> ChatResult:
    message = AIMessage(
        content=answer, usage_metadata=_usage(result), response_metadata=_response_metadata(result, model_name)
    )
    return ChatResult(generations=[ChatGeneration(message=message)])


def _generation_chunk(chunk: ChatChunk, model_name: str) -> ChatGenerationChunk:
    if chunk.result is None:
        return ChatGenerationChunk(message=AIMessageChunk(content=chunk.delta))
    message = AIMessageChunk(
        content="",
        usage_metadata=_usage(chunk.result),
        response_metadata=_response_metadata(chunk.result, model_name),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=message, generation_info={"finish_reason": chunk.result.finish_reason})


def _check_deadline(deadline: float | None, timeout: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"ChatInferScale call ran past timeout={timeout}s")
