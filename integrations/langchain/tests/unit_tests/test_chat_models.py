"""ChatInferScale's request building, without a model: what reaches ``MemoryClient.chat``."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.globals import set_llm_cache
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_inferscale import ChatInferScale, memory_system_message

from inferscale import ChatChunk, InvalidInputError, Timings
from inferscale import ChatResult as InferScaleResult

_CONFIG = {"data_dir": tempfile.mkdtemp(prefix="langchain-inferscale-unit-"), "engine": {"dtype": "float32"}}


def _model(**fields: object) -> ChatInferScale:
    return ChatInferScale(config=_CONFIG, user_id="maya", **fields)


def test_model_name_defaults_to_the_clients() -> None:
    model = _model()
    assert model.model_name == "SmolLM2-135M-Instruct"
    assert model._get_ls_params()["ls_model_name"] == "SmolLM2-135M-Instruct"
    assert model._get_ls_params()["ls_provider"] == "inferscale"


def test_fields_reach_the_request() -> None:
    model = _model(max_tokens=7, temperature=0.5, stop=["x"], limit=3, mode="prompt")
    request = model._request([HumanMessage("hi")], None, {})
    assert request == {
        "messages": [{"role": "user", "content": "hi"}],
        "user_id": "maya",
        "agent_id": None,
        "run_id": None,
        "mode": "prompt",
        "temperature": 0.5,
        "max_new_tokens": 7,
        "stop": ["x"],
        "limit": 3,
        "filters": None,
    }


def test_call_kwargs_override_fields() -> None:
    request = _model(max_tokens=7)._request(
        [HumanMessage("hi")],
        ["stop"],
        {"user_id": "bob", "agent_id": "a", "memory_run_id": "r", "max_tokens": 3, "temperature": 0.0},
    )
    assert (request["user_id"], request["agent_id"], request["run_id"]) == ("bob", "a", "r")
    assert (request["max_new_tokens"], request["temperature"], request["stop"]) == (3, 0.0, ["stop"])


def test_tagged_ids_and_call_ids_are_injected_without_retrieval() -> None:
    messages = [memory_system_message([("m1", "My dog is Biscuit.")]), HumanMessage("dog?")]
    request = _model()._request(messages, None, {"memory_ids": ["m2", "m1"]})
    assert request["memory_ids"] == ["m1", "m2"]
    assert "limit" not in request and "filters" not in request
    assert request["messages"] == [{"role": "user", "content": "dog?"}]


def test_empty_memory_ids_inject_none() -> None:
    assert _model()._request([HumanMessage("hi")], None, {"memory_ids": []})["memory_ids"] == []


def test_unknown_call_kwargs_fail() -> None:
    with pytest.raises(TypeError, match="top_p"):
        _model()._request([HumanMessage("hi")], None, {"top_p": 0.9})


def test_another_model_name_fails() -> None:
    model = _model()
    assert model._request([HumanMessage("hi")], None, {"model": model.model_name})
    with pytest.raises(InvalidInputError, match="gpt"):
        model._request([HumanMessage("hi")], None, {"model": "gpt-4o"})


def test_unknown_fields_fail() -> None:
    with pytest.raises(ValueError, match="api_key"):
        ChatInferScale(config=_CONFIG, api_key="x")


def test_client_and_config_are_exclusive() -> None:
    model = _model()
    with pytest.raises(ValueError, match="not both"):
        ChatInferScale(client=model.client, config=_CONFIG)


def test_no_tool_calling() -> None:
    with pytest.raises(NotImplementedError):
        _model().bind_tools([])


def test_system_messages_stay_in_place() -> None:
    request = _model()._request([SystemMessage("a"), HumanMessage("b"), SystemMessage("c")], None, {})
    assert [m["role"] for m in request["messages"]] == ["system", "user", "system"]


def _fake_result() -> InferScaleResult:
    timings = Timings(retrieval_ms=1.0, kv_assembly_ms=1.0, prefill_ms=1.0, ttft_ms=3.0, total_ms=4.0)
    return InferScaleResult(
        answer="Biscuit.",
        memory_ids=["m1"],
        memories=["My dog is Biscuit."],
        mode="kv",
        timings=timings,
        prompt_tokens=10,
        memory_tokens=6,
        generated_tokens=2,
    )


class _Tokens(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)


@pytest.fixture
def fake_chat(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ChatInferScale`` answers from two canned chunks instead of the engine."""

    def chat_chunks(self: ChatInferScale, messages: Any, stop: Any, kwargs: Any) -> Iterator[ChatChunk]:
        self._request(messages, stop, kwargs)  # the call's arguments are still checked
        yield from (ChatChunk("Bis"), ChatChunk("cuit."), ChatChunk("", _fake_result()))

    monkeypatch.setattr(ChatInferScale, "_chat_chunks", chat_chunks)


