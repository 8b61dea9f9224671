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
- ``shifted``: the w memories that end w memories before it, in conversation order (across sessions; early in a
  session it need not meet the temporal context);
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
repeats), and with ``--demo`` how many answers hold the expected one. Checks, printed, that stop the run when off:
every memory is encoded after the context each variant gives it (two variants whose last w turns differ give different
K/V, equal turns the same K/V). About 6 minutes for the default ensembles on 40 questions, first token only, on 2 CPU
cores.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from locomo_probe import (
    EmbeddedConversation,
    add_slice_arguments,
    answer_line,
    contains_answer,
    embedded_conversation,
    embedded_demo,
    float32_engine,
)
from semantic_context import similar_earlier

from inferscale.cli_options import non_negative_int, positive_int
from inferscale.eval.fidelity import (
    SYSTEM_PROMPTS,
    FactCache,
    FidelitySetting,
    first_token_row,
    kv_answer_fields,
    prompt_reference,
    summarize_rows,
)
from inferscale.eval.fidelity_cases import MAX_CONTEXT_TURNS, FidelityCase, retrieve_cases
from inferscale.kv.fact import FactKV
from inferscale.retrieval.embedder import SentenceTransformerEmbedder

CONTEXTS = ("temporal", "shifted", "similar", "random", "random2")
"""The contexts an ensemble can name (the module notes say what each is)."""

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
    """For each of ``n`` memories in conversation order, the indices of the ``w`` memories that end ``w`` memories
    before it (``i-2w .. i-w-1``, clipped at 0), oldest first."""
    return [list(range(max(0, i - 2 * w), max(0, i - w))) for i in range(n)]


def random_earlier(n: int, w: int, seed: int) -> list[list[int]]:
    """For each of ``n`` memories in conversation order, ``w`` indices drawn without replacement from those before
    it (all of them when fewer), in conversation order; one seeded generator for the whole list."""
    rng = random.Random(seed)
    return [sorted(rng.sample(range(i), min(w, i))) for i in range(n)]


def context_variants(conversation: EmbeddedConversation, w: int, seed: int) -> dict[str, list[list[str]]]:
    """Each of :data:`CONTEXTS` for every memory of ``conversation`` (texts, oldest first): ``temporal`` as the
    conversation records it, the others from :func:`shifted_earlier`, ``similar_earlier`` (most similar last) and
    :func:`random_earlier` (``seed``; ``random2``: ``seed + 1``)."""
    n = len(conversation.memories)
    return {
        "temporal": conversation.temporal,
        "shifted": conversation.texts(shifted_earlier(n, w)),
        "similar": conversation.texts(similar_earlier(conversation.vectors, w, best_last=True)),
        "random": conversation.texts(random_earlier(n, w, seed)),
        "random2": conversation.texts(random_earlier(n, w, seed + 1)),
    }


def with_contexts(case: FidelityCase, contexts: Mapping[str, Sequence[str]]) -> FidelityCase:
    """``case`` with each of its memories' context replaced by that memory's entry of ``contexts`` (memory text ->
    its context turns, oldest first)."""
    return case.model_copy(update={"contexts": [list(contexts[t]) for t in case.memories]})


def averaged(encodings: Sequence[FactKV]) -> FactKV:
    """The element-wise mean of one fact's encodings (same tokens; keys and values
    ``[n_layers, n_kv_heads, n_tokens, head_dim]`` in a float dtype, pre-RoPE keys), in their dtype. ``encoded_at`` is
    the first encoding's, a label only: the mean was encoded at no one position, and serving does not read it.

    Raises:
        ValueError: when there are no encodings, they are of different tokens, or one is held in 8 bits (average
            dequantized K/V, never codes).
    """
    if not encodings:
        raise ValueError("no encodings to average")
    first = encodings[0]
    if any(e.scales is not None for e in encodings):
        raise ValueError("8-bit K/V cannot be averaged as codes: dequantize them first")
    if any(not torch.equal(e.token_ids, first.token_ids) for e in encodings):
        raise ValueError("the encodings to average must be of the same fact's tokens")
    keys = torch.stack([e.keys.float() for e in encodings]).mean(0).to(first.keys.dtype)
    values = torch.stack([e.values.float() for e in encodings]).mean(0).to(first.values.dtype)
    return FactKV(keys=keys, values=values, token_ids=first.token_ids, encoded_at=first.encoded_at)


