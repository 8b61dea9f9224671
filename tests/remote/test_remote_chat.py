"""``chat`` on the remote clients against a scripted server: the OpenAI-shaped request with the ``inferscale``
object, the :class:`ChatResult` rebuilt from the reply, and streams read from server-sent events (chunks, the last
one's result, errors before and during the stream)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from remote_wire import Wire

from inferscale import ChatChunk, ChatMessage, ChatResult, Timings
from inferscale.errors import EngineClosedError, InvalidInputError, ScopeError, ServerError

RESULT = ChatResult(
    answer="Your dog is Biscuit.",
    memory_ids=["m2", "m1"],
    memories=["I have a beagle named Biscuit.", "I live in Porto."],
    mode="prompt",
    timings=Timings(retrieval_ms=1.5, kv_assembly_ms=0.0, prefill_ms=12.25, ttft_ms=20.0, total_ms=80.5),
    prompt_tokens=57,
    memory_tokens=21,
    generated_tokens=7,
    finish_reason="length",
)


def report(result: ChatResult = RESULT) -> dict[str, Any]:
    """The reply's ``inferscale`` object: ``ChatResult.to_dict()`` without the answer."""
    return {k: v for k, v in result.to_dict().items() if k != "answer"}


def completion(result: ChatResult = RESULT) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "SmolLM2-135M-Instruct",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": result.answer}, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 57, "completion_tokens": 7, "total_tokens": 64},
        "inferscale": report(result),
    }


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice], **extra}


def sse(*events: dict[str, Any] | str) -> httpx.Response:
    """A ``text/event-stream`` reply of ``events`` (a str is sent as it is, e.g. ``"[DONE]"``)."""
    lines = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content="".join(lines).encode())


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Your dog "}),
    chunk({"content": "is Biscuit."}),
    chunk({}, "length", inferscale=report()),
    "[DONE]",
]


def test_a_chat_sends_openais_body_with_the_inferscale_object_and_returns_the_result(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json=completion()))
    result = wire.client().chat(
        "What is my dog called?",
        user_id="u",
        agent_id="a",
        limit=2,
        mode="prompt",
        max_new_tokens=7,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=3,
        repetition_penalty=1.1,
        stop=["\n"],
    )
    assert result == RESULT
    assert (wire.last.method, wire.last.url.path) == ("POST", "/v1/chat/completions")
    assert wire.body() == {
        "messages": [{"role": "user", "content": "What is my dog called?"}],
        "stream": False,
        "max_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 3,
        "repetition_penalty": 1.1,
        "stop": ["\n"],
        "inferscale": {"user_id": "u", "agent_id": "a", "limit": 2, "mode": "prompt"},
    }


@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_a_chat_naming_no_scope_is_sent_for_the_server_to_fill_in(wire: Wire, mode: Any) -> None:
    """As ``search``: the server fills in the user of a key bound to one, or refuses the chat (ScopeError). It used to
    be refused here before sending, so a key bound to one user could search without ids but not chat. The
    ``inferscale`` object is always sent, so the server never takes it for a plain OpenAI request (answered
    without memory)."""
    wire.answer(httpx.Response(200, json=completion()))
    assert wire.client().chat("What is my dog called?", mode=mode) == RESULT
    assert wire.body()["inferscale"] == {"mode": mode}


def test_a_conversation_of_message_objects_and_dicts_is_sent_as_openai_messages(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json=completion()))
    messages = [ChatMessage("system", "Be brief."), {"role": "user", "content": "Hi", "name": "maya"}]
    wire.client().chat(
        messages=messages, filters={"user_id": "u"}, memory_ids=("m2", "m1"), search_query="dog", run_id="r"
    )
    body = wire.body()
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi", "name": "maya"},
    ]
    assert body["inferscale"] == {
        "run_id": "r",
        "filters": {"user_id": "u"},
        "memory_ids": ["m2", "m1"],
        "search_query": "dog",
        "mode": "kv",
    }


def test_a_stream_yields_the_deltas_then_the_result(wire: Wire) -> None:
    wire.answer(sse(*STREAM))
    chunks = wire.client().chat_stream("What is my dog called?", user_id="u", mode="prompt")
    assert chunks == [ChatChunk("Your dog "), ChatChunk("is Biscuit."), ChatChunk("", RESULT)]
    assert wire.body()["stream"] is True
    assert wire.last.headers["accept"] == "text/event-stream"


