"""Two users never see each other's memories through any class; a Mem0Memory program changes only its import;
the retriever and the memory blocks on the real llama-index-core."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.memory import Memory
from llama_index.memory.inferscale import (
    MEMORY_IDS_KEY,
    InferScaleKVMemoryBlock,
    InferScaleLLM,
    InferScaleMemory,
    InferScaleMemoryBlock,
    InferScaleRetriever,
)

from inferscale import MemoryClient, MemoryNotFoundError
from inferscale.config import inferscale_home
from tests.integration_tests.shared import MAX_NEW_TOKENS

USERS = ("alice", "bob")


def test_two_users_never_see_each_others_memories(client: MemoryClient, memory_ids: dict[str, set[str]]) -> None:
    question = "Where do I live and what is my pet called?"
    for user in USERS:
        other = memory_ids["bob" if user == "alice" else "alice"]
        # InferScaleMemory
        memory = InferScaleMemory.from_client(context={"user_id": user}, client=client)
        memory.set([ChatMessage(role="user", content=question)])  # stored as a memory of the user too
        own = {m["id"] for m in client.get_all(user_id=user)["results"]}
        tagged = memory.get()[0].additional_kwargs[MEMORY_IDS_KEY]
        assert tagged and set(tagged) <= own and not set(tagged) & other
        # InferScaleRetriever (sync and async)
        retriever = InferScaleRetriever(client, user_id=user, similarity_top_k=10)
        nodes = retriever.retrieve(question)
        assert nodes and {n.node.node_id for n in nodes} <= own and not {n.node.node_id for n in nodes} & other
        assert all(n.node.metadata == {"user_id": user} for n in nodes)
        assert [n.node.node_id for n in asyncio.run(retriever.aretrieve(question))] == [n.node.node_id for n in nodes]
        # the memory blocks
        messages = [ChatMessage(role="user", content=question)]
        text = asyncio.run(InferScaleMemoryBlock(client, user_id=user).aget(messages))
        assert text and all(
            line[2:] in {m["memory"] for m in client.get_all(user_id=user)["results"]} for line in text.splitlines()
        )
        (block_message,) = asyncio.run(InferScaleKVMemoryBlock(client, user_id=user).aget(messages))
        assert not set(block_message.additional_kwargs[MEMORY_IDS_KEY]) & other
        # InferScaleLLM: retrieval stays in its scope, and another user's ids are refused
        llm = InferScaleLLM(client, user_id=user, max_new_tokens=4)
        assert not set(llm.complete(question).raw["result"].memory_ids) & other
        foreign = ChatMessage(role="system", content="", additional_kwargs={MEMORY_IDS_KEY: sorted(other)[:1]})
        with pytest.raises(MemoryNotFoundError):
            llm.chat([foreign, ChatMessage(role="user", content=question)])


def test_the_kv_memory_block_feeds_inferscale_llm_through_llamaindex_memory(client: MemoryClient) -> None:
    client.add("My dog is a beagle named Biscuit.", user_id="erin", infer=False)  # a user no chat test wrote to
    block = InferScaleKVMemoryBlock(client, user_id="erin", similarity_top_k=2)
    memory = Memory.from_defaults(session_id="block-test", token_limit=2000, memory_blocks=[block])
    memory.put(ChatMessage(role="user", content="What is my dog called?"))
    messages = memory.get()
    tagged = [m for m in messages if MEMORY_IDS_KEY in m.additional_kwargs]
    assert len(tagged) == 1 and "Biscuit" in (tagged[0].content or "")
    result = InferScaleLLM(client, user_id="erin", max_new_tokens=MAX_NEW_TOKENS).chat(messages).raw["result"]
    assert result.memory_ids == tagged[0].additional_kwargs[MEMORY_IDS_KEY]
    asyncio.run(block.aput([ChatMessage(role="user", content="My favourite food is ramen.")]))
    assert any(m["memory"] == "My favourite food is ramen." for m in client.get_all(user_id="erin")["results"])


MEM0_PROGRAM = """
{import_line}
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM

context = {{"user_id": "carol"}}
memory = Mem0Memory.from_client(context=context, api_key="<your-mem0-api-key>", search_msg_limit=4)
memory.add([{{"role": "user", "content": "My favourite colour is green."}}], user_id="carol")
chat_engine = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=memory)
response = chat_engine.chat("Hi, my name is Carol. What is my favourite colour?")
seen = memory.get()
"""


def test_a_mem0memory_program_changes_only_its_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(inferscale_home() / "models")  # the converted model; data goes to tmp_path
    monkeypatch.setenv("INFERSCALE_HOME", str(home))
    program = MEM0_PROGRAM.format(
        import_line="from llama_index.memory.inferscale import InferScaleMemory as Mem0Memory"
    )
    scope: dict[str, object] = {}
    with pytest.warns(UserWarning, match="api_key"):
        exec(compile(program, "mem0_program.py", "exec"), scope)
    seen = scope["seen"]
    assert isinstance(seen, list) and seen[0].role == "system" and "green" in (seen[0].content or "")
    assert str(scope["response"])
    memory = scope["memory"]
    assert isinstance(memory, InferScaleMemory) and (home / "data").is_dir()
    memory.client.close()


def test_from_config_builds_its_client(tmp_path: Path) -> None:
    memory = InferScaleMemory.from_config(
        context={"user_id": "dave"},
        config={"data_dir": str(tmp_path), "engine": {"dtype": "float32"}},
        search_msg_limit=2,
    )
    memory.put(ChatMessage(role="user", content="I play the cello."))
    assert memory.client.get_all(user_id="dave")["results"][0]["memory"] == "I play the cello."
    assert memory.search_msg_limit == 2 and memory.get_all()[0].content == "I play the cello."
    memory.client.close()
