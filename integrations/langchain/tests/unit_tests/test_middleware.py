"""InferScaleMemoryMiddleware's model-call hook without a model: the scope and ids it hands on."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from langchain.agents.middleware import ModelRequest
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_inferscale import ChatInferScale, InferScaleMemoryMiddleware
from pydantic import BaseModel

from inferscale.errors import MemoryTooLongError, ScopeError

_CONFIG = {"data_dir": tempfile.mkdtemp(prefix="langchain-inferscale-unit-"), "engine": {"dtype": "float32"}}


class FakeClient:
    """``search`` answers ``hits`` (best first) and records its arguments."""

    def __init__(self, *hits: tuple[str, str]) -> None:
        self.hits = hits
        self.searches: list[dict[str, Any]] = []

    def search(self, query: str, **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
        self.searches.append({"query": query, **kwargs})
        return {"results": [{"id": i, "memory": m} for i, m in self.hits][: kwargs["limit"]]}


def _call(
    middleware: InferScaleMemoryMiddleware,
    messages: list[BaseMessage],
    context: object = None,
    model: BaseChatModel | None = None,
) -> ModelRequest:
    """The request ``wrap_model_call`` hands to the model."""
    model = model or ChatInferScale(config=_CONFIG, user_id="model-default")
    runtime = SimpleNamespace(context=context)
    request = ModelRequest(model=model, messages=messages, runtime=runtime)  # type: ignore[arg-type]
    seen: list[ModelRequest] = []

    def handler(request: ModelRequest) -> AIMessage:
        seen.append(request)
        return AIMessage("ok")

    middleware.wrap_model_call(request, handler)  # type: ignore[arg-type]
    return seen[0]


def test_no_query_still_sends_the_runs_scope_and_no_ids() -> None:
    client = FakeClient(("m1", "My dog is called Biscuit."))
    middleware = InferScaleMemoryMiddleware(client, user_id="maya")  # type: ignore[arg-type]
    sent = _call(middleware, [HumanMessage(content=[])], context={"user_id": "bob"})
    assert client.searches == []
    assert sent.model_settings == {"memory_ids": [], "user_id": "bob", "agent_id": None, "memory_run_id": None}


def test_text_path_without_a_query_is_unchanged() -> None:
    middleware = InferScaleMemoryMiddleware(FakeClient(), user_id="maya")  # type: ignore[arg-type]
    request_model = GenericFakeChatModel(messages=iter([]))
    sent = _call(middleware, [HumanMessage(content=[])], model=request_model)
    assert sent.model_settings == {} and sent.system_message is None


@pytest.mark.parametrize(
    ("context", "scope"),
    [
        (None, {"user_id": "maya", "agent_id": None, "run_id": "r0"}),
        ({"tenant": "t"}, {"user_id": "maya", "agent_id": None, "run_id": "r0"}),
        ({"agent_id": "x"}, {"user_id": None, "agent_id": "x", "run_id": None}),
        ({"user_id": "bob", "agent_id": None}, {"user_id": "bob", "agent_id": None, "run_id": None}),
    ],
)
def test_a_context_that_sets_any_scope_key_is_the_whole_scope(
    context: dict[str, Any] | None, scope: dict[str, str | None]
) -> None:
    client = FakeClient(("m1", "My dog is called Biscuit."))
    middleware = InferScaleMemoryMiddleware(client, user_id="maya", run_id="r0")  # type: ignore[arg-type]
    sent = _call(middleware, [HumanMessage("dog?")], context=context)
    [search] = client.searches
    assert {key: search[key] for key in scope} == scope
    assert (sent.model_settings["user_id"], sent.model_settings["memory_run_id"]) == (scope["user_id"], scope["run_id"])


@dataclass
class DataclassContext:
    user_id: str | None = None
    agent_id: str | None = None
    tenant: str = "t"


class PydanticContext(BaseModel):
    run_id: str | None = None


@pytest.mark.parametrize(
    ("context", "scope"),
    [
        (DataclassContext(user_id="bob"), {"user_id": "bob", "agent_id": None, "run_id": None}),
        (DataclassContext(), {"user_id": "maya", "agent_id": None, "run_id": "r0"}),
        (PydanticContext(run_id="r9"), {"user_id": None, "agent_id": None, "run_id": "r9"}),
        (SimpleNamespace(agent_id="x"), {"user_id": None, "agent_id": "x", "run_id": None}),
    ],
)
def test_a_context_schema_object_sets_the_scope_as_a_dict_does(context: object, scope: dict[str, str | None]) -> None:
    """A dataclass context (LangGraph's own example of ``context_schema``) was ignored: Bob's run searched and stored
    under the constructor's user, Maya."""
    client = FakeClient(("m1", "My dog is called Biscuit."))
    middleware = InferScaleMemoryMiddleware(client, user_id="maya", run_id="r0")  # type: ignore[arg-type]
    sent = _call(middleware, [HumanMessage("dog?")], context=context)
    [search] = client.searches
    assert {key: search[key] for key in scope} == scope
    assert (sent.model_settings["user_id"], sent.model_settings["memory_run_id"]) == (scope["user_id"], scope["run_id"])


def test_messages_being_sent_are_not_recalled() -> None:
    question, answer = "What is my dog called?", "Your dog is Biscuit."
    client = FakeClient(
        ("q", question), ("a", answer), ("f1", "My dog is called Biscuit."), ("f2", "I live in Lisbon.")
    )
    middleware = InferScaleMemoryMiddleware(client, user_id="maya", limit=1)  # type: ignore[arg-type]
    sent = _call(middleware, [HumanMessage(question)])
    assert client.searches[0]["limit"] == 2  # one more, for the one message that could come back
    assert sent.model_settings["memory_ids"] == ["a"]
    sent = _call(middleware, [HumanMessage(question), AIMessage(answer), HumanMessage(f" {question} ")])
    assert sent.model_settings["memory_ids"] == ["f1"]


def test_a_message_stored_many_times_still_leaves_limit_memories() -> None:
    """A review's find: the search asked for one hit more per message, so a question stored by three earlier runs
    (or with other whitespace) took every slot and nothing was recalled; the search now widens while hits are left
    out."""
    question = "What is my dog called?"
    copies = [("q1", question), ("q2", question), ("q3", f" {question}\n")]
    client = FakeClient(*copies, ("f1", "My dog is called Biscuit."), ("f2", "I live in Lisbon."))
    middleware = InferScaleMemoryMiddleware(client, user_id="maya", limit=2)  # type: ignore[arg-type]
    sent = _call(middleware, [HumanMessage(question)])
    assert sent.model_settings["memory_ids"] == ["f1", "f2"]
    assert [s["limit"] for s in client.searches] == [3, 6]  # the first one came back with copies only


class RefusingClient:
    """``add`` refuses with ``error``, and records each call's messages."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.added: list[list[dict[str, str]]] = []

    def add(self, messages: list[dict[str, str]], **kwargs: Any) -> dict[str, Any]:
        self.added.append(messages)
        raise self.error


def test_a_write_back_refused_for_its_scope_is_raised_not_logged() -> None:
    """Only refusals of what a message holds are logged and skipped: a scope refusal is the caller's to fix."""
    client = RefusingClient(ScopeError("set at least one of user_id, agent_id or run_id"))
    middleware = InferScaleMemoryMiddleware(client)  # type: ignore[arg-type]
    state = {"messages": [HumanMessage("Hi"), AIMessage("Hello!")]}
    with pytest.raises(ScopeError):
        middleware.after_agent(state, SimpleNamespace(context=None))  # type: ignore[arg-type]
    assert client.added == [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]]


def test_a_refused_turn_is_stored_message_by_message() -> None:
    client = RefusingClient(MemoryTooLongError("message 0 has 5,058 characters"))
    middleware = InferScaleMemoryMiddleware(client, user_id="maya")  # type: ignore[arg-type]
    state = {"messages": [HumanMessage("Hi"), AIMessage("Hello!")]}
    middleware.after_agent(state, SimpleNamespace(context=None))  # type: ignore[arg-type]
    user, answer = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}
    assert client.added == [[user, answer], [user], [answer]]
