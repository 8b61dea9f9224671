"""create_agent with InferScaleMemoryMiddleware: K/V with ChatInferScale, text with any other chat model."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID, uuid4

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_inferscale import MEMORY_IDS_KEY, ChatInferScale, InferScaleMemoryMiddleware
from langchain_inferscale.messages import prepare

from inferscale import ChatMessage
from inferscale.client import MemoryClient
from tests.integration_tests.shared import MAX_TOKENS, shared_async_client


class ModelCalls(BaseCallbackHandler):
    """Records what each chat model call received: its messages and its call kwargs."""

    def __init__(self) -> None:
        self.messages: list[list[BaseMessage]] = []
        self.params: list[dict[str, Any]] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.messages.append(messages[0])
        self.params.append(kwargs.get("invocation_params", {}))


def _remember(client: MemoryClient, user_id: str, *facts: str) -> dict[str, str]:
    added = client.add([{"role": "user", "content": f} for f in facts], user_id=user_id, infer=False)
    return {r["memory"]: r["id"] for r in added["results"]}


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_agent_answers_from_kv_memory_without_its_text_in_the_prompt(client: MemoryClient) -> None:
    ids = _remember(client, "agent-kv", "My dog is called Biscuit.", "I live in Lisbon.", "I drink green tea.")
    calls = ModelCalls()
    agent = create_agent(
        model=ChatInferScale(client=client, max_tokens=MAX_TOKENS),
        middleware=[InferScaleMemoryMiddleware(client, user_id="agent-kv", limit=2)],
    )
    question = "What is my dog called?"
    state = agent.invoke({"messages": [{"role": "user", "content": question}]}, config={"callbacks": [calls]})

    answer = state["messages"][-1]
    assert isinstance(answer, AIMessage)
    assert "Biscuit" in answer.text

    # the middleware's ids reached the model as call kwargs, and the model injected exactly those as K/V
    [params] = calls.params
    assert ids["My dog is called Biscuit."] in params["memory_ids"]
    assert params["user_id"] == "agent-kv"
    assert answer.response_metadata["memory_ids"] == params["memory_ids"]
    assert answer.response_metadata["mode"] == "kv"

    # no memory text in what the framework sent, nor in the tokens prefilled after the memory segment
    [sent] = calls.messages
    assert not any(text in str(m.content) for m in sent for text in ids)
    engine = client.engine
    conversation = [ChatMessage(m["role"], m["content"]) for m in prepare(sent).messages]
    prefilled = engine.conversation_token_ids(conversation)
    injected = [client.get(i)["memory"] for i in answer.response_metadata["memory_ids"]]
    for text in injected:
        assert not _contains(prefilled, engine.fact_token_ids(text))
    memory_tokens = sum(len(engine.fact_token_ids(text)) for text in injected)
    assert answer.response_metadata["memory_tokens"] == memory_tokens
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["input_tokens"] == len(engine.system_prefix_ids()) + memory_tokens + len(prefilled)

    # the turn was written back (infer=False stores both messages as they are)
    stored = {m["memory"] for m in client.get_all(user_id="agent-kv")["results"]}
    assert {question, answer.text} <= stored


async def test_agent_async_path(client: MemoryClient) -> None:
    ids = _remember(client, "agent-async", "My cat is called Pixel.")
    calls = ModelCalls()
    agent = create_agent(
        model=ChatInferScale(client=client, max_tokens=MAX_TOKENS),
        middleware=[InferScaleMemoryMiddleware(client, user_id="agent-async", remember=False)],
    )
    state = await agent.ainvoke(
        {"messages": [{"role": "user", "content": "What is my cat called?"}]}, config={"callbacks": [calls]}
    )
    assert calls.params[0]["memory_ids"] == list(ids.values())
    assert state["messages"][-1].response_metadata["memory_ids"] == list(ids.values())


class NoSyncClient:
    """Stands for the sync client where only the async one may be used: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the sync client's {name} was used; the async hooks must use async_client")


