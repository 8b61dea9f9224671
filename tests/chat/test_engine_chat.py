"""The transformers engine answers conversations: exact in float32 on one tiny model per family (and SmolLM2),
the same tokens in both modes, streaming equal to the whole answer, and sampling equal to transformers' own
``generate`` with the same settings and seed."""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytest
import torch
from tiny_models import SUPPORTED_ARCHS, block_diagonal_logits, tiny_engine

from inferscale.config import EngineConfig
from inferscale.conversation import ChatMessage, SamplingSettings
from inferscale.engines.base import Generation, TextDelta
from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import EngineClosedError, UnsupportedModelError
from inferscale.kv import EncodeRequest
from inferscale.kv.recompute import RecomputePolicy
from inferscale.kv.serving import ServingSettings

FACTS = ["Maya lives in Porto.", "Biscuit is a beagle.", "Clara teaches in Madrid."]
CONVERSATION = (
    ChatMessage("system", "Answer in one word."),
    ChatMessage("user", "My cat is called Pixel."),
    ChatMessage("assistant", "Nice, Pixel is a lovely name."),
    ChatMessage("user", "What is my cat called?"),
)
RECOMPUTE_ALL = ServingSettings(recompute=RecomputePolicy.parse("head:100000"))


@functools.cache
def _engine(arch: str) -> TransformersEngine:
    engine: TransformersEngine = tiny_engine(arch)
    return engine


def _facts(engine: TransformersEngine) -> tuple[list[list[int]], list[Any]]:
    fact_ids = [engine.fact_token_ids(t) for t in FACTS]
    return fact_ids, engine.encode_facts([EncodeRequest(ids) for ids in fact_ids])


def _check_exact(engine: TransformersEngine) -> None:
    fact_ids, facts = _facts(engine)
    conversation_ids = engine.conversation_token_ids(CONVERSATION)
    injected = engine.first_token_logits(CONVERSATION, facts)
    reference = block_diagonal_logits(engine.model, engine.system_prefix_ids(), fact_ids, conversation_ids)
    assert (injected - reference).abs().max().item() <= 1e-4
    prompt = engine.first_token_logits(CONVERSATION, None, fact_ids)
    assert (injected - prompt).abs().max().item() > 1e-3  # the two references differ: neither check is vacuous
    if getattr(engine.model.config, "sliding_window", None) is not None:
        # Gemma 3's sliding layers: the engine refuses request-time recompute rather than serve it inexactly.
        with pytest.raises(UnsupportedModelError, match="sliding-window"):
            engine.first_token_logits(CONVERSATION, facts, serving=RECOMPUTE_ALL)
        return
    recomputed = engine.first_token_logits(CONVERSATION, facts, serving=RECOMPUTE_ALL)
    assert (recomputed - prompt).abs().max().item() <= 1e-4


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_a_multi_turn_request_is_exact_on_every_family(arch: str) -> None:
    _check_exact(_engine(arch))


