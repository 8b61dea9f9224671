"""Where the gap between KV-injected and pasted answers lives: three probes beyond the product's settings.

Issue #10 asks KV-injected answers to be as good as pasted ones. With the default (w=5, pure injection) the
first-token KL(prompt || kv) is about 0.05 nats on the LoCoMo slice, against ~0.017 for prompt mode against itself
with the memories reordered, and recompute within 15% of the memory tokens moves it by at most 0.01. These probes
ask where the rest lives. Each is measured on the cases ``inferscale eval fidelity`` builds (the same memories in
the same order), first token only, against prompt mode:

- ``band``: the memory tokens recomputed, with causal attention over the whole memory segment, in a band of layers
  only; the other layers keep the injected K/V. ``top:n`` recomputes the last n layers, starting from the hidden
  states each fact's tokens had at that layer's input in their own encoding pass (after the system prefix and their
  w context turns); ``bottom:n`` recomputes the first n layers from the token embeddings. A band of n layers costs
  n / L of prompt mode's memory prefill. Checks, printed: ``top:0`` equals KV mode and ``top:L`` prompt mode.
- ``chain:w``: each memory encoded on top of the *stored K/V* of its last w context turns, injected after the
  system prefix as a chat injects them (the turns' own chained K/V, in conversation order), instead of after the
  turns' text: only the memory's own tokens are prefilled (1/(1 + context/fact) of the windowed encoding's tokens).
- ``layout``: the facts served away from their contiguous slots' positions (cache slots stay contiguous, position
  ids do not): ``overlap`` puts each fact exactly at the position it was encoded at (after the prefix and its
  context), so facts with contexts of similar length overlap; ``gaps`` puts each at that position or right after the
  fact before it, whichever is later (with w=5 contexts longer than the facts before them, mostly one gap before the
  first fact: the segment shifted away from the prefix).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gap_probes.py --locomo ../shared/data/locomo/locomo10.json

Prints one row per probe setting: mean KL (nats), first-token agreement and the probe's cost (the layers a band
recomputes; the tokens an encoding prefills for the conversation's memories, the cached system prefix not counted).
Before it prints, it checks its own plumbing and stops if a check is off by more than 1e-4 in any logit: a band of
no layer is KV mode, a band of every layer is prompt mode, the contiguous layout is KV mode. SmolLM2-135M-Instruct
(embedded) in float32; ~25 minutes for the default bands on 40 questions, ~10 for the chains, ~2 for the layouts,
on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from inferscale.config import EngineConfig
from inferscale.engines.hf import load_causal_lm
from inferscale.engines.transformers import TransformersEngine
from inferscale.engines.transformers.cache import PreallocatedCache
from inferscale.eval.fidelity import SYSTEM_PROMPTS, FactCache, FidelitySetting
from inferscale.eval.fidelity_cases import FidelityCase, locomo_conversation, memories_with_contexts, retrieve_cases
from inferscale.eval.metrics import first_token_kl
from inferscale.kv.compose import assemble
from inferscale.kv.encode import PreRopeCapture, decoder_attention_modules, kv_head_shape
from inferscale.kv.fact import FactKV
from inferscale.retrieval.embedder import SentenceTransformerEmbedder


class Probe:
    """The probes' forward passes, on one engine (its system prompt) and its model."""

    def __init__(self, engine: TransformersEngine, model: Any) -> None:
        self.engine, self.model = engine, model
        self.layers = model.model.layers
        self.prefix = engine.prefix_kv
        self.p = self.prefix.n_tokens

    def query_logits(self, cache: DynamicCache, case: FidelityCase, start: int) -> torch.Tensor:
        """``[vocab]`` float32: the first answer token's logits after the query is prefilled on ``cache`` from
        position ``start``."""
        ids = self.engine.conversation_token_ids(case.question)
        out = self.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(start, start + len(ids))[None],
            cache=cache,
            use_cache=True,
        )
        return out.logits[0, -1].float()

    def run_layers(self, hidden: torch.Tensor, cache: DynamicCache, layers: range) -> None:
        """Run ``hidden`` (``[1, S, hidden_size]``, the memory tokens) through ``layers`` at positions ``P ..
        P+S-1``, each token attending causally to the prefix and the memory tokens before it; the layers write
        their K/V into ``cache``."""
        s = hidden.shape[1]
        positions = torch.arange(self.p, self.p + s)[None]
        rotary = self.model.model.rotary_emb(hidden, positions)
        mask = torch.zeros((s, self.p + s))
        mask[:, self.p :] = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)
        for i in layers:
            out = self.layers[i](
                hidden,
                attention_mask=mask[None, None],
                position_ids=positions,
                cache=cache,
                use_cache=True,
                position_embeddings=rotary,
            )
            hidden = out[0] if isinstance(out, tuple) else out

    def band_logits(
        self, case: FidelityCase, facts: Sequence[FactKV], hidden: list[list[torch.Tensor]], band: str
    ) -> torch.Tensor:
        """KV mode with the memory tokens recomputed in a band of layers (``"top:n"`` or ``"bottom:n"``).

        ``hidden[i][l]``: fact i's tokens' hidden states at layer l's input in its encoding pass, ``[n_i, hidden]``.
        """
        side, n = parse_band(band, len(self.layers))
        total = len(self.layers)
        recomputed = range(total - n, total) if side == "top" else range(n)
        segment = assemble(self.prefix, facts, self.engine.rope_table)
        data = []
        for i in range(total):
            kv = (self.prefix.keys, self.prefix.values) if i in recomputed else (segment.keys, segment.values)
            data.append((kv[0][i][None].clone(), kv[1][i][None].clone()))
        cache = DynamicCache(ddp_cache_data=data, config=self.model.config)
        if recomputed:
            if side == "top":
                start = torch.cat([h[recomputed.start] for h in hidden])[None]
            else:
                start = self.model.model.embed_tokens(segment.token_ids[self.p :][None])
            self.run_layers(start, cache, recomputed)
        return self.query_logits(cache, case, segment.n_tokens)

    def encoding_hidden_states(self, case: FidelityCase, w: int) -> list[list[torch.Tensor]]:
        """Each fact's tokens' hidden states at every layer's input (index l: layer l's input; the last entry is the
        final norm's output), from a plain pass over ``[system prefix][its last w context turns][fact]``."""
        out = []
        for i, text in enumerate(case.memories):
            ids = self.engine.fact_token_ids(text)
            context = self.engine.context_token_ids(case.context_of(i)[-w:] if w else [])
            prompt = self.engine.system_prefix_ids() + context + ids
            run = self.model.model(input_ids=torch.tensor([prompt]), output_hidden_states=True)
            out.append([h[0, -len(ids) :] for h in run.hidden_states])
        return out

    def gapped_logits(self, case: FidelityCase, facts: Sequence[FactKV], starts: Sequence[int]) -> torch.Tensor:
        """KV mode with fact i's first token at position ``starts[i]`` (cache slots stay contiguous)."""
        table = self.engine.rope_table
        keys = [self.prefix.keys, *[table.rotate(f.keys, start=s) for f, s in zip(facts, starts, strict=True)]]
        values = [self.prefix.values, *[f.values for f in facts]]
        k, v = torch.cat(keys, dim=2), torch.cat(values, dim=2)
        cache = DynamicCache(
            ddp_cache_data=[(k[i][None], v[i][None]) for i in range(k.shape[0])], config=self.model.config
        )
        end = max(s + f.n_tokens for f, s in zip(facts, starts, strict=True))
        return self.query_logits(cache, case, end)

    @torch.inference_mode()
    def chain_encode(self, memories: Sequence[str], context_of: dict[str, list[str]], w: int) -> dict[str, FactKV]:
        """Every memory, in conversation order, encoded on top of its last w context turns' chained K/V (injected
        after the system prefix); returns each memory's pre-RoPE K/V."""
        attention = decoder_attention_modules(self.model)
        n_kv, head_dim = kv_head_shape(self.model.config)
        chained: dict[str, FactKV] = {}
        for text in memories:
            context = [chained[t] for t in (context_of[text][-w:] if w else [])]
            ids = self.engine.fact_token_ids(text)
            padded = ids + [0] * (len(ids) == n_kv)  # [B, T, n_kv, hd] and [B, n_kv, T, hd] must differ
            segment = assemble(self.prefix, context, self.engine.rope_table, extra_capacity=len(padded))
            cache = PreallocatedCache(segment.key_buffer, segment.value_buffer, segment.n_tokens)
            with PreRopeCapture(attention, n_kv, head_dim, len(padded)) as capture:
                self.model.model(
                    input_ids=torch.tensor([padded]),
                    position_ids=torch.arange(segment.n_tokens, segment.n_tokens + len(padded))[None],
                    cache=cache,
                    use_cache=True,
                )
                keys, values = capture.stacked()
            chained[text] = FactKV(
                keys=keys[:, 0, :, : len(ids)].contiguous(),
                values=values[:, 0, :, : len(ids)].contiguous(),
                token_ids=torch.tensor(ids),
                encoded_at=segment.n_tokens,
            )
        return chained


