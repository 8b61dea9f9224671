"""Context-window encoding after the turns before a memory against after its most similar earlier memories.

Issue #10 asks whether any encoding done at ``add`` time can bring KV-injected answers closer to pasted ones. The
default encodes each memory after the w turns right before it (temporal context). A memory served at request time
sits among the other top-k memories of the question, which are similar to each other; this benchmark tests whether
encoding each memory after the w earlier memories most similar to it (by the sentence embedder, as ``search``
ranks them; only memories stored before it, as ``add`` would see) brings its K/V closer to what prompt mode computes.

Three slices of the same LoCoMo conversation, the same retrieved memories in the same order, w=5, first token only,
the default system prompt, SmolLM2-135M-Instruct in float32:

- ``temporal``: the product's context (the turns before the memory in its session);
- ``similar, in time order``: the w most similar earlier memories, oldest first;
- ``similar, best last``: the same, the most similar right before the memory.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/semantic_context.py --locomo ../shared/data/locomo/locomo10.json

Prints mean first-token KL(prompt || kv) and top-1 agreement per slice (``inferscale eval fidelity``'s runner).
"""

from __future__ import annotations

import argparse

import numpy as np
from locomo_probe import add_slice_arguments, embedded_conversation, float32_engine

from inferscale.eval.fidelity import FidelitySetting, run_fidelity, summarize_rows
from inferscale.eval.fidelity_cases import FidelitySlice, retrieve_cases
from inferscale.retrieval.embedder import SentenceTransformerEmbedder


def similar_earlier(vectors: np.ndarray, w: int, best_last: bool) -> list[list[int]]:
    """For each memory i (rows of ``vectors``: float32 ``[n, dim]``, unit norm), the indices of the ``w`` memories
    before it with the highest cosine similarity, oldest first or (``best_last``) most similar last."""
    out: list[list[int]] = []
    for i in range(len(vectors)):
        scores = vectors[:i] @ vectors[i]
        top = [int(j) for j in np.argsort(-scores, kind="stable")[:w]]
        out.append(list(reversed(top)) if best_last else sorted(top))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_slice_arguments(parser)
    parser.add_argument("-w", type=int, default=5, help="context memories before each memory (default 5)")
    args = parser.parse_args()

    embedder = SentenceTransformerEmbedder(None, "cpu")
    conversation = embedded_conversation(args.locomo, args.conversation, args.questions, embedder)
    vectors = conversation.vectors
    variants = {
        "temporal": conversation.temporal,
        "similar, in time order": conversation.texts(similar_earlier(vectors, args.w, best_last=False)),
        "similar, best last": conversation.texts(similar_earlier(vectors, args.w, best_last=True)),
    }
    slices: list[FidelitySlice] = [
        retrieve_cases(name, conversation.memories, conversation.questions, args.k, embedder, ctx)
        for name, ctx in variants.items()
    ]
    engines = {"default": float32_engine()[0]}
    setting = FidelitySetting(name=f"w={args.w}", context_window=args.w, first_memory_context_free=False)
    rows = run_fidelity(engines, slices, [setting], generate=False)
    for summary in summarize_rows(rows, by=("slice",)):
        print(f"{summary.slice:<24} KL {summary.kl_mean:.3f}  agree {summary.top1_agreement:.2f}  (n={summary.n})")


if __name__ == "__main__":
    main()