async def test_agent_async_path_on_the_async_client(client: MemoryClient) -> None:
    ids = _remember(client, "agent-async-client", "My cat is called Pixel.")
    calls = ModelCalls()
    async_client = shared_async_client()
    agent = create_agent(
        model=ChatInferScale(async_client=async_client, max_tokens=MAX_TOKENS),
        middleware=[
            InferScaleMemoryMiddleware(NoSyncClient(), async_client=async_client, user_id="agent-async-client")  # type: ignore[arg-type]
        ],
    )
    question = "What is my cat called?"
    state = await agent.ainvoke({"messages": [{"role": "user", "content": question}]}, config={"callbacks": [calls]})
    answer = state["messages"][-1]
    assert calls.params[0]["memory_ids"] == list(ids.values())
    assert answer.response_metadata["memory_ids"] == list(ids.values())
    stored = {m["memory"] for m in client.get_all(user_id="agent-async-client")["results"]}
    assert {question, answer.text} <= stored  # written back by aafter_agent on the async client


def test_a_repeated_question_does_not_recall_itself(client: MemoryClient) -> None:
    ids = _remember(client, "agent-repeat", "My dog is called Biscuit.", "I live in Lisbon.", "I drink green tea.")
    calls = ModelCalls()
    agent = create_agent(
        model=ChatInferScale(client=client, max_tokens=MAX_TOKENS),
        middleware=[InferScaleMemoryMiddleware(client, user_id="agent-repeat", limit=1)],
    )
    question = "What is my dog called?"
    for _ in range(2):  # two conversations; the first stores the question (infer=False)
        agent.invoke({"messages": [{"role": "user", "content": question}]}, config={"callbacks": [calls]})
    stored = {m["memory"]: m["id"] for m in client.get_all(user_id="agent-repeat")["results"]}
    assert question in stored
    assert calls.params[0]["memory_ids"] == [ids["My dog is called Biscuit."]]
    assert stored[question] not in calls.params[1]["memory_ids"]
    assert calls.params[1]["memory_ids"] == [ids["My dog is called Biscuit."]]


def test_fake_model_gets_memory_text_in_the_system_message(client: MemoryClient) -> None:
    ids = _remember(client, "agent-text", "My dog is called Biscuit.")
    calls = ModelCalls()
    model = GenericFakeChatModel(messages=iter([AIMessage("Your dog is called Biscuit.")]))
    agent = create_agent(
        model=model,
        system_prompt="You are terse.",
        middleware=[InferScaleMemoryMiddleware(client, user_id="agent-text")],
    )
    agent.invoke({"messages": [{"role": "user", "content": "What is my dog called?"}]}, config={"callbacks": [calls]})

    [sent] = calls.messages
    system = sent[0]
    assert system.type == "system"
    assert "You are terse." in system.text
    assert "My dog is called Biscuit." in system.text
    assert system.additional_kwargs[MEMORY_IDS_KEY] == list(ids.values())
    assert "memory_ids" not in calls.params[0]
    stored = {m["memory"] for m in client.get_all(user_id="agent-text")["results"]}
    assert "Your dog is called Biscuit." in stored


def test_one_agent_serves_users_by_context(client: MemoryClient) -> None:
    alice = _remember(client, "ctx-alice", "My dog is called Biscuit.")
    bob = _remember(client, "ctx-bob", "My dog is called Rex.")
    calls = ModelCalls()
    agent = create_agent(
        model=GenericFakeChatModel(messages=iter([AIMessage("ok"), AIMessage("ok")])),
        middleware=[InferScaleMemoryMiddleware(client, remember=False)],
    )
    for user in ("ctx-alice", "ctx-bob"):
        agent.invoke(
            {"messages": [{"role": "user", "content": "What is my dog called?"}]},
            config={"callbacks": [calls]},
            context={"user_id": user},
        )
    assert [m[0].additional_kwargs[MEMORY_IDS_KEY] for m in calls.messages] == [
        list(alice.values()),
        list(bob.values()),
    ]
    assert "Rex" not in calls.messages[0][0].text and "Biscuit" not in calls.messages[1][0].text


