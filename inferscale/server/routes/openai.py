"""OpenAI-compatible routes: ``POST /v1/chat/completions`` answered with KV-injected memory, and ``GET /v1/models``.

A chat request is checked like the vLLM server's (:mod:`inferscale.server.openai_chat`: unsupported fields refused,
content parts joined) and answered by ``client.chat(messages=..., stream=...)``: the memories of the scope named by
the ``inferscale`` object (or OpenAI's ``user``, which must then agree with ``inferscale.user_id``; or the API key's
one bound user) are retrieved and injected. A request that names no scope, from a caller whose key fills none in (an
open server, an admin key), is answered without memory, as OpenAI's API and the vLLM server answer it. OpenAI's
``developer`` role is a system message. The
reply is a ``chat.completion`` with ``usage`` and an ``inferscale`` object (``ChatResult.to_dict()`` without
``answer``: memory ids and texts, mode, timings in ms, token counts, finish reason); with ``stream: true`` it is a
stream of ``chat.completion.chunk`` events: the assistant role, the content deltas, a last chunk with
``finish_reason`` and the ``inferscale`` object, the usage chunk when ``stream_options.include_usage`` asks for it,
then ``[DONE]``. An error once the stream has started is sent as an ``{"error": {...}}`` event, then ``[DONE]``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from inferscale.errors import InferScaleError, InvalidInputError, budget_named
from inferscale.scope import ScopeIds
from inferscale.server.auth import Caller, CurrentCaller
from inferscale.server.disconnects import CLIENT_CLOSED_REQUEST, ClientDisconnected, unless_disconnected
from inferscale.server.errors import ERROR_RESPONSES, error_body, internal_error_content, request_id
from inferscale.server.metrics import Metrics
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
from inferscale.server.routes import route
from inferscale.server.schemas import ChatBody, ChatOptions
from inferscale.server.state import State
from inferscale.server.strict_json import StrictJSONRoute
from inferscale.types import ChatChunk, ChatResult

log = logging.getLogger(__name__)

router = APIRouter(tags=["openai"], responses=ERROR_RESPONSES, route_class=StrictJSONRoute)

_STARTED = int(time.time())


def _report(result: ChatResult) -> dict[str, Any]:
    """The reply's ``inferscale`` object: ``ChatResult.to_dict()`` without ``answer``."""
    report = result.to_dict()
    del report["answer"]
    return report


def _usage(result: ChatResult) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.generated_tokens,
        "total_tokens": result.prompt_tokens + result.generated_tokens,
    }


def _user_id(user: str | None, inferscale_user_id: str | None) -> str | None:
    """The chat's user id: ``inferscale.user_id``, else OpenAI's ``user``.

    Raises:
        InvalidInputError: when both are given and differ (neither is dropped silently).
    """
    if user is not None and inferscale_user_id is not None and user != inferscale_user_id:
        raise InvalidInputError(
            f"OpenAI's user {user!r} and inferscale.user_id {inferscale_user_id!r} name different users; "
            f"send one of them, or the same id in both"
        )
    return inferscale_user_id if inferscale_user_id is not None else user


NO_MEMORY_USER = "inferscale-chat-without-memory"
"""The scope id a chat without memory runs under (``memory_ids=[]``: nothing is read from it, and the transformers
engine shares no cache between requests), because ``chat`` always takes a scope."""


def _without_memory(caller: Caller, user_id: str | None, inferscale: ChatOptions | None) -> bool:
    """Whether a chat is answered without memory, as OpenAI's API (and the vLLM server) answers it: a plain OpenAI
    request (no ``user`` and no ``inferscale`` object: it asks nothing of memory) from a caller whose API key fills
    no scope in (an open server, or an admin key, which binds no list). A key that binds scope lists fills in its
    ids (or asks for one) as for any scoped call, and a request whose ``inferscale`` object asks anything of memory
    (an id, ``filters``, ``memory_ids``, ``limit``, ``search_query``, ``mode``) without naming whose is refused as in
    process (400 ``scope_required``)."""
    return user_id is None and inferscale is None and caller.unbound


