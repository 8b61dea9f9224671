"""InferScaleMemory and InferScaleContext without a model: the history window, the scope of the pass-throughs,
no memory message without memories."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.memory.inferscale import MEMORY_IDS_KEY, InferScaleContext, InferScaleMemory

from inferscale import AsyncMemoryClient, ConfigError, InvalidInputError, ScopeError
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient
from tests.unit_tests.stubs import HITS, StubClient


def words(text: str) -> list[str]:
    return text.split()


def memory_on(client: StubClient, **kwargs: object) -> InferScaleMemory:
    return InferScaleMemory.from_client(context={"user_id": "alice"}, client=client, tokenizer_fn=words, **kwargs)


def test_context_of_checks_the_scope() -> None:
    assert InferScaleContext.of({"user_id": "a"}).ids() == {"user_id": "a"}
    assert InferScaleContext.of({"user_id": "a"}, run_id="r").ids() == {"user_id": "a", "run_id": "r"}
    assert InferScaleContext.of(InferScaleContext.of(agent_id="g"), agent_id="h").ids() == {"agent_id": "h"}
    with pytest.raises(ScopeError):
        InferScaleContext.of({})
    with pytest.raises(InvalidInputError, match="unknown scope keys"):
        InferScaleContext.of({"session": "x"})
    assert InferScaleContext.of({"user_id": 7}).ids() == {"user_id": "7"}  # as MemoryClient and Mem0 take an int id
    for bad in (7.0, True, "", " ", ["a"]):
        with pytest.raises(ScopeError, match="non-empty string or an int"):
            InferScaleContext.of({"user_id": bad})
    with pytest.raises(InvalidInputError, match="at most 255"):
        InferScaleContext.of({"user_id": "u" * 256})


def turn(role: str, n_words: int, tag: str = "") -> ChatMessage:
    return ChatMessage(role=role, content=" ".join([tag or role] * n_words))


def test_the_window_keeps_the_last_turn_and_what_fits_never_opening_on_an_answer() -> None:
    memory = memory_on(StubClient())
    history = [turn("user", 5, "u1"), turn("assistant", 5, "a1"), turn("user", 5, "u2"), turn("assistant", 5, "a2")]
    history.append(turn("user", 5, "u3"))
    assert memory._window(history, 1000) == history
    assert memory._window(history, 15) == history[2:]  # u2 a2 u3
    assert memory._window(history, 10) == history[4:]  # a2 would open the window: left out
    assert memory._window(history, 1) == history[4:]  # the question stays past the budget
    assert memory._window([*history, turn("assistant", 50)], 1) == [history[4], turn("assistant", 50)]
    assert memory._window([], 10) == []


def test_search_and_add_stay_in_the_memorys_context() -> None:
    client = StubClient()
    memory = memory_on(client)
    memory.search("pets")
    memory.search("pets", user_id="alice", limit=3)
    memory.add([{"role": "user", "content": "I like tea."}])
    assert [c[1] for c in client.calls] == [
        {"query": "pets", "user_id": "alice"},
        {"query": "pets", "user_id": "alice", "limit": 3},
        {"messages": [{"role": "user", "content": "I like tea."}], "user_id": "alice"},
    ]
    for call in (lambda: memory.search("pets", user_id="bob"), lambda: memory.add("x", agent_id="helper")):
        with pytest.raises(InvalidInputError, match="outside this memory's context"):
            call()
    assert len(client.calls) == 3


def test_no_memory_message_without_memories() -> None:
    question = ChatMessage(role="user", content="What is my dog called?")
    memory = memory_on(StubClient())  # finds nothing
    memory.set([question])
    assert memory.get() == [question]
    memory = memory_on(StubClient(HITS))
    memory.set([question])
    first, *rest = memory.get()
    assert first.additional_kwargs[MEMORY_IDS_KEY] == ["m1"] and rest == [question]
    memory = memory_on(StubClient(HITS), similarity_top_k=0)
    memory.set([question])
    assert memory.get() == [question]


class RefusingClient(StubClient):
    """``add`` refuses with ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        super().add(messages, **kwargs)
        raise self.error