def test_one_kv_agent_serves_users_by_context(client: MemoryClient) -> None:
    alice = _remember(client, "kv-ctx-alice", "My dog is called Biscuit.")
    bob = _remember(client, "kv-ctx-bob", "My dog is called Rex.")
    default = _remember(client, "kv-ctx-default", "My dog is called Max.")
    added = client.add("My dog is called Pepper.", agent_id="kv-ctx-agent", infer=False)
    agent_memories = [r["id"] for r in added["results"]]
    calls = ModelCalls()
    agent = create_agent(
        model=ChatInferScale(client=client, user_id="kv-ctx-model", max_tokens=MAX_TOKENS),
        middleware=[InferScaleMemoryMiddleware(client, user_id="kv-ctx-default", remember=False)],
    )
    runs = [
        ({"user_id": "kv-ctx-alice"}, ("kv-ctx-alice", None), list(alice.values())),
        ({"user_id": "kv-ctx-bob"}, ("kv-ctx-bob", None), list(bob.values())),
        (None, ("kv-ctx-default", None), list(default.values())),
        ({"agent_id": "kv-ctx-agent"}, (None, "kv-ctx-agent"), agent_memories),  # not the default user's
    ]
    for context, _, _ in runs:
        agent.invoke(
            {"messages": [{"role": "user", "content": "What is my dog called?"}]},
            config={"callbacks": [calls]},
            context=context,
        )
    for params, (_, (user_id, agent_id), memory_ids) in zip(calls.params, runs, strict=True):
        assert (params["user_id"], params["agent_id"], params["memory_run_id"]) == (user_id, agent_id, None)
        assert params["memory_ids"] == memory_ids


LONG_QUESTION = "Please summarise: " + "lorem ipsum " * 420  # 5,058 characters: over max_memory_chars=4,000
IMAGE_ONLY = [{"type": "image", "url": "https://example.com/cat.png"}]


@pytest.mark.parametrize(
    ("user_content", "stored_question"),
    [(IMAGE_ONLY, None), (LONG_QUESTION, None), ("Where do I live?", "Where do I live?")],
    ids=["image-only", "longer-than-a-memory", "plain"],
)
@pytest.mark.parametrize("run", ["sync", "async", "async-client"])
async def test_the_write_back_never_loses_the_answer_over_what_a_message_holds(
    client: MemoryClient, caplog: pytest.LogCaptureFixture, user_content: Any, stored_question: str | None, run: str
) -> None:
    """A user turn holding only an image, or more than a memory holds, made ``after_agent``'s ``add`` raise
    after the model had answered: ``invoke`` raised InvalidInputError and the answer was lost (a new user's find).
    The answer is returned, and what can be a memory is stored."""
    user = f"writeback-{uuid4().hex}"
    model = GenericFakeChatModel(messages=iter([AIMessage("Here is my answer.")]))
    middleware = InferScaleMemoryMiddleware(
        NoSyncClient() if run == "async-client" else client,  # type: ignore[arg-type]
        async_client=shared_async_client() if run == "async-client" else None,
        user_id=user,
    )
    agent = create_agent(model=model, middleware=[middleware])
    request = {"messages": [{"role": "user", "content": user_content}]}
    with caplog.at_level(logging.WARNING, logger="inferscale.write_back"):
        state = agent.invoke(request) if run == "sync" else await agent.ainvoke(request)
    assert state["messages"][-1].text == "Here is my answer."
    stored = sorted(m["memory"] for m in client.get_all(user_id=user)["results"])
    assert stored == sorted(filter(None, [stored_question, "Here is my answer."]))
    refused = [r for r in caplog.records if "was not stored as a memory" in r.getMessage()]
    assert len(refused) == (user_content is LONG_QUESTION)
    if refused:
        assert "5,058 characters" in refused[0].getMessage() and "max_memory_chars" in refused[0].getMessage()
