"""The contexts the fidelity slices give their memories are the ones the product records: a LoCoMo conversation or
the demo added one session per ``add(infer=False)`` call encodes each memory after the scope's last memories (the
earlier sessions'), then the turns before it in its call (issue #10, run 23 in docs/architecture.md).

The reference is the real client on a tiny random Llama (lazy encoding: only the recorded contexts are read).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.encoding_layout import context_turns
from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity_cases import MAX_CONTEXT_TURNS, memories_with_contexts

SESSIONS = [
    ["s1 a", "s1 b", "s1 c"],
    ["s2 a", "s2 b"],
    ["s3 a", "s3 b", "s3 c", "s3 d", "s3 e", "s3 f", "s3 g"],
    ["s4 a"],
]


def _recorded_contexts(tmp_path: Path, sessions: list[list[str]], window: int) -> dict[str, list[str]]:
    """Each memory's stored context when the client adds ``sessions``, one ``add(infer=False)`` call each."""
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        "Memories:\n",
        model=tiny_model("llama", seed=0),
        tokenizer=byte_chat_tokenizer(),
    )
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(context_window=window, encode_on_add="lazy"))
    contexts: dict[str, list[str]] = {}
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        for turns in sessions:
            added = client.add([{"role": "user", "content": t} for t in turns], user_id="maya", infer=False)
            for result in added["results"]:
                record = client.db.get(result["id"])
                assert record is not None
                contexts[record.text] = record.context
    return contexts


@pytest.mark.parametrize("window", [1, 3, 5])
def test_each_memory_is_encoded_after_what_the_product_encodes_it_after(tmp_path: Path, window: int) -> None:
    recorded = _recorded_contexts(tmp_path, SESSIONS, window)
    memories, contexts = memories_with_contexts(SESSIONS)
    assert memories == [t for turns in SESSIONS for t in turns] == list(recorded)
    for text, context in zip(memories, contexts, strict=True):
        assert context_turns(context, window) == context_turns(recorded[text], window), text
    # a session's first turn follows the sessions before it
    assert contexts[memories.index("s2 a")] == ["s1 a", "s1 b", "s1 c"]
    assert contexts[memories.index("s4 a")][-3:] == ["s3 e", "s3 f", "s3 g"]


def test_a_repeated_text_keeps_the_context_the_product_records_for_it(tmp_path: Path) -> None:
    """A text said twice in a session, and again in a later one, is one memory with its first context; the turns
    after it count every occurrence, as the client's contexts do."""
    sessions = [["r a", "r b", "r a", "r c"], ["r b", "r d", "r e"]]
    recorded = _recorded_contexts(tmp_path, sessions, window=4)
    memories, contexts = memories_with_contexts(sessions)
    assert memories == ["r a", "r b", "r c", "r d", "r e"] == list(recorded)
    for text, context in zip(memories, contexts, strict=True):
        assert context_turns(context, 4) == context_turns(recorded[text], 4), text
    assert contexts[memories.index("r c")] == ["r a", "r b", "r a"]
    assert contexts[memories.index("r d")][-2:] == ["r c", "r b"]


def test_session_contexts_keep_the_turns_of_their_own_session_only() -> None:
    memories, contexts = memories_with_contexts(SESSIONS, across_sessions=False)
    assert contexts[memories.index("s2 a")] == []
    assert contexts[memories.index("s2 b")] == ["s2 a"]
    assert contexts[memories.index("s3 g")] == ["s3 a", "s3 b", "s3 c", "s3 d", "s3 e", "s3 f"]


def test_contexts_keep_the_last_turns_and_each_text_once() -> None:
    sessions = [[f"t{i}" for i in range(20)], ["t3", "new"]]
    memories, contexts = memories_with_contexts(sessions)
    assert memories == [f"t{i}" for i in range(20)] + ["new"]  # "t3" again is the same memory
    assert contexts[-1] == [f"t{i}" for i in range(5, 20)] + ["t3"]  # the last 16: 15 stored, then the call's turn
    assert all(len(c) <= MAX_CONTEXT_TURNS for c in contexts)