@pytest.mark.slow
def test_a_multi_turn_request_is_exact_on_smollm2(smollm2_fp32: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2_fp32
    engine = TransformersEngine(EngineConfig(dtype="float32"), "Memories:\n", model=model, tokenizer=tokenizer)
    _check_exact(engine.load())


def test_both_modes_prefill_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine("llama")
    fact_ids, facts = _facts(engine)
    prefills: list[tuple[list[int], int]] = []
    forward = engine._forward

    def recording(cache: Any, ids: list[int], start: int, bias: Any = None) -> torch.Tensor:
        if len(prefills) < 1 or len(ids) > 1:
            prefills.append((list(ids), start))
        return forward(cache, ids, start, bias)

    monkeypatch.setattr(engine, "_forward", recording)
    kv = engine.generate_kv(CONVERSATION, facts, max_new_tokens=1)
    kv_ids, kv_start = prefills.pop(0)
    prompt = engine.generate_prompt(CONVERSATION, fact_ids, max_new_tokens=1)
    prompt_ids, prompt_start = prefills.pop(0)
    memory = [t for ids in fact_ids for t in ids]
    prefix = engine.system_prefix_ids()
    assert [t for f in facts for t in f.token_ids.tolist()] == memory  # the injected K/V are of these tokens
    assert prompt_start == len(prefix) and kv_start == len(prefix) + len(memory)
    assert prompt_ids == memory + kv_ids  # kv prefills the conversation; prompt also the memory before it
    assert kv_ids == engine.conversation_token_ids(CONVERSATION)
    assert kv.prompt_tokens == prompt.prompt_tokens == len(prefix) + len(memory) + len(kv_ids)


@pytest.mark.parametrize("mode", ["kv", "prompt"])
@pytest.mark.parametrize("sampling", [None, SamplingSettings(temperature=0.9, seed=7)])
def test_streamed_deltas_join_to_the_answer(mode: str, sampling: SamplingSettings | None) -> None:
    engine = _engine("qwen2")
    fact_ids, facts = _facts(engine)
    if mode == "kv":
        whole = engine.generate_kv(CONVERSATION, facts, 24, sampling=sampling)
        events = list(engine.stream_kv(CONVERSATION, facts, 24, sampling=sampling))
    else:
        whole = engine.generate_prompt(CONVERSATION, fact_ids, 24, sampling=sampling)
        events = list(engine.stream_prompt(CONVERSATION, fact_ids, 24, sampling=sampling))
    deltas = [e for e in events if isinstance(e, TextDelta)]
    final = events[-1]
    assert isinstance(final, Generation) and all(isinstance(e, TextDelta) for e in events[:-1])
    assert "".join(d.text for d in deltas) == final.text == whole.text
    assert [t for d in deltas for t in d.token_ids] == final.token_ids == whole.token_ids
    assert final.finish_reason == whole.finish_reason
    assert not any(d.text.endswith("\ufffd") for d in deltas)  # random bytes: characters arrive in pieces


def test_open_streams_keep_their_own_memory_interleaved_and_in_threads() -> None:
    """Two open streams with different memories, read interleaved on one thread and then on two threads, answer
    exactly what each request answers alone: no stream decodes on another's K/V."""
    engine = _engine("llama")
    _, facts = _facts(engine)
    first, second = facts[:1], facts[1:]
    alone = [engine.generate_kv(CONVERSATION, f, 20).token_ids for f in (first, second)]
    assert alone[0] != alone[1]  # different memories, different answers: the check below can fail

    def ids(stream: Any) -> list[int]:
        return [t for e in stream if isinstance(e, TextDelta) for t in e.token_ids]

    a, b = engine.stream_kv(CONVERSATION, first, 20), engine.stream_kv(CONVERSATION, second, 20)
    head = next(a)
    assert isinstance(head, TextDelta)
    assert [ids(b), head.token_ids + ids(a)] == [alone[1], alone[0]]

    results: dict[int, list[int]] = {}
    streams = [engine.stream_kv(CONVERSATION, f, 20) for f in (first, second)]
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ids(streams[i]))) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[0], results[1]] == alone


def test_seed_repeats_a_sample_and_temperature_zero_is_greedy() -> None:
    engine = _engine("llama")
    _, facts = _facts(engine)

    def ids(sampling: SamplingSettings | None) -> list[int]:
        return engine.generate_kv(CONVERSATION, facts, 16, sampling=sampling).token_ids

    greedy = ids(None)
    assert ids(SamplingSettings(temperature=0.0, seed=3, top_p=0.5)) == greedy
    assert ids(SamplingSettings(temperature=5.0, top_k=1, seed=3)) == greedy  # top-1 keeps only the argmax
    sampled = {seed: ids(SamplingSettings(temperature=1.5, seed=seed)) for seed in (1, 2, 3)}
    assert ids(SamplingSettings(temperature=1.5, seed=2)) == sampled[2]
    assert len({tuple(v) for v in sampled.values()}) > 1  # the seed matters


