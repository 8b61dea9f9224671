"""Fact encoding throughput against the model's plain prefill rate, measured side by side in one run.

Timed jobs over the same ``--facts`` synthetic facts, in the engine's default dtype (``auto``), interleaved per
repeat so drift on a shared machine hits each alike:

- ``prefill``: one plain forward pass over the system prefix and every fact pasted as one prompt (what prompt
  injection prefills): its tokens/s is the model's plain prefill rate;
- ``encode (prefix cached)``: the engine's fact encoder, which prefills the system prefix once and encodes each fact
  on top of its cached K/V, and prefills a context that several facts share once (the product's path);
- ``encode (context per fact)``, with ``--context-turns`` and ``--facts-per-context`` > 1 only: the same encoder,
  the prefix cached, but each fact's context turns prefilled again for it (the path before contexts were shared);
- ``encode (prefix per fact)``: the encoder without the cached prefix or shared contexts, which prefills the prefix
  (and the turns) again for every fact (the path before issue #16);
- ``encode (chained, B=...)``, with ``--chain-block B`` only: bounded chained contexts (``kv.chain_block``), one call
  per fact as the background encoder runs them: every B-th fact an anchor encoded after its context turns' text, each
  other one on the stored K/V of the last ``--chain-window`` facts of its block, prefilling only its own tokens.

Facts are encoded with the prefix only by default (``kv.context_window`` 0). ``--context-turns T`` puts T synthetic
turns before each fact, the same T for each group of ``--facts-per-context F`` facts (distinct turns per group): F=1
is a memory encoded after the turns before it (``add(infer=False)``, one message at a time), F>1 the facts one
``add(infer=True)`` call extracts, which share the call's turns. ``--chunk-size N`` encodes them in calls of at most
N, cut where the background encoder cuts its chunks (``kv.encode_chunk_size``, default 4: never inside a group that
fits one call); by default all go in one call, as an eager ``add`` of them does.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/encode_throughput.py --facts 64 --repeats 5 --out out/encode.json

Prints facts/s, fact tokens/s and prefilled tokens/s per job (medians over repeats) and fact tokens/s as a share of
the plain prefill rate; writes the same as JSON with the machine's description.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from inferscale.bench.common import machine_info, synthetic_facts, write_json
from inferscale.config import EngineConfig
from inferscale.engines.hf.dtype import loaded_dtype
from inferscale.engines.transformers import TransformersEngine
from inferscale.kv.encode import EncodeRequest, FactEncoder, chunk_length

SYSTEM_PROMPT = "You are a helpful assistant. Answer the user's question using the memories below.\nMemories:\n"


def _timed(job: Any) -> float:
    start = time.perf_counter()
    job()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=64, help="facts encoded per repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up (default 5)")
    parser.add_argument("--context-turns", type=int, default=0, help="synthetic turns before each fact (default 0)")
    parser.add_argument(
        "--facts-per-context", type=int, default=1, help="facts that share one context's turns (default 1)"
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        help="encode in consecutive calls of this many facts, as the background encoder does (kv.encode_chunk_size, "
        "default 4); default: one call for all, as an eager add of them does",
    )
    parser.add_argument(
        "--chain-block", type=int, default=0, help="also time bounded chains of this B (kv.chain_block; default 0: no)"
    )
    parser.add_argument("--chain-window", type=int, default=3, help="w of the chains (kv.chain_window, default 3)")
    parser.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    chunk = args.facts if args.chunk_size is None else args.chunk_size
    if min(args.facts, args.repeats, args.facts_per_context, chunk, args.chain_window) < 1 or args.context_turns < 0:
        parser.error(
            "--facts, --repeats, --facts-per-context, --chunk-size and --chain-window must be at least 1, "
            "--context-turns at least 0"
        )
    if args.chain_block == 1 or args.chain_block < 0 or (args.chain_block and args.facts_per_context != 1):
        parser.error("--chain-block must be 0 or at least 2, and chains take --facts-per-context 1 (one message each)")

    engine = TransformersEngine(EngineConfig(dtype=args.dtype, device="cpu"), SYSTEM_PROMPT).load()
    model, prefix = engine.model, engine.system_prefix_ids()
    turns, per_context = args.context_turns, args.facts_per_context
    groups = math.ceil(args.facts / per_context)
    texts = synthetic_facts(args.facts + turns * groups)  # the facts, then each group's distinct turns
    facts = [engine.fact_token_ids(text) for text in texts[: args.facts]]
    group_turns = [
        engine.context_token_ids(texts[args.facts + g * turns : args.facts + (g + 1) * turns]) if turns else []
        for g in range(groups)
    ]
    requests = [EncodeRequest(fact, [*prefix, *group_turns[i // per_context]]) for i, fact in enumerate(facts)]
    fact_tokens = sum(len(f) for f in facts)
    pasted = torch.tensor([[*prefix, *(t for f in facts for t in f)]], dtype=torch.long)
    pad = engine.tokenizer.pad_token_id or 0
    cached = FactEncoder(model, pad_token_id=pad)
    cached.cache_prefix(prefix)
    unshared = FactEncoder(model, pad_token_id=pad, share_contexts=False)
    unshared.cache_prefix(prefix)
    uncached = FactEncoder(model, pad_token_id=pad, share_contexts=False)
    chaining = FactEncoder(model, pad_token_id=pad, rotate_keys=engine.rope_table.rotate)
    chaining.cache_prefix(prefix)

    contexts = [tuple(r.context_ids) if len(r.context_ids) > len(prefix) else None for r in requests]

    def encode_in_chunks(encoder: FactEncoder) -> None:
        """``requests`` in calls of at most ``chunk``, cut as the background encoder cuts them."""
        start = 0
        while start < len(requests):
            n = chunk_length(contexts[start:], chunk)
            encoder.encode(requests[start : start + n])
            start += n

    def encode_chained(encoder: FactEncoder) -> None:
        """Each fact in one call, in order: the anchors after their turns, the others on their chain's K/V."""
        block, window, stored = args.chain_block, args.chain_window, []
        for i, fact in enumerate(facts):
            if i % block == 0:
                request = requests[i]
            else:
                request = EncodeRequest(fact, prefix, chained_on=stored[max(i - i % block, i - window) : i])
            stored.extend(encoder.encode([request]))

    def prefill() -> None:
        with torch.inference_mode():
            model(input_ids=pasted, use_cache=False)

    encoders: dict[str, FactEncoder | None] = {"prefill": None, "encode (prefix cached)": cached}
    if args.context_turns and args.facts_per_context > 1:
        encoders["encode (context per fact)"] = unshared
    encoders["encode (prefix per fact)"] = uncached
    chained_job = f"encode (chained, B={args.chain_block})"
    if args.chain_block:
        encoders[chained_job] = chaining
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    prefilled: dict[str, int] = {}
    for repeat in range(args.repeats + 1):
        for name, encoder in encoders.items():
            before = encoder.tokens_prefilled if encoder is not None else 0
            run = encode_chained if name == chained_job else encode_in_chunks
            elapsed = _timed(prefill if encoder is None else functools.partial(run, encoder))
            prefilled[name] = int(pasted.shape[1]) if encoder is None else encoder.tokens_prefilled - before
            if repeat:  # the first round warms up kernels and allocations
                seconds[name].append(elapsed)

    rows: dict[str, dict[str, float]] = {}
    for name, samples in seconds.items():
        median = statistics.median(samples)
        rows[name] = {
            "median_s": median,
            "prefilled_tokens": prefilled[name],
            "prefilled_tokens_per_s": prefilled[name] / median,
        }
        if name != "prefill":
            rows[name] |= {"facts_per_s": len(facts) / median, "fact_tokens_per_s": fact_tokens / median}
    plain_rate = rows["prefill"]["prefilled_tokens_per_s"]
    for name, row in rows.items():
        if name != "prefill":
            row["fact_tokens_share_of_prefill_rate"] = row["fact_tokens_per_s"] / plain_rate
    report = {
        "settings": vars(args) | {"out": str(args.out) if args.out else None},
        "model_dtype": loaded_dtype(model),
        "facts": len(facts),
        "fact_tokens": fact_tokens,
        "prefix_tokens": len(prefix),
        "context_tokens_per_fact": statistics.fmean(len(r.context_ids) - len(prefix) for r in requests),
        "facts_per_context": args.facts_per_context,
        "facts_per_encode_call": chunk,
        "machine": machine_info(),
        "jobs": rows,
    }
    print(
        f"{len(facts)} facts, {fact_tokens} fact tokens, prefix {len(prefix)} tokens, context "
        f"{report['context_tokens_per_fact']:.0f} tokens per fact, {args.facts_per_context} facts per context, "
        f"{chunk} per encode call; "
        f"{report['model_dtype']} on {report['machine']['processor']} ({report['machine']['cpu_isa']})"
    )
    for name, row in rows.items():
        extra = ""
        if name != "prefill":
            extra = (
                f"  {row['facts_per_s']:.1f} facts/s, {row['fact_tokens_per_s']:.0f} fact tok/s = "
                f"{row['fact_tokens_share_of_prefill_rate']:.2f} of the plain prefill rate"
            )
        print(
            f"{name:26s} {row['median_s'] * 1000:8.1f} ms  {row['prefilled_tokens_per_s']:7.0f} prefilled tok/s{extra}"
        )
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
