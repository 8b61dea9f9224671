"""The engine contract (:class:`inferscale.engines.base.Engine`): both engines implement every member with the same
signature. mypy checks the conformance statically (``_conforms_to_engine`` at the end of each engine's module);
these tests check the signatures at run time, and the lifecycle calls that need no model."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from inferscale.config import EngineConfig
from inferscale.engines.base import Engine
from inferscale.engines.transformers import TransformersEngine


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
            "conversation_token_ids",
            "device",
            "encode_facts",
            "fact_token_ids",
            "fingerprint",
            "first_token_logits",
            "generate_kv",
            "generate_prompt",
            "load",
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