def parse_band(band: str, n_layers: int) -> tuple[str, int]:
    """``"top:n"`` or ``"bottom:n"`` → ``(side, n)``.

    Raises:
        ValueError: for another side, or n outside ``0 .. n_layers``.
    """
    side, _, count = band.partition(":")
    if side not in ("top", "bottom") or not count.isdigit() or int(count) > n_layers:
        raise ValueError(f"band {band!r}: expected 'top:N' or 'bottom:N' with 0 <= N <= {n_layers}")
    return side, int(count)


def contiguous_starts(p: int, facts: Sequence[FactKV]) -> list[int]:
    """Where each fact starts when laid out one after the other from position ``p`` (as the product serves)."""
    starts, position = [], p
    for fact in facts:
        starts.append(position)
        position += fact.n_tokens
    return starts


def gapped_starts(p: int, facts: Sequence[FactKV]) -> list[int]:
    """Each fact at its encoded position or right after the fact before it, whichever is later."""
    starts, end = [], p
    for fact in facts:
        starts.append(max(fact.encoded_at, end))
        end = starts[-1] + fact.n_tokens
    return starts


PROBES = ("band", "chain", "layout")
CHECK_TOLERANCE = 1e-4
"""The largest |Δlogit| a plumbing check allows (float32 kernels' rounding is ~1e-5)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", required=True, help="the LoCoMo file (never copied into the repo)")
    parser.add_argument("--conversation", default="conv-26", help="LoCoMo sample id (default conv-26)")
    parser.add_argument("--questions", type=int, default=40, help="questions of categories 1-4 (default 40)")
    parser.add_argument("-k", type=int, default=10, help="memories per question (default 10)")
    parser.add_argument("--system-prompt", default="default", choices=sorted(SYSTEM_PROMPTS))
    parser.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES, help="which probes (default all)")
    parser.add_argument("--bands", default="top:4,top:8,top:15,bottom:4", help="layer bands (default %(default)s)")
    parser.add_argument("--chain-windows", default="1,3,5", help="w of the chained encodings (default %(default)s)")
    args = parser.parse_args()
    probes = set(args.probes)

    sessions, questions = locomo_conversation(args.locomo, args.conversation, args.questions)
    memories, contexts = memories_with_contexts(sessions)
    embedder = SentenceTransformerEmbedder(None, "cpu")
    cases = retrieve_cases(args.conversation, memories, questions, args.k, embedder, contexts).cases
    config = EngineConfig(dtype="float32", device="cpu")
    _, model, tokenizer = load_causal_lm(config, None)
    engine = TransformersEngine(config, SYSTEM_PROMPTS[args.system_prompt], model=model, tokenizer=tokenizer)
    probe = Probe(engine.load(), model)
    default = FidelitySetting()
    stored = FactCache(engine)
    n_layers = len(probe.layers)
    bands = args.bands.split(",") if "band" in probes else []
    for band in bands:
        parse_band(band, n_layers)  # refuse a bad band before anything runs
    windows = [int(w) for w in args.chain_windows.split(",")] if "chain" in probes else []

    fact_tokens = sum(len(engine.fact_token_ids(m)) for m in memories)

    def windowed_tokens(w: int) -> int:
        """Tokens the product's encoding prefills for the conversation's memories at context window w."""
        return fact_tokens + sum(len(engine.context_token_ids(c[-w:] if w else [])) for c in contexts)

    w = default.context_window
    costs = {"default (w=5, pure injection)": f"encoding prefills {windowed_tokens(w) / fact_tokens:.2f}x fact tokens"}
    for band in bands:
        n = parse_band(band, n_layers)[1]
        costs[f"band {band}"] = f"{n}/{n_layers} layers = {n / n_layers:.0%} of the memory prefill"
    chains = {}
    context_of = dict(zip(memories, contexts, strict=True))
    for window in windows:
        chains[window] = probe.chain_encode(memories, context_of, window)
        costs[f"chain:{window}"] = f"encoding prefills 1.00x fact tokens (text, w={window}: " + (
            f"{windowed_tokens(window) / fact_tokens:.2f}x)"
        )
    if "layout" in probes:
        costs |= {"layout: gaps": "0", "layout: overlap": "0"}

    results: dict[str, list[tuple[float, bool]]] = {}
    checks: dict[str, float] = {}

    def record(name: str, reference: torch.Tensor, logits: torch.Tensor) -> None:
        kl = first_token_kl(reference, logits)
        results.setdefault(name, []).append((kl, bool(logits.argmax() == reference.argmax())))

    def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        checks[name] = max(checks.get(name, 0.0), float((got - want).abs().max()))

    with torch.inference_mode():
        for case in cases:
            memory_ids = [engine.fact_token_ids(t) for t in case.memories]
            reference = engine.first_token_logits(case.question, None, memory_ids)
            facts = stored.get(case, default)
            kv = engine.first_token_logits(case.question, facts)
            record("default (w=5, pure injection)", reference, kv)
            if bands:
                hidden = probe.encoding_hidden_states(case, default.context_window)
                check("band top:0 = KV mode", probe.band_logits(case, facts, hidden, "top:0"), kv)
                every = probe.band_logits(case, facts, hidden, f"top:{n_layers}")
                check(f"band top:{n_layers} = prompt mode", every, reference)
                for band in bands:
                    record(f"band {band}", reference, probe.band_logits(case, facts, hidden, band))
            for window, chained in chains.items():
                served = [chained[t] for t in case.memories]
                record(f"chain:{window}", reference, engine.first_token_logits(case.question, served))
            if "layout" in probes:
                laid = probe.gapped_logits(case, facts, contiguous_starts(probe.p, facts))
                check("contiguous layout = KV mode", laid, kv)
                layouts = {
                    "layout: gaps": gapped_starts(probe.p, facts),
                    "layout: overlap": [f.encoded_at for f in facts],
                }
                for name, starts in layouts.items():
                    record(name, reference, probe.gapped_logits(case, facts, starts))

    off = {name: delta for name, delta in checks.items() if delta > CHECK_TOLERANCE}
    if off:
        raise SystemExit(f"plumbing checks off by more than {CHECK_TOLERANCE:g} in a logit: {off}")
    print(f"{args.conversation}, {len(cases)} questions, k={args.k}, {args.system_prompt} system prompt, float32")
    for name, values in results.items():
        kl = statistics.fmean(v[0] for v in values)
        agree = statistics.fmean(float(v[1]) for v in values)
        print(f"{name:<32} KL {kl:.4f}  agree {agree:.3f}  cost: {costs[name]}")
    for name, delta in checks.items():
        print(f"check {name}: max |Δlogit| {delta:.1e}")


if __name__ == "__main__":
    main()
