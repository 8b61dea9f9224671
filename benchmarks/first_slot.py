"""Serve the first memory of the segment from its context-free encoding: its K/V are then prompt mode's exactly.

Issue #10. In prompt mode the first memory line of the segment sees the system prefix and nothing else, at the
positions right after it. Its context-free encoding (w=0, after the system prefix: pure injection's) is therefore
exactly what prompt mode computes for that line, where the default's encoding (after its w=5 context turns) is
not. Every later line of prompt mode sees the lines before it, which no encoding done at ``add`` time knows; the
default's context turns stand in for them.

The probe serves the same memories in the same order under three schemes, each memory's K/V taken from one of its
encodings after its last w context turns (w = 0..5, as ``inferscale eval fidelity`` encodes them):

- ``w=5``: every slot from the w=5 encoding (the product's default);
- ``first slot w=0``: slot 0 from the w=0 encoding, every other slot from the w=5 one;
- ``slot-matched``: slot i from the encoding with w = min(i, 5), so each memory saw as many lines before it as it
  has in the segment.

Before measuring, it checks its plumbing on every case: the first memory served alone from its w=0 encoding gives
prompt mode's first-token logits for that memory alone (within 1e-4), and the ``w=5`` scheme gives the fidelity
runner's K/V.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/first_slot.py --locomo ../shared/data/locomo/locomo10.json \\
        --conversation conv-26 --system-prompt default

Prints mean first-token KL(prompt || kv) and top-1 agreement per scheme; ``--max-new-tokens 32`` adds the answers
(F1 against prompt mode's and against gold, budget hits).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from locomo_probe import add_slice_arguments, float32_engine

from inferscale.eval.fidelity import (
    FactCache,
    FidelitySetting,
    first_token_row,
    kv_answer_fields,
    prompt_reference,
    summarize_rows,
)
from inferscale.eval.fidelity_cases import FidelityCase, demo_cases, locomo_cases
from inferscale.kv.fact import FactKV
from inferscale.retrieval.embedder import SentenceTransformerEmbedder

DEFAULT_WINDOW = 5
PLUMBING_TOLERANCE = 1e-4

Scheme = Callable[[int], int]
"""The context window whose encoding serves layout slot i."""

SCHEMES: dict[str, Scheme] = {
    "w=5": lambda slot: DEFAULT_WINDOW,
    "first slot w=0": lambda slot: 0 if slot == 0 else DEFAULT_WINDOW,
    "slot-matched": lambda slot: min(slot, DEFAULT_WINDOW),
}


def served(case: FidelityCase, encodings: dict[int, list[FactKV]], scheme: Scheme) -> list[FactKV]:
    """The case's memories in layout order, slot i from ``encodings[scheme(i)]`` (each a list of the case's facts
    encoded after their last w context turns, in layout order)."""
    return [encodings[scheme(slot)][slot] for slot in range(len(case.memories))]


def check_plumbing(engine: Any, case: FidelityCase, encodings: dict[int, list[FactKV]], cache: FactCache) -> None:
    """Stop when the first memory alone, served from its w=0 encoding, is not prompt mode's first line (max logit
    difference over ``PLUMBING_TOLERANCE``), or the ``w=5`` scheme is not the fidelity runner's w=5 K/V (its
    default setting with every slot in context)."""
    prompt = engine.first_token_logits(case.question, None, [engine.fact_token_ids(case.memories[0])])
    kv = engine.first_token_logits(case.question, encodings[0][:1])
    gap = float((prompt - kv).abs().max())
    if gap > PLUMBING_TOLERANCE:
        raise SystemExit(f"plumbing: the first memory's w=0 K/V differ from prompt mode's by {gap:.2e} in a logit")
    default = cache.get(case, FidelitySetting(first_memory_context_free=False))
    if any(a is not b for a, b in zip(default, served(case, encodings, SCHEMES["w=5"]), strict=True)):
        raise SystemExit("plumbing: the w=5 scheme does not serve the fidelity runner's w=5 K/V")


def measure(
    engine: Any,
    cases: Sequence[FidelityCase],
    max_new_tokens: int,
    progress: Callable[[str], None],
    schemes: Sequence[str] = tuple(SCHEMES),
) -> list[dict[str, Any]]:
    """One row per (case, scheme named in ``schemes``), as :func:`inferscale.eval.fidelity.run_fidelity` writes
    them."""
    cache = FactCache(engine)
    rows: list[dict[str, Any]] = []
    generate = max_new_tokens > 0
    for index, case in enumerate(cases):
        encodings = {
            w: cache.get(case, FidelitySetting(context_window=w, first_memory_context_free=False))
            for w in range(DEFAULT_WINDOW + 1)
        }
        check_plumbing(engine, case, encodings, cache)
        reference = prompt_reference(engine, case, max_new_tokens, generate)
        for name in schemes:
            facts = served(case, encodings, SCHEMES[name])
            logits = engine.first_token_logits(case.question, facts)
            row = first_token_row(name, reference["logits"], logits, sum(f.n_tokens for f in facts), case)
            if generate:
                answer = engine.generate_kv(case.question, facts, max_new_tokens)
                row.update(kv_answer_fields(answer, reference["generation"], max_new_tokens))
            rows.append({"case": index, **row})
        progress(f"case {index + 1}/{len(cases)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_slice_arguments(parser, locomo_required=False)
    parser.add_argument("--demo", action="store_true", help="the bundled demo (k=5 unless -k says otherwise)")
    parser.add_argument("--system-prompt", default="default", help="short, default or long (default: default)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="answer budget; 0 measures the first token")
    parser.add_argument(
        "--schemes", nargs="+", choices=list(SCHEMES), default=list(SCHEMES), help="the schemes to serve (default: all)"
    )
    args = parser.parse_args()
    if not args.demo and not args.locomo:
        parser.error("give --locomo PATH or --demo")

    embedder = SentenceTransformerEmbedder(None, "cpu")
    part = (  # each memory's context within its own session, as runs 21 and 22 measured
        demo_cases(args.k, embedder, across_sessions=False)
        if args.demo
        else locomo_cases(args.locomo, args.conversation, args.questions, args.k, embedder, across_sessions=False)
    )
    engine, _ = float32_engine(args.system_prompt)
    rows = measure(engine, part.cases, args.max_new_tokens, lambda line: print(line, flush=True), args.schemes)
    for summary in summarize_rows(rows, by=("setting",)):
        line = f"{summary.setting:<16} KL {summary.kl_mean:.3f}  agree {summary.top1_agreement:.2f}"
        if args.max_new_tokens:
            gold = (
                ""
                if summary.f1_kv_gold is None
                else f"  F1 gold {summary.f1_kv_gold:.3f} ({summary.f1_prompt_gold:.3f})"
            )
            line += (
                f"  F1 kv~prompt {summary.f1_kv_vs_prompt:.3f}{gold}"
                f"  budget {summary.kv_budget_hit:.2f} ({summary.prompt_budget_hit:.2f})"
            )
        print(f"{part.name} {args.system_prompt}: {line}  (n={summary.n})")
    if args.demo and args.max_new_tokens:
        for row in rows:
            print(f"  {row['setting']:<16} {row['gold']!r}: {row['kv_answer']!r} | prompt: {row['prompt_answer']!r}")


if __name__ == "__main__":
    main()
