"""TTFT versus k on one GPU: prompt injection vs KV injection from the host tier, Llama-3.1-8B-shaped model.

Needs only torch and transformers (no vLLM, no network, no weights): the model is built from a config with random
bf16 weights, which is honest for latency. Token ids are random too. Run through ``benchmarks/gpu_check.sh``;
``--tiny`` runs the same code on a small model on the CPU (a smoke test).

For each k, over the same facts: ``query`` (no memory), ``prompt`` (the k facts' tokens prefilled after the cached
system prefix, the Mem0-style baseline) and ``kv:host`` (the facts' pre-RoPE K/V copied from pinned host memory,
rotated into the cache after the prefix, only the query prefilled). TTFT = time to the first token's argmax, with
the device synchronised; median and p95 over repeats, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inferscale.engines.transformers.cache import PreallocatedCache
from inferscale.kv import EncodeRequest, FactEncoder, FactKV, PrefixKV, RopeTable, SegmentWorkspace


def build_model(tiny: bool, device: torch.device) -> torch.nn.Module:
    """A Llama-3.1-8B-shaped (or tiny) causal LM with random weights in bf16 on ``device``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    shape = (
        dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4)
        if tiny
        else dict(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32
        )
    )
    config = LlamaConfig(
        **shape,
        num_key_value_heads=2 if tiny else 8,
        max_position_embeddings=131072,
        rope_parameters=rope,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a small model (CPU smoke test)")
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 5, 10, 20, 30, 50])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--fact-tokens", type=int, default=26, help="tokens per fact (LoCoMo-like)")
    parser.add_argument("--prefix-tokens", type=int, default=40)
    parser.add_argument("--query-tokens", type=int, default=24)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    t0 = time.perf_counter()
    model = build_model(args.tiny, device)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(10, vocab, (n,), generator=gen).tolist()  # noqa: E731
    prefix_ids, query_ids = rand(args.prefix_tokens), rand(args.query_tokens)
    fact_ids = [rand(args.fact_tokens) for _ in range(max(args.ks))]
    n_params = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"model on {device} in {time.perf_counter() - t0:.1f} s: {n_params:.2f} B params")

    with torch.inference_mode():
        ids = torch.tensor([prefix_ids], device=device)
        out = model(input_ids=ids, position_ids=torch.arange(len(prefix_ids), device=device)[None], use_cache=True)
        prefix = PrefixKV(
            torch.stack([layer.keys[0] for layer in out.cache.layers]),
            torch.stack([layer.values[0] for layer in out.cache.layers]),
            torch.tensor(prefix_ids),
        )
        t1 = time.perf_counter()
        encoded = FactEncoder(model, batch_size=16).encode([EncodeRequest(f) for f in fact_ids])
        sync(device)
        print(f"encoded {len(encoded)} facts in {time.perf_counter() - t1:.2f} s")
        pin = device.type == "cuda"
        host = [
            FactKV(
                f.keys.cpu().pin_memory() if pin else f.keys.cpu(),
                f.values.cpu().pin_memory() if pin else f.values.cpu(),
                f.token_ids,
                f.encoded_at,
            )
            for f in encoded
        ]
        table = RopeTable.from_model(model, device)
        workspace = SegmentWorkspace(prefix, capacity=args.prefix_tokens + max(args.ks) * args.fact_tokens + 64)
        p = prefix.n_tokens

        def run(k: int, mode: str) -> float:
            sync(device)
            start = time.perf_counter()
            if mode == "kv:host":
                facts = [
                    FactKV(
                        f.keys.to(device, non_blocking=True),
                        f.values.to(device, non_blocking=True),
                        f.token_ids,
                        f.encoded_at,
                    )
                    for f in host[:k]
                ]
                assembled = workspace.assemble(facts, table, extra_capacity=len(query_ids))
                feed, first = query_ids, assembled.n_tokens
            else:
                memory = [t for f in fact_ids[:k] for t in f] if mode == "prompt" else []
                assembled = workspace.assemble([], table, extra_capacity=len(memory) + len(query_ids))
                feed, first = memory + query_ids, p
            cache = PreallocatedCache(assembled.key_buffer, assembled.value_buffer, assembled.n_tokens)
            logits = model(
                input_ids=torch.tensor([feed], device=device),
                position_ids=torch.arange(first, first + len(feed), device=device)[None],
                cache=cache,
                use_cache=True,
            ).logits
            int(logits[0, -1].argmax())
            sync(device)
            return (time.perf_counter() - start) * 1000.0

        header = f"{'k':>3} {'mem tok':>7} | {'query':>8} | {'prompt p50':>10} {'p95':>8} | {'kv p50':>8} {'p95':>8}"
        print(header + " | speedup")
        for k in args.ks:
            cells = {}
            for mode in ("query", "prompt", "kv:host"):
                for _ in range(2):
                    run(k, mode)  # warm-up
                cells[mode] = sorted(run(k, mode) for _ in range(args.repeats))
            med = {m: statistics.median(v) for m, v in cells.items()}
            p95 = {m: v[min(len(v) - 1, round(0.95 * (len(v) - 1)))] for m, v in cells.items()}
            print(
                f"{k:>3} {k * args.fact_tokens:>7} | {med['query']:>8.2f} | "
                f"{med['prompt']:>10.2f} {p95['prompt']:>8.2f} | {med['kv:host']:>8.2f} {p95['kv:host']:>8.2f} | "
                f"{med['prompt'] / med['kv:host']:>6.2f}x"
            )
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
