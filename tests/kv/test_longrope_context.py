"""A ``longrope`` model's context window is the part where its RoPE is static (``original_max_position_embeddings``):
past it transformers rotates every position of the longer sequence with the long factors, so injected keys and the
cached system prefix would no longer be what the model computes for that request (docs/architecture.md, "RoPE
coverage")."""

from __future__ import annotations

from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder
from tiny_models import LONGROPE_ORIGINAL_MAX, byte_chat_tokenizer, tiny_model

from inferscale import InvalidInputError, MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.hf.layout_only import max_positions
from inferscale.engines.transformers import TransformersEngine

SYSTEM_PROMPT = "Memories:\n"
QUESTION = "What is my dog called?"


def _engine() -> TransformersEngine:
    model = tiny_model("llama_longrope")
    assert model.config.max_position_embeddings > LONGROPE_ORIGINAL_MAX
    config = EngineConfig(dtype="float32", device="cpu", max_new_tokens=2)
    return TransformersEngine(config, SYSTEM_PROMPT, model=model, tokenizer=byte_chat_tokenizer())


def test_the_context_window_stops_where_longrope_stops_being_static() -> None:
    engine = _engine()
    assert engine.max_context_tokens == LONGROPE_ORIGINAL_MAX == max_positions(tiny_model("llama_longrope").config)
    assert max_positions(tiny_model("llama").config) == tiny_model("llama").config.max_position_embeddings


@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_a_chat_whose_prompt_passes_the_static_part_is_refused_not_served(tmp_path: Path, mode: str) -> None:
    """The failing input: one memory ending 8 positions short of 256, and a question that takes the prompt past it.
    The chat was served in both modes, its first-token logits 3e-3 from a fresh forward pass (the query prefilled
    with the long factors after keys rotated with the short ones); it is refused before any prefill."""
    engine = _engine()
    config = MemoryConfig(
        data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(context_window=0, encode_on_add="eager")
    )
    room = LONGROPE_ORIGINAL_MAX - 8 - len(engine.system_prefix_ids()) - len(engine.fact_token_ids(""))
    text = "Saga: " + "s" * (room - 6)
    assert len(engine.system_prefix_ids()) + len(engine.fact_token_ids(text)) == LONGROPE_ORIGINAL_MAX - 8
    assert len(engine.query_token_ids(QUESTION)) + 2 > 8
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add(text, user_id="u", infer=False)["results"]]
        forwards: list[int] = []
        real = engine._forward
        engine._forward = lambda *a, **k: forwards.append(1) or real(*a, **k)  # type: ignore[method-assign]
        refused = f"the model's maximum context length is {LONGROPE_ORIGINAL_MAX} tokens"
        with pytest.raises(InvalidInputError, match=refused):
            client.chat(QUESTION, user_id="u", mode=mode, memory_ids=[memory_id])
        assert forwards == []
        with pytest.raises(InvalidInputError, match=f"{LONGROPE_ORIGINAL_MAX} tokens"):
            client.add("Longer: " + "s" * LONGROPE_ORIGINAL_MAX, user_id="u", infer=False)
        assert [m["memory"] for m in client.get_all(user_id="u")["results"]] == [text]
