"""A config dict is read in the shape its fields show (issue 15, item 7): ``MemoryConfig`` fields, Mem0's
``{"provider": ..., "config": {...}}`` sections, or both side by side; a section that fits neither is a
``ConfigError`` naming the section and the keys that do not fit. Building a client does no I/O, so no database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from inferscale import AsyncMemoryClient, Memory, MemoryClient, MemoryConfig
from inferscale.config import EmbedderConfig, KVConfig, LLMConfig
from inferscale.errors import ConfigError
from inferscale.mem0_config import config_from_dict, from_mem0_dict, is_mem0_config

ENDPOINT = "http://127.0.0.1:9/v1"

# dicts of MemoryConfig fields, llm and embedder included: each must equal MemoryConfig(**it)
OURS: dict[str, dict[str, Any]] = {
    "endpoint": {
        "llm": {"provider": "openai", "base_url": ENDPOINT, "model": "qwen", "api_key": "k", "reconcile": False},
        "embedder": {"model": "/models/minilm", "device": "cpu"},
    },
    "limits only": {"llm": {"max_new_tokens": 200, "check_grounding": False}, "embedder": {"device": "cuda"}},
    "empty sections": {"llm": {}, "embedder": {}},
    "engine provider": {"llm": {"provider": "engine"}, "engine": {"dtype": "float32"}},
    "openai provider alone": {"llm": {"provider": "openai"}},
    "models": {"llm": LLMConfig(reconcile_top_k=3), "embedder": EmbedderConfig(model="/m"), "kv": KVConfig()},
    "with the rest": {
        "llm": {"model": "m", "provider": "openai", "base_url": ENDPOINT},
        "kv": {"context_window": 3},
        "db_url": "sqlite:////tmp/never-opened.db",
        "max_memory_chars": 100,
    },
}


@pytest.mark.parametrize("config", list(OURS.values()), ids=list(OURS))
def test_a_dict_of_memory_config_fields_is_that_config(config: dict[str, Any]) -> None:
    expected = MemoryConfig(**config)
    assert not is_mem0_config(config)
    assert config_from_dict(config) == expected
    assert config_from_dict(config) == expected
    for build in (MemoryClient, Memory.from_config):
        assert build(config).config == expected, build
    for build_async in (AsyncMemoryClient, AsyncMemoryClient.from_config):
        assert build_async(config).config == expected, build_async


def test_mem0_sections_are_translated_and_our_sections_pass_through(tmp_path: Path) -> None:
    mem0 = {
        "llm": {"provider": "vllm", "config": {"model": "qwen", "vllm_base_url": ENDPOINT, "max_tokens": 300}},
        "embedder": {"provider": "huggingface", "config": {"model": "/models/minilm"}},
        "data_dir": str(tmp_path),
    }
    translated = MemoryConfig(
        llm=LLMConfig(provider="openai", base_url=ENDPOINT, model="qwen", max_new_tokens=300),
        embedder=EmbedderConfig(model="/models/minilm"),
        data_dir=str(tmp_path),
    )
    assert is_mem0_config(mem0)
    assert config_from_dict(mem0) == Memory.from_config(mem0).config == from_mem0_dict(mem0) == translated
    # a provider Mem0 names without its config block is still Mem0's: the local engine
    assert config_from_dict({"llm": {"provider": "huggingface"}}) == MemoryConfig()
    assert config_from_dict({"embedder": {"provider": "huggingface"}}) == MemoryConfig()
    # each section is read in its own shape, so the two can sit side by side
    mixed = {"llm": mem0["llm"], "embedder": {"model": "/models/minilm"}, "data_dir": str(tmp_path)}
    assert config_from_dict(mixed) == MemoryClient(mixed).config == translated
    mixed = {"embedder": mem0["embedder"], "llm": {"reconcile": False}, "version": "v1.1"}
    assert config_from_dict(mixed) == MemoryConfig(llm=LLMConfig(reconcile=False), embedder=translated.embedder)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        # Mem0's provider next to our field
        ({"llm": {"provider": "vllm", "model": "x"}}, r"'llm'\] names provider 'vllm'.*\['model'\]"),
        ({"embedder": {"provider": "huggingface", "model": "/m"}}, r"'embedder'.*\['provider'\]"),
        ({"llm": {"provider": "openai", "config": {"model": "m"}, "reconcile": False}}, r"'llm'.*'config'"),
        ({"llm": {"temperature": 0.1}}, r"'llm'.*\['temperature'\]"),
        ({"llm": "openai"}, r"'llm'\] must be a dict"),
        ({"embedder": ["huggingface"]}, r"'embedder'\] must be a dict"),
        ({"llm": {"max_new_tokens": 1}}, "max_new_tokens"),  # our shape, a value out of range
        ({"engine": {"dtype": "float64"}}, "dtype"),
        ({"llm": {"provider": "openai", "config": {}}}, "config.model"),  # Mem0's shape, incomplete
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_a_config_that_fits_neither_shape_names_what_is_wrong(bad: dict[str, Any], message: str) -> None:
    for build in (config_from_dict, MemoryClient, Memory.from_config, AsyncMemoryClient):
        with pytest.raises(ConfigError, match=message):
            build(bad)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"max_model_len": 8192}, "engine max_model_len=8192: it is vLLM's"),
        ({"kv_cache_bytes": 1 << 30, "max_model_len": 8192}, "max_model_len=8192 and kv_cache_bytes=1073741824: they"),
    ],
)
def test_vllms_limits_are_refused_for_the_transformers_engine(engine: dict[str, Any], message: str) -> None:
    """vLLM's context limit had no setting in the memory config (only ``inferscale serve --max-model-len``): a client
    moved to vLLM served 4096 tokens of SmolLM2's 8192. Now it has one, which the transformers engine would ignore."""
    with pytest.raises(ConfigError, match=message):
        MemoryClient({"engine": engine})
    vllm = MemoryConfig.model_validate({"engine": {"provider": "vllm", **engine}}).engine
    assert (vllm.max_model_len, vllm.kv_cache_bytes) == (engine.get("max_model_len"), engine.get("kv_cache_bytes"))


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "CPU "])
def test_an_unknown_device_is_refused_in_one_line_naming_it(device: str) -> None:
    """``--device tpu`` loaded the model and then failed in torch; a config error printed pydantic's four-line text
    with a link. Now: one line, naming the field and the value."""
    with pytest.raises(ConfigError) as refused:
        config_from_dict({"engine": {"device": device}})
    message = str(refused.value)
    assert message.startswith("invalid InferScale config: engine.device: String should match pattern")
    assert f"(got {device!r})" in message and "\n" not in message
    assert config_from_dict({"engine": {"device": "cuda:1"}, "embedder": {"device": "auto"}}).engine.device == "cuda:1"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"max_memory_chars": True}, "max_memory_chars"),  # was 1: every memory cut to one character
        ({"engine": {"max_new_tokens": True}}, "engine.max_new_tokens"),
        ({"kv": {"context_window": True}}, "kv.context_window"),
        ({"llm": {"reconcile": "yes"}}, "llm.reconcile"),  # was True
        ({"max_memory_chars": "4000"}, "max_memory_chars"),  # was 4000
        ({"search": {"gpu": 1}}, "search.gpu"),
        ({"engine": {"num_threads": True}}, "engine.num_threads.constrained-int"),
        ({"kv": {"memory_attention_scale": "0.5"}}, "kv.memory_attention_scale"),
        ({"kv": {"memory_temperature": True}}, "kv.memory_temperature"),
        ({"search": {"rebuild_growth": "3"}}, "search.rebuild_growth"),
        ({"kv": {"position_buckets": [True, 2]}}, "kv.position_buckets.0"),
        ({"kv": {"position_buckets": ["0", "8"]}}, "kv.position_buckets.0"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_refused_not_coerced(config: dict[str, Any], field: str) -> None:
    """Settings are read as strictly as method arguments (docs/api.md: ``1`` and ``"yes"`` are not bools): a
    mistyped ``True`` was read as 1 and a string as its number (an API contract review)."""
    with pytest.raises(ConfigError, match=f"invalid InferScale config: {re.escape(field)}: Input should be a valid"):
        config_from_dict(config)
    read = MemoryConfig.model_validate({"kv": {"memory_attention_scale": 1, "position_buckets": [0, 128]}}).kv
    assert (read.memory_attention_scale, read.position_buckets) == (1.0, (0, 128))  # an int is a float; JSON lists
