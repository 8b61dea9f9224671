"""Context-window encoding in blocks: what one shared forward pass per block of turns would cost in fidelity.

Issue #16 asks for fact encoding at 80% of the model's plain prefill rate in fact tokens/s. The default encodes
each memory after the w turns right before it (w=5), so every encoding pass prefills about six turns to keep one,
and no two memories' inputs share a prefix beyond the system prefix. A context defined per block of B turns would
let one causal pass encode the whole block: each turn is encoded after the w turns before its block and the
block's turns before it, so its encoding input is a prefix of the next turn's, and the block's K/V are slices of
one pass over ``[system prefix][w turns][B turns]``, exactly what a fresh per-memory encoding of that context gives.
The price is a longer context for the later turns of a block (w to w + B - 1 turns). This benchmark measures that
price, with the prefill cost each B would have:

- ``B=1`` is the product's context (the w turns before the memory), the reference row;
- ``B=5 / 10 / 12``: block contexts, every turn of the block encoded after at most w + B - 1 turns. B is at most
  17 - w (12 for w=5): a setting takes at most 16 context turns (``MAX_CONTEXT_TURNS``), and a longer block would
  have to cut its last turns' contexts, which one pass over the block cannot give.

The same retrieved memories in the same order for every B, first token only, the default system prompt,
SmolLM2-135M-Instruct in float32:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/block_contexts.py --locomo ../shared/data/locomo/locomo10.json

Prints, per B, the mean context length (turns), the tokens one would prefill per fact token (system prefix cached,
as the encoder caches it), mean first-token KL(prompt || kv) and top-1 agreement (``inferscale eval fidelity``'s
runner).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from locomo_probe import add_slice_arguments, float32_engine

from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import FidelitySetting, run_fidelity, summarize_rows
from inferscale.eval.fidelity_cases import MAX_CONTEXT_TURNS, FidelitySlice, locomo_conversation, retrieve_cases


def largest_block(w: int) -> int:
    """The largest block whose every context (at most w + B - 1 turns) a setting can take whole."""
    return MAX_CONTEXT_TURNS - w + 1


def block_contexts(sessions: Sequence[Sequence[str]], w: int, block: int) -> tuple[list[str], list[list[str]]]:
    """Each distinct text once, with its block context: the ``w`` turns before its block of ``block`` turns in its
    session and the block's turns before it. ``block=1`` gives the product's context (the ``w`` turns right before
    it).

    Raises:
        ValueError: for ``w`` < 0, ``block`` < 1, or a block longer than :func:`largest_block`.
    """
    if w < 0 or not 1 <= block <= largest_block(w):
        raise ValueError(f"w={w}, B={block}: need w >= 0 and 1 <= B <= {largest_block(max(w, 0))}")
    memories: list[str] = []
    contexts: list[list[str]] = []
    seen: set[str] = set()
    for turns in sessions:
        for i, text in enumerate(turns):
            if text in seen:
                continue
            seen.add(text)
            start = i - i % block
            memories.append(text)
            contexts.append(list(turns[max(0, start - w) : i]))
    return memories, contexts


def prefill_per_fact_token(engine: TransformersEngine, sessions: Sequence[Sequence[str]], w: int, block: int) -> float:
    """Tokens prefilled per fact token when every block of ``block`` turns is encoded in one pass after the ``w``
    turns before it (the system prefix cached once, not counted)."""
    prefilled = facts = 0
    for turns in sessions:
        for start in range(0, len(turns), block):
            context = list(turns[max(0, start - w) : start])
            kept = sum(len(engine.fact_token_ids(t)) for t in turns[start : start + block])
            prefilled += (len(engine.context_token_ids(context)) if context else 0) + kept
            facts += kept
    return prefilled / facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_slice_arguments(parser)
    parser.add_argument("-w", type=int, default=5, help="turns before each block (default 5)")
    parser.add_argument(
        "--blocks", nargs="+", type=int, default=[1, 5, 10, 12], help="block sizes B (default 1 5 10 12)"
    )
    args = parser.parse_args()
    blocks: list[int] = args.blocks
    if args.w < 0 or any(not 1 <= b <= largest_block(args.w) for b in blocks):
        parser.error(f"need -w >= 0 and every block size 1 <= B <= {largest_block(max(args.w, 0))} (16 turns at most)")

    from inferscale.retrieval.embedder import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(None, "cpu")
    sessions, questions = locomo_conversation(args.locomo, args.conversation, args.questions)
    engine, _ = float32_engine()
    slices: list[FidelitySlice] = []
    cost: dict[str, tuple[float, float]] = {}
    for block in blocks:
        memories, contexts = block_contexts(sessions, args.w, block)
        name = f"B={block}"
        slices.append(retrieve_cases(name, memories, questions, args.k, embedder, contexts))
        mean_turns = sum(len(c) for c in contexts) / len(contexts)
        cost[name] = (mean_turns, prefill_per_fact_token(engine, sessions, args.w, block))
    setting = FidelitySetting(name="block context", context_window=MAX_CONTEXT_TURNS, first_memory_context_free=False)
    rows = run_fidelity({"default": engine}, slices, [setting], generate=False)
    for summary in summarize_rows(rows, by=("slice",)):
        turns, per_fact = cost[summary.slice]
        print(
            f"{summary.slice:<6} context {turns:4.1f} turns  prefill {per_fact:4.2f}x the fact tokens  "
            f"KL {summary.kl_mean:.3f}  agree {summary.top1_agreement:.2f}  (n={summary.n})"
        )


if __name__ == "__main__":
    main()
