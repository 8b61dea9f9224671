"""A model that cannot run the configured attention implementation (Gemma 2 has no SDPA support) is a
:class:`~inferscale.errors.ConfigError` naming ``engine.attn_implementation`` and the setting that runs it, on every
path that loads it; it was transformers' ``ValueError``, raised by every chat after ``add`` had stored memories."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers
from mem0_fakes import HashEmbedder
from tiny_models import TINY, byte_chat_tokenizer

from inferscale import ConfigError, MemoryClient, MemoryConfig
from inferscale.config import EngineConfig, KVConfig
from inferscale.engines.hf import load_causal_lm


@pytest.fixture(scope="module")
def gemma2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-gemma2")
    config = transformers.Gemma2Config(**{**TINY, "head_dim": 16})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    return folder


def test_an_attention_the_model_lacks_is_a_config_error_naming_the_setting(gemma2_folder: Path, tmp_path: Path) -> None:
    config = EngineConfig(model=str(gemma2_folder), dtype="float32", device="cpu")
    assert config.attn_implementation == "sdpa_gqa"
    with pytest.raises(
        ConfigError, match=r"engine\.attn_implementation='sdpa_gqa'.*set engine\.attn_implementation='eager'"
    ) as refused:
        load_causal_lm(config, tmp_path)
    # a tester found it wrapped in a second ConfigError telling the user to point engine.model at another folder
    assert "holds no model" not in str(refused.value)
    assert str(refused.value).startswith(f"engine.model {str(gemma2_folder)!r} cannot run")
    assert not isinstance(refused.value.__cause__, ConfigError)
    eager = config.model_copy(update={"attn_implementation": "eager"})
    _, model, _ = load_causal_lm(eager, tmp_path)
    assert type(model).__name__ == "Gemma2ForCausalLM"


def test_a_chat_on_such_a_model_is_a_config_error_and_the_memory_stays(gemma2_folder: Path, tmp_path: Path) -> None:
    engine = EngineConfig(model=str(gemma2_folder), dtype="float32", device="cpu", max_new_tokens=2)
    config = MemoryConfig(data_dir=str(tmp_path / "data"), engine=engine, kv=KVConfig(encode_on_add="lazy"))
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        client.add("My dog is called Pixel.", user_id="u", infer=False)
        for mode in ("kv", "prompt"):
            with pytest.raises(ConfigError, match="attn_implementation"):
                client.chat("What is my dog called?", user_id="u", mode=mode)
        assert [m["memory"] for m in client.get_all(user_id="u")["results"]] == ["My dog is called Pixel."]


def test_a_folder_that_holds_no_causal_lm_is_not_blamed_on_the_attention(tmp_path: Path) -> None:
    """A review found every ``ValueError`` of the weight load read as a missing attention implementation: a T5 folder
    was told to set ``attn_implementation='eager'``, even when it already was."""
    folder = tmp_path / "t5"
    config = transformers.T5Config(vocab_size=257, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    for attention in ("sdpa_gqa", "eager"):
        engine = EngineConfig(model=str(folder), dtype="float32", device="cpu", attn_implementation=attention)
        with pytest.raises(ConfigError, match=r"holds no model that can be loaded .*T5Config") as refused:
            load_causal_lm(engine, tmp_path)
        assert "attn_implementation" not in str(refused.value)