def test_a_message_stored_many_times_still_leaves_similarity_top_k_memories() -> None:
    """A review's find: the search asked for one hit more per message in view, so a question stored by three earlier
    sessions (or with other whitespace) took every slot and no memory was recalled; the search now widens."""
    question = "What is my dog called?"
    copies = [{"id": f"q{i}", "memory": text} for i, text in enumerate([question, question, f" {question}\n"])]
    facts = [{"id": "f1", "memory": "My dog is called Biscuit."}, {"id": "f2", "memory": "I live in Lisbon."}]
    client = StubClient(hits=[*copies, *facts])
    memory = memory_on(client, similarity_top_k=2)
    memory.put(ChatMessage(role="user", content=question))
    for got in (memory.get(), asyncio.run(memory.aget())):
        assert got[0].additional_kwargs[MEMORY_IDS_KEY] == ["f1", "f2"]
    limits = [kwargs["limit"] for name, kwargs in client.calls if name == "search"]
    assert limits == [3, 6, 3, 6]  # the first search of each came back with copies only


def test_a_message_refused_for_its_scope_is_raised_not_logged() -> None:
    """Only a refusal of what a message holds is logged and skipped: a scope refusal is the caller's to fix."""
    memory = memory_on(RefusingClient(ScopeError("set at least one of user_id, agent_id or run_id")))
    with pytest.raises(ScopeError):
        memory.put(ChatMessage(role="user", content="Hi"))


def test_messages_with_no_text_are_not_stored() -> None:
    client = StubClient()
    memory = memory_on(client)
    memory.put(ChatMessage(role="user", content="  "))
    memory.put(ChatMessage(role="user", content="Hi"))
    assert [c[1]["messages"] for c in client.calls] == [[{"role": "user", "content": "Hi"}]]
    assert len(memory.get_all()) == 2


def test_from_client_with_host_calls_that_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's report: ``from_client(context=..., api_key=KEY, host=URL)`` warned that both were ignored and
    wrote the memories to a new local store (loading the model), not to the server at ``host``."""
    monkeypatch.setenv("INFERSCALE_HOME", str(tmp_path))
    key = "isk_0123456789ab_s"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory = InferScaleMemory.from_client(context={"user_id": "maya"}, api_key=key, host="http://127.0.0.1:9/")
    assert type(memory.client) is RemoteMemoryClient and type(memory._async_client) is AsyncRemoteMemoryClient
    for connection in (memory.client._transport.connection, memory._async_client._transport.connection):
        assert (connection.base_url, connection.headers["Authorization"]) == ("http://127.0.0.1:9", f"Token {key}")
    assert list(tmp_path.iterdir()) == []  # no local store, no model


def test_from_client_refuses_host_with_a_client_and_warns_of_what_it_ignores() -> None:
    with pytest.raises(ConfigError, match="not both"):
        InferScaleMemory.from_client(context={"user_id": "maya"}, host="http://h:1", client=StubClient())
    with pytest.raises(ConfigError, match="not both"):  # the async calls would go elsewhere (a review's find)
        mine = AsyncMemoryClient(host="http://127.0.0.1:9")
        InferScaleMemory.from_client(context={"user_id": "maya"}, host="http://h:1", async_client=mine)
    with pytest.raises(ConfigError, match="host must be the server's http"):
        InferScaleMemory.from_client(context={"user_id": "maya"}, host="h:1")
    with pytest.warns(UserWarning, match=r"^api_key, org_id name Mem0's hosted platform and are ignored"):
        memory = InferScaleMemory.from_client(context={"user_id": "maya"}, api_key="k", org_id="o", client=StubClient())
    assert isinstance(memory.client, StubClient)
    with pytest.warns(UserWarning, match=r"^project_id name"):
        InferScaleMemory.from_client(context={"user_id": "maya"}, host="http://h:1", project_id="p")