@route(router, "POST", "/v1/chat/completions")
async def chat_completions(body: ChatBody, caller: CurrentCaller, server: State, http: Request) -> Response:
    """Answer a conversation with the scope's memories (OpenAI's chat completions; SSE with ``stream: true``). A
    client that goes away stops the answer: a stream when its response is closed, any other within
    :data:`~inferscale.server.disconnects.POLL_SECONDS` (the reply is then a bare 499, which nobody reads)."""
    request = body.model_dump(exclude_unset=True, exclude={"inferscale"})
    check_supported_fields(request)
    messages = chat_messages(request.get("messages"))
    options = body.inferscale or ChatOptions()
    user_id = _user_id(body.user, options.user_id)
    memory_ids = options.memory_ids
    limit = options.limit
    if _without_memory(caller, user_id, body.inferscale):
        ids = ScopeIds(user_id=NO_MEMORY_USER, agent_id=None, run_id=None)
        memory_ids = []
    else:
        ids = caller.scope(user_id, options.agent_id, options.run_id, options.filters)
        if limit is None and memory_ids is None:
            limit = server.options.chat_limit
    stream = False if body.stream is None else body.stream
    arguments: dict[str, Any] = dict(
        messages=messages,
        **ids,
        filters=options.filters,
        limit=limit,
        memory_ids=memory_ids,
        search_query=options.search_query,
        mode=options.mode,
        max_new_tokens=requested_max_tokens(request),
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=sampler_top_k(body.top_k),
        seed=body.seed,
        repetition_penalty=body.repetition_penalty,
        stop=body.stop,
    )
    reply = Completion.new(server.model_name)
    budget = budget_field(request)  # what a prompt too long for the context advises lowering (chat raises it first)
    if stream:
        with budget_named(budget):
            chunks = await server.client.chat(**arguments, stream=True)
        events = _events(chunks, reply, server.metrics, include_usage(request))
        return StreamingResponse(events, media_type="text/event-stream")
    try:
        with budget_named(budget):
            result = await unless_disconnected(http, server.client.chat(**arguments, stream=False))
    except ClientDisconnected as gone:
        log.info("%s; its chat was cancelled", gone)
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    server.metrics.observe_chat(result)
    content = reply.message(result.answer, result.finish_reason, usage=_usage(result), inferscale=_report(result))
    return JSONResponse(content)


async def _events(
    chunks: AsyncIterator[ChatChunk], reply: Completion, metrics: Metrics, usage_wanted: bool
) -> AsyncIterator[bytes]:
    """The SSE events of a streamed answer (see the module docstring). Closing this iterator (the client went away)
    closes ``chunks``, which stops the generation."""
    try:
        yield reply.chunk({"role": "assistant", "content": ""})
        async for chunk in chunks:
            if chunk.result is None:
                yield reply.chunk({"content": chunk.delta})
                continue
            metrics.observe_chat(chunk.result)
            yield reply.chunk({}, chunk.result.finish_reason, inferscale=_report(chunk.result))
            if usage_wanted:
                yield reply.usage_chunk(_usage(chunk.result))
    except InferScaleError as exc:
        yield sse(error_body(exc))
    except Exception as exc:  # the reply has started: report it in the stream, and log it
        log.error("request %s: a streamed chat failed", request_id(), exc_info=exc)
        yield sse(internal_error_content(exc))
    finally:
        await _close(chunks)
    yield SSE_DONE


async def _close(chunks: AsyncIterator[ChatChunk]) -> None:
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()


@route(router, "GET", "/v1/models")
async def models(caller: CurrentCaller, server: State) -> dict[str, Any]:
    """The served model (OpenAI's model list, one entry)."""
    model = {"id": server.model_name, "object": "model", "created": _STARTED, "owned_by": "inferscale"}
    return {"object": "list", "data": [model]}
