"""``/v1/chat/completions`` on the tiny engine: the reply against the client's own ``chat`` on the same memories,
streams joining to the answer, OpenAI fields (unsupported ones refused, content parts, ``top_k`` 0, usage chunk),
and errors raised after a stream started sent as an SSE event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from server_harness import Served
from tiny_models import counted_forwards

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.errors import ContextLengthError, DatabaseUnavailableError, EngineClosedError
from inferscale.types import ChatChunk

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": [{"type": "text", "text": "Where do "}, {"type": "text", "text": "I live?"}]},
]
CHAT: dict[str, Any] = {"model": "tiny", "messages": CONVERSATION, "user": "alice", "max_tokens": 12}


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with served.http() as client:
        for fact in ("I live in Porto.", "My dog is called Biscuit.", "I work as a nurse."):
            client.post("/v1/memories/", json={"messages": fact, "user_id": "alice", "infer": False}).raise_for_status()
        yield client


def _events(reply: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE reply, JSON-decoded (``"[DONE]"`` as is)."""
    assert reply.headers["content-type"].startswith("text/event-stream")
    data = [line.removeprefix("data: ") for line in reply.text.splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def test_the_reply_is_the_clients_chat_in_openais_shape(http: httpx.Client, served: Served) -> None:
    reply = http.post("/v1/chat/completions", json={**CHAT, "inferscale": {"limit": 2}}).json()
    assert reply["object"] == "chat.completion" and reply["model"] == "SmolLM2-135M-Instruct"
    (choice,) = reply["choices"]
    report = reply["inferscale"]
    assert set(report) == {
        "memory_ids", "memories", "mode", "timings", "prompt_tokens", "memory_tokens", "generated_tokens", "extra",
        "finish_reason", "recomputed_tokens",
    }  # fmt: skip
    assert report["memories"][0] == "I live in Porto." and len(report["memory_ids"]) == 2 and report["mode"] == "kv"
    assert choice["finish_reason"] == report["finish_reason"]
    assert reply["usage"] == {
        "prompt_tokens": report["prompt_tokens"],
        "completion_tokens": report["generated_tokens"],
        "total_tokens": report["prompt_tokens"] + report["generated_tokens"],
    }
    # the same call in process, on the server's engine and database: the same answer and memories
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where do I live?"}]
    local = asyncio.run(_local_chat(served, messages))
    assert (choice["message"]["content"], report["memory_ids"]) == (local.answer, local.memory_ids)


async def _local_chat(served: Served, messages: list[dict[str, str]]) -> Any:
    client = AsyncMemoryClient(served.config, engine=served.client.engine, embedder=served.client.embedder)
    try:
        return await client.chat(messages=messages, user_id="alice", limit=2, max_new_tokens=12)
    finally:
        await client.close()


def test_a_stream_joins_to_the_answer_and_ends_with_the_report_and_usage(http: httpx.Client) -> None:
    whole = http.post("/v1/chat/completions", json=CHAT).json()
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = _events(http.post("/v1/chat/completions", json=body))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    last, usage = chunks[-2], chunks[-1]
    assert last["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert last["inferscale"]["memory_ids"] == whole["inferscale"]["memory_ids"]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]


def test_openai_fields_are_honoured_or_refused(http: httpx.Client) -> None:
    greedy = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
    neutral = {**CHAT, "top_k": 0, "logprobs": False, "tools": [], "n": 1, "presence_penalty": 0}
    assert http.post("/v1/chat/completions", json=neutral).json()["choices"][0]["message"]["content"] == greedy
    # what a plain text answer on the one tier asks for anyway, as SDK wrappers send it (refused before)
    defaults = {**CHAT, "response_format": {"type": "text"}, "service_tier": "auto", "modalities": ["text"]}
    assert http.post("/v1/chat/completions", json=defaults).json()["choices"][0]["message"]["content"] == greedy
    for field, value in [
        ("response_format", {"type": "json_object"}),
        ("service_tier", "flex"),
        ("modalities", ["audio"]),
    ]:
        refused_value = http.post("/v1/chat/completions", json={**CHAT, field: value})
        assert (
            refused_value.status_code == 400
            and f"unsupported field(s) for a memory chat: {field};" in refused_value.text
        )
    refused = http.post("/v1/chat/completions", json={**CHAT, "tools": [{"type": "function"}], "n": 2})
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert message.startswith("unsupported field(s) for a memory chat: tools, n=2 (one answer per request: n may be")
    assert message.endswith(", and n=1") and ", n," not in message  # it listed n as supported while refusing it
    image = {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert "content part 0 is not a text part" in http.post("/v1/chat/completions", json=image).text
    bad = http.post("/v1/chat/completions", json={**CHAT, "temperature": -1})
    assert bad.json()["error"]["message"] == "temperature must be >= 0 (0 is greedy), got -1.0"


def test_stream_options_are_openais_flags_or_refused(http: httpx.Client) -> None:
    """A non-boolean ``include_usage`` sent no usage chunk and said nothing (a helper's find with the OpenAI SDK)."""
    for options in ({"include_usage": "yes"}, {"include_usage": 1}, {"include_usage": True, "extra": True}):
        refused = http.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": options})
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_input"), options
        assert "stream_options" in refused.json()["error"]["message"]
    flags = {"include_usage": True, "include_obfuscation": False}
    taken = http.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": flags})
    *_, usage, done = _events(taken)
    assert (usage["choices"], done) == ([], "[DONE]") and usage["usage"]["completion_tokens"] > 0


def test_openais_user_and_inferscale_user_id_must_agree(http: httpx.Client) -> None:
    clash = http.post("/v1/chat/completions", json={**CHAT, "user": "bob", "inferscale": {"user_id": "alice"}})
    assert clash.status_code == 400 and clash.json()["error"]["code"] == "invalid_input"
    assert clash.json()["error"]["message"] == (
        "OpenAI's user 'bob' and inferscale.user_id 'alice' name different users; send one of them, or the same id "
        "in both"
    )
    both = http.post("/v1/chat/completions", json={**CHAT, "inferscale": {"user_id": "alice", "limit": 1}}).json()
    named = http.post("/v1/chat/completions", json={**CHAT, "user": None, "inferscale": {"user_id": "alice"}}).json()
    assert len(both["inferscale"]["memory_ids"]) == 1 and len(named["inferscale"]["memory_ids"]) == 3


HIDDEN_DB = "postgresql+psycopg://inferscale:***@10.0.0.5:5432/memories"


async def _failing_stream(failure: BaseException) -> AsyncIterator[ChatChunk]:
    yield ChatChunk("Hel")
    raise failure


@pytest.mark.parametrize(
    ("failure", "code", "type_name"),
    [
        (EngineClosedError("the engine was closed"), "engine_closed", "EngineClosedError"),
        (RuntimeError("boom"), "internal_error", "ServerError"),
        (
            DatabaseUnavailableError(f"cannot connect to the database {HIDDEN_DB}"),
            "database_unavailable",
            "DatabaseUnavailableError",
        ),
    ],
)
def test_an_error_after_the_stream_started_is_an_sse_event(
    served: Served, monkeypatch: pytest.MonkeyPatch, failure: BaseException, code: str, type_name: str
) -> None:
    async def chat(**kwargs: Any) -> AsyncIterator[ChatChunk]:
        return _failing_stream(failure)

    monkeypatch.setattr(served.client, "chat", chat)
    with served.http() as http:
        reply = http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert reply.status_code == 200
    events = _events(reply)
    assert [e["choices"][0]["delta"] for e in events[:2]] == [{"role": "assistant", "content": ""}, {"content": "Hel"}]
    assert events[2]["error"]["code"] == code and events[2]["error"]["type"] == type_name
    assert events[3:] == ["[DONE]"]
    message = events[2]["error"]["message"]
    if isinstance(failure, EngineClosedError):
        assert message == str(failure)
    else:  # its text is the server's to know (the database's address leaked in the stream): logged under the id
        assert str(failure) not in message and HIDDEN_DB not in message
        assert message.endswith(f"the server log has the details (request {reply.headers['x-request-id']})")


async def _local_chat_without_memory(served: Served, messages: list[dict[str, str]]) -> Any:
    client = AsyncMemoryClient(served.config, engine=served.client.engine, embedder=served.client.embedder)
    try:
        return await client.chat(messages=messages, user_id="alice", memory_ids=[], max_new_tokens=12)
    finally:
        await client.close()


PLAIN = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where do I live?"}]


def test_a_chat_that_names_no_user_is_answered_without_memory(http: httpx.Client, served: Served) -> None:
    """As OpenAI's API and the vLLM server answer it (an open server here, an admin key below): no memory injected,
    the answer the client gives in process with no memories."""
    anonymous = {"model": "tiny", "messages": PLAIN, "max_tokens": 12}
    reply = http.post("/v1/chat/completions", json=anonymous)
    assert reply.status_code == 200, reply.text
    report = reply.json()["inferscale"]
    assert (report["memory_ids"], report["memories"], report["memory_tokens"]) == ([], [], 0)
    local = asyncio.run(_local_chat_without_memory(served, PLAIN))
    assert reply.json()["choices"][0]["message"]["content"] == local.answer
    streamed = _events(http.post("/v1/chat/completions", json={**anonymous, "stream": True}))
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in streamed[:-1] if c["choices"])
    assert text == local.answer and streamed[-2]["inferscale"]["memory_ids"] == []
    # asking for memory without saying whose is still refused, as in process
    for asks in ({"limit": 2}, {"mode": "kv"}, {}):  # an inferscale object asks for memory, even an empty one
        refused = http.post("/v1/chat/completions", json={**anonymous, "inferscale": asks})
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "scope_required"), asks
    # naming the user still injects that user's memories
    named = http.post("/v1/chat/completions", json={**anonymous, "user": "alice"}).json()
    assert len(named["inferscale"]["memory_ids"]) == 3


def test_a_key_decides_whether_a_chat_without_a_user_has_memory(http: httpx.Client, served: Served) -> None:
    _, admin = served.keys.create("admin", admin=True)
    _, alice = served.keys.create("alice", user_ids=["alice"])
    _, both = served.keys.create("alice and bob", user_ids=["alice", "bob"])
    anonymous = {"model": "tiny", "messages": PLAIN, "max_tokens": 12}
    with served.http(admin) as as_admin, served.http(alice) as as_alice, served.http(both) as as_both:
        assert as_admin.post("/v1/chat/completions", json=anonymous).json()["inferscale"]["memory_ids"] == []
        assert len(as_alice.post("/v1/chat/completions", json=anonymous).json()["inferscale"]["memory_ids"]) == 3
        several = as_both.post("/v1/chat/completions", json=anonymous)
        assert (several.status_code, several.json()["error"]["code"]) == (403, "permission_denied")


def test_openais_developer_role_is_a_system_message(http: httpx.Client) -> None:
    as_system = http.post("/v1/chat/completions", json={**CHAT, "messages": PLAIN}).json()
    developer = [{"role": "developer", "content": "Answer briefly."}, PLAIN[1]]
    as_developer = http.post("/v1/chat/completions", json={**CHAT, "messages": developer})
    assert as_developer.status_code == 200, as_developer.text
    assert as_developer.json()["choices"][0]["message"]["content"] == as_system["choices"][0]["message"]["content"]
    assert as_developer.json()["usage"] == as_system["usage"]
    other = [{"role": "developer", "content": "Answer in French."}, PLAIN[1]]
    assert http.post("/v1/chat/completions", json={**CHAT, "messages": other}).json()["usage"] != as_system["usage"]


def test_an_answer_the_openai_sdk_dumped_is_taken_back_as_the_next_turns_history(http: httpx.Client) -> None:
    """The official SDK's ``message.model_dump()`` holds its unset fields as null; a multi-turn loop that appended it
    got a 400 (a helper's find). Its null fields change nothing: the reply equals the plain history's."""
    first = http.post("/v1/chat/completions", json={**CHAT, "messages": PLAIN}).json()["choices"][0]["message"]
    unset = {"refusal": None, "annotations": None, "audio": None, "function_call": None, "tool_calls": None}
    history = [*PLAIN, {**first, **unset}, {"role": "user", "content": "And again?"}]
    dumped = http.post("/v1/chat/completions", json={**CHAT, "messages": history})
    assert dumped.status_code == 200, dumped.text
    plain = http.post("/v1/chat/completions", json={**CHAT, "messages": [*PLAIN, first, history[-1]]}).json()
    assert dumped.json()["choices"] == plain["choices"] and dumped.json()["usage"] == plain["usage"]
    with_a_call = [*PLAIN, {**first, "tool_calls": [{"id": "c1", "type": "function"}]}, history[-1]]
    refused = http.post("/v1/chat/completions", json={**CHAT, "messages": with_a_call})
    assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_input")


def test_a_client_that_goes_away_stops_its_non_streamed_answer(
    http: httpx.Client, served: Served, chat_engine: Any
) -> None:
    """A non-streamed chat whose client disconnected was decoded to the end of its budget for nobody (and counted as
    a 200): five such requests held both cores for minutes. It is now cancelled within a poll of the connection and
    a token; the next chat answers as before."""
    import time

    before = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
    with counted_forwards(chat_engine, delay_s=0.02) as forwards:
        with served.http() as impatient, pytest.raises(httpx.TimeoutException):
            impatient.post("/v1/chat/completions", json={**CHAT, "max_tokens": 300}, timeout=0.5)
        time.sleep(1.5)  # a poll (0.25 s) and a token: the rest of 300 forward passes would take over 5 s
        seen = len(forwards)
        time.sleep(0.5)
        assert len(forwards) == seen < 120
    assert http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"] == before


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_prompt_past_the_context_is_context_length_exceeded_advising_the_requests_own_budget_field(
    http: httpx.Client, served: Served, field: str, stream: bool
) -> None:
    """The route advised lowering ``max_new_tokens``, the Python client's argument, which an OpenAI request does not
    have. The remote client, whose wire field is ``max_tokens``, still names its own argument."""
    budget = served.client.engine.max_context_tokens
    body = {"model": "tiny", "messages": CONVERSATION, "user": "alice", field: budget, "stream": stream}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["type"]) == ("context_length_exceeded", "ContextLengthError")
    assert error["message"].startswith("the prompt needs ")
    # OpenAI's and vLLM's wording, which agent frameworks look for to tell a context overflow from other 400s
    # (LangChain's OpenAI chat model did not see InferScale's: a helper's find)
    assert f"the model's maximum context length is {budget} tokens" in error["message"]
    assert error["message"].endswith(f"; send a shorter conversation or lower {field}")  # no memory fitted
    assert "max_new_tokens" not in error["message"]
    with (
        MemoryClient(host=served.url) as remote,
        pytest.raises(ContextLengthError, match=r"send a shorter conversation or lower max_new_tokens$"),
    ):
        remote.chat("Where do I live?", user_id="alice", max_new_tokens=budget, stream=stream)