@pytest.mark.parametrize(
    "settings",
    [
        SamplingSettings(repetition_penalty=1.5),
        SamplingSettings(temperature=0.8, top_k=20, top_p=0.9, seed=11),
        SamplingSettings(temperature=1.3, repetition_penalty=1.2, seed=5),
    ],
)
def test_sampling_equals_transformers_generate(settings: SamplingSettings) -> None:
    """Prompt mode with no memory is a plain causal prefill, so transformers' ``generate`` with the same settings
    and the same seed on the same ids is the reference, token for token."""
    engine = _engine("llama")
    ours = engine.generate_prompt(CONVERSATION, [], 12, sampling=settings).token_ids
    ids = engine.system_prefix_ids() + engine.conversation_token_ids(CONVERSATION)
    if settings.seed is not None:
        torch.manual_seed(settings.seed)
    kwargs: dict[str, Any] = {"do_sample": not settings.is_greedy, "repetition_penalty": settings.repetition_penalty}
    if not settings.is_greedy:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p)
    with torch.no_grad():
        out = engine.model.generate(
            torch.tensor([ids]), max_new_tokens=12, eos_token_id=256, pad_token_id=256, min_new_tokens=0, **kwargs
        )
    reference = [t for t in out[0, len(ids) :].tolist() if t != 256]
    assert ours == reference


def test_whole_number_sampling_values_run() -> None:
    engine = _engine("llama")
    _, facts = _facts(engine)
    ints = SamplingSettings.of(temperature=1, repetition_penalty=2, seed=5)
    floats = SamplingSettings.of(temperature=1.0, repetition_penalty=2.0, seed=5)
    assert engine.generate_kv(CONVERSATION, facts, 8, sampling=ints).token_ids == (
        engine.generate_kv(CONVERSATION, facts, 8, sampling=floats).token_ids
    )


def test_closing_the_engine_under_an_open_stream_raises_a_typed_error() -> None:
    engine: TransformersEngine = tiny_engine("llama")
    _, facts = _facts(engine)
    stream = engine.stream_kv(CONVERSATION, facts, 20)
    next(stream)
    engine.close()
    with pytest.raises(EngineClosedError, match="closed"):
        list(stream)
    assert engine.generate_kv(CONVERSATION, facts, 4).token_ids  # it loads again and answers


@pytest.mark.parametrize("kind", ["kv", "prompt"])
@pytest.mark.parametrize("loaded_again", [False, True])
def test_a_stream_closed_before_its_first_read_raises_a_typed_error(kind: str, loaded_again: bool) -> None:
    """A new user's find: a stream opened, then the engine closed before the stream was read, raised a bare
    AttributeError ('TransformersEngine' object has no attribute '_workspaces') on the first read; with the engine
    loaded again meanwhile, the stream would have gone on after the close."""
    engine: TransformersEngine = tiny_engine("llama")
    fact_ids, facts = _facts(engine)
    stream = (
        engine.stream_kv(CONVERSATION, facts, 8) if kind == "kv" else engine.stream_prompt(CONVERSATION, fact_ids, 8)
    )
    engine.close()
    if loaded_again:
        engine.load()
    with pytest.raises(EngineClosedError, match="closed"):
        next(stream)
    assert engine.generate_kv(CONVERSATION, facts, 4).token_ids  # the engine answers on


def test_stop_strings_and_the_budget_end_the_answer() -> None:
    engine = _engine("llama")
    _, facts = _facts(engine)
    free = engine.generate_kv(CONVERSATION, facts, 30)
    assert free.finish_reason == "length" and len(free.token_ids) == 30
    stop = free.text[6:8]  # two characters the greedy answer contains after its start
    cut = engine.generate_kv(CONVERSATION, facts, 30, sampling=SamplingSettings(stop=(stop,)))
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and free.text.startswith(cut.text.rstrip())
    assert len(cut.token_ids) < 30
