"""Each memory's K/V averaged over encodings after several contexts, against the one context of the default.

Issue #10: with the default (each memory encoded after the w=5 turns before it) first-token KL(prompt || kv) stays at
0.046-0.062 nats, against ~0.017 for prompt mode against itself with the memories reversed. What is left is the
attention between the retrieved facts: at request time a memory follows the other top-k memories of the question,
which no encoding done at ``add`` time knows. Any one context is then a sample of the contexts a memory will be
served after, and its K/V carry that sample's particulars as well as what every context shares (that the memory is
one line of a list of memories). Averaging the K/V of encodings after several contexts keeps what they share and
shrinks the particulars: if the served context's K/V and the stored ones scatter alike around a common mean, the
stored mean of n encodings halves the expected squared error of one encoding as n grows (σ²(1 + 1/n) against 2σ²).

Contexts, each only of memories stored before the memory (what ``add`` can see), w of them, oldest first:

- ``temporal``: the turns right before the memory in its session (the product's context);
- ``shifted``: the w memories before those, in conversation order;
- ``similar``: the w earlier memories most similar to it by the sentence embedder, most similar last;
- ``random``: w earlier memories drawn at random (seeded), in conversation order; ``random2`` another draw (the
  next seed).

Each ensemble serves, for each memory, the element-wise mean of its pre-RoPE keys and its values over the named
contexts' encodings; the same memories in the same order for every ensemble, first token only, against prompt mode,
SmolLM2-135M-Instruct in float32. An ensemble of n contexts costs n encodings per memory at ``add`` time (in the
background) and nothing at serve time; storage is one K/V per memory, as today.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/context_ensemble.py --locomo ../shared/data/locomo/locomo10.json
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/context_ensemble.py --demo -k 5 --max-new-tokens 32

Prints mean KL (nats), median KL and first-token agreement per ensemble. With ``--max-new-tokens N`` it also decodes
greedy answers of up to N tokens in prompt mode and on each ensemble's K/V, and prints a line more per ensemble with
``inferscale eval fidelity``'s answer figures (F1 between the kv and prompt answers and against gold, budget hits,
repeats). Checks, printed: the ``temporal`` ensemble of one gives the engine's KV-mode logits for the default (within
1e-4 in any logit). About 6 minutes for the default ensembles on 40 questions, first token only, on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import torch
from locomo_probe import (
    add_slice_arguments,
    answer_line,
    contains_answer,
    embedded_conversation,
    embedded_demo,
    float32_engine,
)
from semantic_context import similar_earlier

from inferscale.cli_options import non_negative_int
from inferscale.eval.fidelity import (
    SYSTEM_PROMPTS,
    FactCache,
    FidelitySetting,
    first_token_row,
    kv_answer_fields,
    summarize_rows,
)
from inferscale.eval.fidelity_cases import FidelitySlice, retrieve_cases
from inferscale.kv.fact import FactKV
from inferscale.retrieval.embedder import SentenceTransformerEmbedder

DEFAULT_ENSEMBLES = (
    "temporal",
    "shifted",
    "similar",
    "random",
    "temporal+shifted",
    "temporal+similar",
    "temporal+random",
    "temporal+similar+random",
    "temporal+shifted+similar+random",
)


def shifted_earlier(n: int, w: int) -> list[list[int]]:
    """For each of ``n`` memories in conversation order, the indices of the ``w`` memories before the ``w`` right
    before it (``i-2w .. i-w-1``, clipped at 0), oldest first."""
    return [list(range(max(0, i - 2 * w), max(0, i - w))) for i in range(n)]


def random_earlier(n: int, w: int, seed: int) -> list[list[int]]:
    """For each of ``n`` memories in conversation order, ``w`` indices drawn without replacement from those before
    it (all of them when fewer), in conversation order; one seeded generator for the whole list."""
    rng = random.Random(seed)
    return [sorted(rng.sample(range(i), min(w, i))) for i in range(n)]


def averaged(encodings: Sequence[FactKV]) -> FactKV:
    """The element-wise mean of one fact's encodings (same tokens; keys and values
    ``[n_layers, n_kv_heads, n_tokens, head_dim]``, pre-RoPE keys), in their dtype; ``encoded_at`` of the first.

    Raises:
        ValueError: when the encodings are of different tokens, or there are none.
    """
    if not encodings:
        raise ValueError("no encodings to average")
    first = encodings[0]
    if any(not torch.equal(e.token_ids, first.token_ids) for e in encodings):
        raise ValueError("the encodings to average must be of the same fact's tokens")
    keys = torch.stack([e.keys.float() for e in encodings]).mean(0).to(first.keys.dtype)
    values = torch.stack([e.values.float() for e in encodings]).mean(0).to(first.values.dtype)
    return FactKV(keys=keys, values=values, token_ids=first.token_ids, encoded_at=first.encoded_at)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_slice_arguments(parser, locomo_required=False)
    parser.add_argument("-w", type=int, default=5, help="memories in each context (default 5)")
    parser.add_argument(
        "--demo", action="store_true", help="the bundled demo conversation instead (with -k 5 as the demo asks)"
    )
    parser.add_argument("--system-prompt", choices=sorted(SYSTEM_PROMPTS), default="default")
    parser.add_argument("--ensembles", default=",".join(DEFAULT_ENSEMBLES), help="'+'-joined contexts, comma-separated")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random contexts (default 0; random2: +1)")
    parser.add_argument(
        "--max-new-tokens",
        type=non_negative_int,
        default=0,
        help="also decode greedy answers of up to N tokens in prompt mode and on each ensemble, and report their F1 "
        "and budget hits as `inferscale eval fidelity` does (default 0: first token only)",
    )
    args = parser.parse_args()
    if not args.demo and args.locomo is None:
        parser.error("give --locomo PATH (or --demo)")
    budget = args.max_new_tokens
    ensembles = [tuple(e.split("+")) for e in args.ensembles.split(",")]

    embedder = SentenceTransformerEmbedder(None, "cpu")
    conversation = embedded_demo(embedder) if args.demo else embedded_conversation(args, embedder)
    n = len(conversation.memories)
    variants = {
        "temporal": conversation.temporal,
        "shifted": conversation.texts(shifted_earlier(n, args.w)),
        "similar": conversation.texts(similar_earlier(conversation.vectors, args.w, best_last=True)),
        "random": conversation.texts(random_earlier(n, args.w, args.seed)),
        "random2": conversation.texts(random_earlier(n, args.w, args.seed + 1)),
    }
    unknown = {c for e in ensembles for c in e} - variants.keys()
    if unknown:
        parser.error(f"unknown contexts {sorted(unknown)}; choose from {sorted(variants)}")
    used = ["temporal", *sorted({c for e in ensembles for c in e} - {"temporal"})]  # temporal: the served order
    slices: dict[str, FidelitySlice] = {
        name: retrieve_cases(name, conversation.memories, conversation.questions, args.k, embedder, variants[name])
        for name in used
    }
    engine, _ = float32_engine(args.system_prompt)
    cache = FactCache(engine)
    setting = FidelitySetting(name=f"w={args.w}", context_window=args.w)
    rows = []
    worst_check = 0.0
    for index, case in enumerate(slices["temporal"].cases):
        ids = [engine.fact_token_ids(t) for t in case.memories]
        reference = engine.first_token_logits(case.question, None, ids)
        answer = engine.generate_prompt(case.question, ids, budget) if budget else None
        per_context = {name: cache.get(part.cases[index], setting) for name, part in slices.items()}
        for ensemble in ensembles:
            facts = [averaged([per_context[c][j] for c in ensemble]) for j in range(len(case.memories))]
            logits = engine.first_token_logits(case.question, facts, serving=setting.serving)
            if ensemble == ("temporal",):
                default = engine.first_token_logits(case.question, per_context["temporal"], serving=setting.serving)
                worst_check = max(worst_check, float((logits - default).abs().max()))
            memory_tokens = sum(f.n_tokens for f in facts)
            row = first_token_row("+".join(ensemble), reference, logits, memory_tokens, case)
            if answer is not None:
                kv = engine.generate_kv(case.question, facts, budget, serving=setting.serving)
                row |= kv_answer_fields(kv, answer, budget)
            rows.append(row)
        print(f"case {index + 1}/{len(slices['temporal'].cases)}", flush=True)
    if ("temporal",) in ensembles:
        print(f"check: temporal alone against the default's KV-mode logits, max |Δ| {worst_check:.1e}")
        if worst_check > 1e-4:
            raise SystemExit("plumbing check failed: the temporal ensemble of one is not the default")
    measured = f"greedy answers of up to {budget} tokens" if budget else "first token only"
    slice_name = "demo" if args.demo else args.conversation
    print(f"{slice_name}, {args.system_prompt} prompt, k={args.k}, w={args.w}, float32, {measured}")
    summaries = summarize_rows(rows, by=("setting",))
    for summary in summaries:
        print(
            f"{summary.setting:<34} KL {summary.kl_mean:.3f}  median {summary.kl_median:.3f}  "
            f"agree {summary.top1_agreement:.2f}  (n={summary.n})"
        )
    if budget:
        for summary in summaries:
            print(answer_line(summary, budget))
        for summary in summaries:
            answered = [r for r in rows if r["setting"] == summary.setting]
            kv = sum(contains_answer(r["kv_answer"], r["gold"]) for r in answered)
            prompt = sum(contains_answer(r["prompt_answer"], r["gold"]) for r in answered)
            print(f"{summary.setting:<34} holds the gold answer: kv {kv} / prompt {prompt} of {len(answered)}")


if __name__ == "__main__":
    main()