def context_mismatches(
    cases: dict[str, FidelityCase], encoded: dict[str, list[FactKV]], w: int
) -> list[tuple[str, int]]:
    """``(variant, memory index)`` of every memory whose K/V under a variant disagree with its context: compared with
    the ``temporal`` variant, the same last ``w`` context turns must give identical K/V and different ones different
    K/V (a cache that ignored the context would make every ensemble the default)."""
    base, base_facts = cases["temporal"], encoded["temporal"]
    wrong = []
    for name, case in cases.items():
        for j, fact in enumerate(encoded[name]):
            same_context = case.context_of(j)[-w:] == base.context_of(j)[-w:]
            if same_context != torch.equal(fact.keys, base_facts[j].keys):
                wrong.append((name, j))
    return wrong


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, every option checked (no model or file is loaded before).

    Raises:
        SystemExit: (code 2) for a bad option, an unknown context in ``--ensembles``, ``-w`` outside 1 ..
            :data:`~inferscale.eval.fidelity_cases.MAX_CONTEXT_TURNS`, or neither or both of ``--locomo`` and
            ``--demo``.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_slice_arguments(parser, locomo_required=False)
    parser.add_argument("-w", type=positive_int, default=5, help="memories in each context (default 5)")
    parser.add_argument("--demo", action="store_true", help="the bundled demo conversation instead of --locomo")
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
    args = parser.parse_args(argv)
    if args.demo == (args.locomo is not None):
        parser.error("give one of --locomo PATH and --demo")
    if args.w > MAX_CONTEXT_TURNS:
        parser.error(f"-w is at most {MAX_CONTEXT_TURNS} (the longest context a setting takes), got {args.w}")
    args.ensembles = [tuple(e.split("+")) for e in args.ensembles.split(",")]
    unknown = {c for e in args.ensembles for c in e} - set(CONTEXTS)
    if unknown:
        parser.error(f"unknown contexts {sorted(unknown)} in --ensembles; choose from {', '.join(CONTEXTS)}")
    return args


def main() -> None:
    args = parse_arguments()
    ensembles: list[tuple[str, ...]] = args.ensembles
    budget: int = args.max_new_tokens

    embedder = SentenceTransformerEmbedder(None, "cpu")
    if args.demo:
        conversation = embedded_demo(embedder)
    else:
        conversation = embedded_conversation(args.locomo, args.conversation, args.questions, embedder)
    variants = context_variants(conversation, args.w, args.seed)
    used = ["temporal", *sorted({c for e in ensembles for c in e} - {"temporal"})]  # temporal: the served order
    served = retrieve_cases(
        "temporal", conversation.memories, conversation.questions, args.k, embedder, variants["temporal"]
    )
    by_text = {name: dict(zip(conversation.memories, variants[name], strict=True)) for name in used}
    engine, _ = float32_engine(args.system_prompt)
    cache = FactCache(engine)
    setting = FidelitySetting(
        name=f"w={args.w}", context_window=args.w, storage_format="model", first_memory_context_free=False
    )
    rows: list[dict[str, Any]] = []
    checked = 0
    for index, case in enumerate(served.cases):
        prompt = prompt_reference(engine, case, budget, generate=budget > 0)
        reference, answer = prompt["logits"], prompt.get("generation")
        cases = {name: with_contexts(case, by_text[name]) for name in used}
        per_context = {name: cache.get(c, setting) for name, c in cases.items()}
        wrong = context_mismatches(cases, per_context, args.w)
        if wrong:
            raise SystemExit(f"check failed: K/V that do not follow their context (variant, memory): {wrong}")
        checked += len(used) * len(case.memories)
        for ensemble in ensembles:
            facts = [averaged([per_context[c][j] for c in ensemble]) for j in range(len(case.memories))]
            logits = engine.first_token_logits(case.question, facts, serving=setting.serving)
            memory_tokens = sum(f.n_tokens for f in facts)
            row = first_token_row("+".join(ensemble), reference, logits, memory_tokens, case)
            if answer is not None:
                kv = engine.generate_kv(case.question, facts, budget, serving=setting.serving)
                row |= kv_answer_fields(kv, answer, budget)
            rows.append(row)
        print(f"case {index + 1}/{len(served.cases)}", flush=True)
    print(f"check: {checked} encodings follow their contexts (same last {args.w} turns, same K/V; else different)")
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
        first = [r for r in rows if r["setting"] == summaries[0].setting]
        right_prompt = sum(contains_answer(r["prompt_answer"], r["gold"]) for r in first)
        print(f"prompt mode: {right_prompt} of {len(first)} answers hold the gold answer")
        for summary in summaries:
            right = sum(contains_answer(r["kv_answer"], r["gold"]) for r in rows if r["setting"] == summary.setting)
            print(f"{summary.setting:<34} {right} of {len(first)} answers hold the gold answer")


if __name__ == "__main__":
    main()