@pytest.mark.usefixtures("fake_chat")
@pytest.mark.parametrize(
    ("fields", "kwargs", "streamed"),
    [
        ({}, {}, False),
        ({"streaming": True}, {}, True),
        ({}, {"stream": True}, True),
        ({"streaming": True}, {"stream": False}, False),
        ({"streaming": True, "disable_streaming": True}, {}, False),
    ],
)
def test_langchain_core_routes_streaming(fields: dict[str, Any], kwargs: dict[str, Any], streamed: bool) -> None:
    tokens = _Tokens()
    answer = _model(**fields).invoke("dog?", config={"callbacks": [tokens]}, **kwargs)
    assert answer.text == "Biscuit."
    assert answer.response_metadata["memory_ids"] == ["m1"]
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 2
    # on the streaming path langchain-core reports every chunk's text, the last chunk's "" included
    assert [token for token in tokens.tokens if token] == (["Bis", "cuit."] if streamed else [])


def test_the_global_cache_is_not_used_and_a_cache_never_crosses_users(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``set_llm_cache`` on, Maya got Bob's cached answer and memory ids: the cache key left out the scope."""
    answered: list[str] = []

    def chat_chunks(self: ChatInferScale, messages: Any, stop: Any, kwargs: Any) -> Iterator[ChatChunk]:
        user = self._request(messages, stop, kwargs)["user_id"]
        answered.append(user)
        yield from (ChatChunk(f"{user}'s PIN"), ChatChunk("", _fake_result()))

    monkeypatch.setattr(ChatInferScale, "_chat_chunks", chat_chunks)
    set_llm_cache(InMemoryCache())
    try:
        bob, maya = (ChatInferScale(config=_CONFIG, user_id=user) for user in ("bob", "maya"))
        assert [bob.invoke("PIN?").text, bob.invoke("PIN?").text] == ["bob's PIN", "bob's PIN"]
        assert maya.invoke("PIN?").text == "maya's PIN"
        assert answered == ["bob", "bob", "maya"]  # the global cache is not used: each call sees today's memories
    finally:
        set_llm_cache(None)
    shared = InMemoryCache()
    bob, maya = (ChatInferScale(config=_CONFIG, user_id=user, cache=shared) for user in ("bob", "maya"))
    assert [bob.invoke("PIN?").text, bob.invoke("PIN?").text, maya.invoke("PIN?").text] == [
        "bob's PIN",
        "bob's PIN",
        "maya's PIN",
    ]
    assert answered[3:] == ["bob", "maya"]  # a cache passed in is used, keyed by the scope
    other_store = {**_CONFIG, "data_dir": tempfile.mkdtemp(prefix="langchain-inferscale-other-")}
    assert ChatInferScale(config=other_store, user_id="bob", cache=shared).invoke("PIN?").text == "bob's PIN"
    assert answered[5:] == ["bob"]  # the same user of another store: not the first store's cached answer
    for url in ("sqlite:///:memory:", "sqlite://"):  # two in-memory stores are two stores
        assert ChatInferScale(config={**_CONFIG, "db_url": url}, user_id="bob", cache=shared).invoke("PIN?").text
    assert answered[6:] == ["bob", "bob"]


@pytest.mark.parametrize("field", ["client", "async_client"])
def test_a_remote_client_is_refused_with_what_to_use_instead(field: str) -> None:
    """A new user's report: ``ChatInferScale(client=MemoryClient(host=...))`` was a pydantic ValidationError saying
    only that the input should be an instance of MemoryClient."""
    from inferscale import AsyncMemoryClient, MemoryClient

    build = MemoryClient if field == "client" else AsyncMemoryClient
    remote = build(host="http://127.0.0.1:9", api_key="isk_0123456789ab_s")
    with pytest.raises(TypeError, match=rf"needs a local inferscale client as {field}=, got a \w*RemoteMemoryClient"):
        ChatInferScale(**{field: remote}, user_id="maya")
