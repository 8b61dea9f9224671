"""The Transformers engine's guards on the embedded SmolLM2: a prompt past the context window is refused before it
runs, an answer cut inside a multi-byte character carries no replacement character, and answers end on the stop
token ids."""

from __future__ import annotations

from typing import Any

import pytest

from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import InvalidInputError
from inferscale.kv import EncodeRequest

pytestmark = pytest.mark.slow  # every test loads SmolLM2


@pytest.fixture(scope="module")
def smol(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(EngineConfig(dtype="float32"), "Memories:\n", model=model, tokenizer=tokenizer).load()


def test_prompt_past_the_context_window_is_refused_not_run(smol: TransformersEngine) -> None:
    long_fact = smol.fact_token_ids("My favourite number is 42. " * 1200)  # ~9.6k tokens > 8192
    with pytest.raises(InvalidInputError, match="context"):
        smol.encode_facts([EncodeRequest(long_fact)])
    short = smol.encode_facts([EncodeRequest(smol.fact_token_ids("Maya lives in Porto."))])
    with pytest.raises(InvalidInputError, match="context"):
        smol.generate_kv("Where?", short * 1200, max_new_tokens=4)
    with pytest.raises(InvalidInputError, match="context"):
        smol.generate_prompt("Where?", [long_fact], max_new_tokens=4)


def test_answer_cut_inside_a_character_has_no_replacement_char(smol: TransformersEngine) -> None:
    fact = smol.fact_token_ids("我叫林晓雨，在青木科技做产品经理。")
    for budget in range(1, 9):
        answer = smol.generate_prompt("林晓雨在哪家公司工作？", [fact], max_new_tokens=budget).text
        assert "\ufffd" not in answer


def test_the_stop_token_ids_are_those_the_answer_ends_on(smol: TransformersEngine) -> None:
    """SmolLM2's chat template ends a turn with ``<|im_end|>``: it is among the stop ids, and an answer that ends
    before its budget ends because the next greedy token is one of them."""
    stop = smol.stop_token_ids
    assert stop == sorted(stop) and smol.tokenizer.convert_tokens_to_ids("<|im_end|>") in stop
    fact = smol.fact_token_ids("Maya lives in Porto.")
    answer = smol.generate_prompt("Where does Maya live?", [fact], max_new_tokens=32)
    assert answer.finish_reason == "stop" and len(answer.token_ids) < 32
    assert not set(answer.token_ids) & set(stop)