def test_content_on_the_last_event_comes_before_the_result(wire: Wire) -> None:
    wire.answer(sse(chunk({"content": "Your dog is Biscuit."}, "length", inferscale=report()), "[DONE]"))
    chunks = wire.client().chat_stream("What is my dog called?", user_id="u")
    assert chunks == [ChatChunk("Your dog is Biscuit."), ChatChunk("", RESULT)]


def test_a_refused_stream_raises_from_the_call_itself(wire: Wire) -> None:
    wire.answer(wire.error("scope_required", "at least one of user_id, agent_id or run_id is required", 400))
    with pytest.raises(ScopeError, match="at least one"):
        wire.client().chat_stream_open("Hi")


def read(m: Any, stream: Any) -> tuple[list[ChatChunk], BaseException | None]:
    """The chunks of an open stream of either remote client, and the error that ended it (``None`` at its end)."""
    if m.kind == "remote":
        got: list[ChatChunk] = []
        try:
            got.extend(stream)
        except Exception as exc:  # returned for the test to check
            return got, exc
        return got, None

    async def collect() -> tuple[list[ChatChunk], BaseException | None]:
        seen: list[ChatChunk] = []
        try:
            async for item in stream:
                seen.append(item)
        except Exception as exc:  # returned for the test to check
            return seen, exc
        return seen, None

    return m._runner.run(collect())


def test_an_error_event_during_the_stream_raises_its_type_after_the_chunks_before_it(wire: Wire) -> None:
    error = {"error": {"code": "engine_closed", "type": "EngineClosedError", "message": "the engine was closed"}}
    wire.answer(sse(chunk({"role": "assistant", "content": ""}), chunk({"content": "Your"}), error, "[DONE]"))
    m = wire.client()
    chunks, raised = read(m, m.chat_stream_open("Hi", user_id="u"))
    assert chunks == [ChatChunk("Your")]
    assert type(raised) is EngineClosedError and str(raised) == "the engine was closed"


@pytest.mark.parametrize(
    ("events", "match"),
    [
        ([chunk({"content": "Your"}), "[DONE]"], "ended before its last chunk"),
        ([chunk({"content": "Your"})], "ended before its last chunk"),
        (["not json"], "not JSON"),
        ([chunk({}, "stop", inferscale={"memory_ids": []})], "malformed"),
        ([chunk({}, "stop", inferscale=report()), chunk({"content": "more"})], "after its last chunk"),
        ([{"error": "no details"}], "malformed error event"),
    ],
)
def test_a_malformed_stream_is_a_server_error(wire: Wire, events: list[Any], match: str) -> None:
    wire.answer(sse(*events))
    with pytest.raises(ServerError, match=match):
        wire.client().chat_stream("Hi", user_id="u")


def test_a_json_reply_to_a_stream_is_a_server_error(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json=completion()))
    with pytest.raises(ServerError, match="event stream"):
        wire.client().chat_stream("Hi", user_id="u")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query": "Hi", "messages": [{"role": "user", "content": "Hi"}]}, "either a query"),
        ({}, "neither was given"),
        ({"query": "Hi", "max_new_tokens": 0}, "^max_new_tokens must be"),  # the wire's name is max_tokens
        ({"query": "Hi", "stream": "yes"}, "stream"),
        ({"query": "Hi", "top_k": 0}, "top_k"),  # the wire's "every token"
        ({"query": "Hi", "top_k": -1}, "top_k"),
    ],
)
def test_a_chat_that_cannot_be_sent_is_refused_before_sending(wire: Wire, kwargs: dict[str, Any], match: str) -> None:
    call = dict(kwargs)
    query = call.pop("query", None)
    with pytest.raises(InvalidInputError, match=match):
        wire.client().chat(query, user_id="u", **call)
    assert wire.requests == []


def test_closing_a_stream_early_closes_its_connection(wire: Wire) -> None:
    closed: list[bool] = []

    class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
        def __init__(self, content: bytes) -> None:
            self.content = content

        def __iter__(self) -> Any:
            yield self.content

        async def __aiter__(self) -> Any:
            yield self.content

        def close(self) -> None:
            closed.append(True)

        async def aclose(self) -> None:
            closed.append(True)

    content = sse(*STREAM).content
    wire.answer(
        lambda request: httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Body(content))
    )
    m = wire.client()
    stream = m.chat_stream_open("Hi", user_id="u")
    if wire.kind == "remote":
        assert next(stream) == ChatChunk("Your dog ")
        stream.close()
    else:

        async def first_then_close() -> ChatChunk:
            got = await anext(stream)
            await stream.aclose()
            return got

        assert m._runner is not None
        assert m._runner.run(first_then_close()) == ChatChunk("Your dog ")
    assert closed == [True]
