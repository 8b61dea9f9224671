"""The engine contract (:class:`inferscale.engines.base.Engine`): both engines implement every member with the same
signature. mypy checks the conformance statically (``_conforms_to_engine`` at the end of each engine's module);
these tests check the signatures at run time, the lifecycle calls that need no model, and that every call that runs
the model loads it first."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from tiny_models import byte_chat_tokenizer, tiny_engine, tiny_model

from inferscale.config import EngineConfig
from inferscale.engines.base import Engine
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv import EncodeRequest


def _members() -> list[str]:
    names = [n for n, v in vars(Engine).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    return sorted(names + list(Engine.__annotations__))


def _signature(cls: type, name: str) -> Any:
    member = inspect.getattr_static(cls, name)
    if isinstance(member, property):
        return "property"
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


def test_contract_members() -> None:
    assert _members() == sorted(
        [
            "close",
            "context_token_ids",
            "control_token_texts",
            "conversation_token_ids",
            "device",
            "encode_facts",
            "encodes_chains",
            "fact_token_ids",
            "fingerprint",
            "first_token_logits",
            "generate_kv",
            "generate_prompt",
            "load",
            "load_encoder",
            "max_context_tokens",
            "model",
            "model_lock",
            "query_token_ids",
            "reset_prefix_cache",
            "serving",
            "stream_kv",
            "stream_prompt",
            "system_prefix_ids",
            "tokenizer",
        ]
    )


def _engine_classes() -> list[type]:
    classes: list[type] = [TransformersEngine]
    try:
        from inferscale.engines.vllm import VLLMEngine
    except ImportError:  # vllm not installed: mypy still checks VLLMEngine against the contract
        return classes
    return [*classes, VLLMEngine]


@pytest.mark.parametrize("cls", _engine_classes(), ids=lambda c: c.__name__)
def test_every_member_has_the_contract_signature(cls: type) -> None:
    for name in _members():
        if name == "serving":
            continue  # an instance attribute, set by the constructor
        assert _signature(cls, name) == _signature(Engine, name), name


def test_close_and_reset_need_no_model_and_repeat() -> None:
    engine = TransformersEngine(EngineConfig(), "You are helpful.")
    engine.reset_prefix_cache()
    engine.close()
    engine.close()
    assert engine.serving.is_pure_injection


def _unloaded_tiny_engine() -> TransformersEngine:
    """The engine of :func:`tiny_models.tiny_engine` before :meth:`~TransformersEngine.load` has run."""
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        "Memories:\n",
        model=tiny_model("llama"),
        tokenizer=byte_chat_tokenizer(),
    )


def test_every_model_call_loads_an_engine_that_has_not_loaded_yet() -> None:
    """Each call that runs the model works as the first call on a fresh engine, and gives what a loaded engine
    gives: ``encode_facts`` raised ``AttributeError`` (no encoder yet) when a fidelity probe called it first."""
    loaded = tiny_engine("llama")
    request = EncodeRequest(loaded.fact_token_ids("Raj taught Maya chess."), loaded.system_prefix_ids())
    (want,) = loaded.encode_facts([request])
    (got,) = _unloaded_tiny_engine().encode_facts([request])
    assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)
    question, ids = "Who taught Maya?", [loaded.fact_token_ids("Raj taught Maya chess.")]
    want_logits = loaded.first_token_logits(question, None, ids)
    assert torch.equal(_unloaded_tiny_engine().first_token_logits(question, None, ids), want_logits)
    want_kv = loaded.generate_kv(question, [want], 4)
    assert _unloaded_tiny_engine().generate_kv(question, [want], 4).token_ids == want_kv.token_ids
    want_prompt = loaded.generate_prompt(question, ids, 4)
    assert _unloaded_tiny_engine().generate_prompt(question, ids, 4).token_ids == want_prompt.token_ids
