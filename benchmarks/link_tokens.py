"""Learned link tokens between the injected memories and the query: does a trained bridge close the gap?

Issue #10's remaining gap is the attention between the retrieved facts, which no encoding done before retrieval can
know (docs/architecture.md, runs 5-10). KVLink (Yang et al., 2025) adds trainable tokens after each segment that are
prefilled at serve time, attending to every segment before them, and fine-tunes the model with them. This probe
keeps the model frozen, as the product must (it serves any model as downloaded), and trains only L input
embeddings: prefilled after the memory segment and before the query, each attends to every injected memory, as a
recomputed tail does. They are trained by distillation, no gold answers: the loss is the first-token
KL(prompt || kv) with the links in KV mode, over cases of some LoCoMo conversations; the epoch kept is the one with
the lowest KL on held-out validation conversations; the figures are on other, test conversations.

Every case is the one ``inferscale eval fidelity`` builds (the default setting: w=5 context-window encoding, pure
injection; the same memories in the same order), first token only, SmolLM2-135M-Instruct in float32:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/link_tokens.py --locomo ../shared/data/locomo/locomo10.json

Prints, per test conversation, mean KL (nats) and first-token agreement for the default (no links), for L untrained
links (each the embedding of ``--init``: what prefilling L more tokens does by itself) and for the trained links,
with the links' cost in added prefill tokens. It checks its plumbing first: with no links, its forward pass gives the
engine's KV-mode logits (within 1e-4 in any logit), and stops otherwise. On 2 CPU cores, preparing a conversation's
40 cases (their facts encoded at w=5, prompt mode's logits) takes ~1.7 min and an epoch over 240 cases ~70 s: ~30 min
for the defaults. ``--cache-dir`` keeps prepared conversations (~1 GB each) between runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from locomo_probe import float32_engine
from transformers import DynamicCache

from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import SYSTEM_PROMPTS, FactCache, FidelitySetting
from inferscale.eval.fidelity_cases import FidelityCase, locomo_cases
from inferscale.eval.metrics import first_token_kl
from inferscale.kv.compose import assemble
from inferscale.retrieval.embedder import Embedder, SentenceTransformerEmbedder


@dataclass
class PreparedCase:
    """One question ready to serve with any links: the assembled cache and prompt mode's answer to match.

    ``keys`` / ``values``: ``[layers, n_kv_heads, n_tokens, head_dim]`` float32, the system prefix and the injected
    memories with their keys rotated to their serving positions; ``query_ids``: the tokens after the memory segment;
    ``reference``: ``[vocab]`` float32, prompt mode's first-token log-probabilities; ``kv_logits``: ``[vocab]``, the
    engine's own KV-mode logits (for the plumbing check); ``memory_tokens``: the segment's memory tokens.
    """

    keys: torch.Tensor
    values: torch.Tensor
    query_ids: list[int]
    reference: torch.Tensor
    kv_logits: torch.Tensor
    memory_tokens: int

    @property
    def n_tokens(self) -> int:
        return int(self.keys.shape[2])


def prepare(engine: TransformersEngine, cases: Sequence[FidelityCase]) -> list[PreparedCase]:
    """``cases`` ready to serve with any links: each case's facts encoded with the default setting (w=5), prompt
    mode's first-token log-probabilities and the engine's KV-mode logits."""
    stored, setting = FactCache(engine), FidelitySetting()
    out = []
    with torch.inference_mode():
        for case in cases:
            fact_ids = [engine.fact_token_ids(t) for t in case.memories]
            reference = engine.first_token_logits(case.question, None, fact_ids)
            facts = stored.get(case, setting)
            segment = assemble(engine.prefix_kv, facts, engine.rope_table)
            n = segment.n_tokens
            out.append(
                PreparedCase(
                    keys=segment.keys[:, :, :n].clone(),
                    values=segment.values[:, :, :n].clone(),
                    query_ids=engine.conversation_token_ids(case.question),
                    reference=torch.log_softmax(reference, -1),
                    kv_logits=engine.first_token_logits(case.question, facts),
                    memory_tokens=n - engine.prefix_kv.n_tokens,
                )
            )
    return out


def load_or_prepare(
    engine: TransformersEngine, conversation: str, args: argparse.Namespace, embedder: Embedder
) -> list[PreparedCase]:
    """The conversation's first ``args.questions`` cases, retrieved top-``args.k``, through :func:`prepare`; kept
    in ``args.cache_dir`` (when given) under the slice's name."""
    path = None
    if args.cache_dir is not None:
        path = Path(args.cache_dir) / f"{conversation}-{args.system_prompt}-q{args.questions}-k{args.k}.pt"
        if path.exists():
            cached: list[PreparedCase] = torch.load(path, weights_only=False)
            return cached
    cases = prepare(engine, locomo_cases(args.locomo, conversation, args.questions, args.k, embedder).cases)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(cases, path)
    return cases


def served_logits(model: Any, case: PreparedCase, links: torch.Tensor | None) -> torch.Tensor:
    """``[vocab]`` float32: the first answer token's logits with ``links`` (``[L, hidden_size]``, or none) and then
    the query prefilled after the memory segment, in one forward pass (differentiable in ``links``)."""
    data = [(case.keys[i][None].clone(), case.values[i][None].clone()) for i in range(case.keys.shape[0])]
    cache = DynamicCache(ddp_cache_data=data, config=model.config)
    embeds = model.model.embed_tokens(torch.tensor([case.query_ids]))
    if links is not None:
        embeds = torch.cat([links[None], embeds], dim=1)
    positions = torch.arange(case.n_tokens, case.n_tokens + embeds.shape[1])[None]
    out = model(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True)
    return out.logits[0, -1].float()


def distillation_loss(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(reference || softmax(logits)) in nats, differentiable in ``logits`` (``[vocab]``); ``reference``:
    log-probabilities ``[vocab]``. The training loss: what :func:`~inferscale.eval.metrics.first_token_kl` measures."""
    return F.kl_div(torch.log_softmax(logits, -1), reference, reduction="sum", log_target=True)


def measure(model: Any, cases: Sequence[PreparedCase], links: torch.Tensor | None) -> tuple[float, float]:
    """Mean first-token KL(prompt || kv) and first-token agreement over ``cases``."""
    kls, agree = [], []
    with torch.inference_mode():
        for case in cases:
            logits = served_logits(model, case, links)
            kls.append(first_token_kl(case.reference, logits))
            agree.append(float(logits.argmax() == case.reference.argmax()))
    return statistics.fmean(kls), statistics.fmean(agree)


def train_links(
    model: Any,
    train: list[PreparedCase],
    validation: Sequence[PreparedCase],
    start: torch.Tensor,
    epochs: int,
    lr: float,
) -> tuple[torch.Tensor, int, list[str]]:
    """Adam on the links alone, one case per step, for ``epochs`` epochs. Returns the links of the epoch with the
    lowest validation KL, that epoch (0-based) and one log line per epoch."""
    links = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([links], lr=lr)
    best, best_epoch, best_kl, log = start.clone(), -1, measure(model, validation, start)[0], []
    order = list(train)
    for epoch in range(epochs):
        random.shuffle(order)
        losses = []
        for case in order:
            optimizer.zero_grad()
            loss = distillation_loss(case.reference, served_logits(model, case, links))
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        kl, agree = measure(model, validation, links.detach())
        log.append(f"epoch {epoch}: train KL {statistics.fmean(losses):.4f}, validation KL {kl:.4f} agree {agree:.3f}")
        if kl < best_kl:
            best, best_epoch, best_kl = links.detach().clone(), epoch, kl
    return best, best_epoch, log


PLUMBING_TOLERANCE = 1e-4
"""The largest |Δ| in a logit the plumbing check allows (float32 kernels' rounding is ~1e-5)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", required=True, help="the LoCoMo file (never copied into the repo)")
    parser.add_argument("--train", default="conv-41,conv-42,conv-43,conv-44,conv-47,conv-48")
    parser.add_argument("--validation", default="conv-49,conv-50")
    parser.add_argument("--test", default="conv-26,conv-30")
    parser.add_argument("--questions", type=int, default=40, help="questions of categories 1-4 per conversation")
    parser.add_argument("-k", type=int, default=10, help="memories per question (default 10)")
    parser.add_argument("--links", type=int, default=8, help="link tokens L (default 8)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    parser.add_argument("--init", default="\n", help="the text whose mean token embedding starts every link")
    parser.add_argument("--system-prompt", default="default", choices=sorted(SYSTEM_PROMPTS))
    parser.add_argument("--cache-dir", default=None, help="where prepared conversations are kept between runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    engine, model = float32_engine(args.system_prompt)
    engine.load()
    model.requires_grad_(False)
    embedder = SentenceTransformerEmbedder(None, "cpu")
    slices = {
        name: {c: load_or_prepare(engine, c, args, embedder) for c in getattr(args, name).split(",")}
        for name in ("train", "validation", "test")
    }
    worst = max(
        float((served_logits(model, case, None) - case.kv_logits).abs().max())
        for cases in slices["test"].values()
        for case in cases
    )
    if worst > PLUMBING_TOLERANCE:
        raise SystemExit(f"plumbing check: no links gives KV mode's logits off by {worst:.2e}")

    init_ids = engine.tokenizer(args.init, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        start = model.model.embed_tokens(torch.tensor(init_ids)).mean(0).repeat(args.links, 1)
    train = [case for cases in slices["train"].values() for case in cases]
    validation = [case for cases in slices["validation"].values() for case in cases]
    links, epoch, log = train_links(model, train, validation, start, args.epochs, args.lr)
    kl, agree = measure(model, validation, None)
    print("\n".join([f"validation without links: KL {kl:.4f} agree {agree:.3f}", *log]))

    print(
        f"{len(train)} training, {len(validation)} validation cases; L={args.links}, kept epoch {epoch}; "
        f"{args.system_prompt} system prompt, k={args.k}, float32; check: no links = KV mode within {worst:.1e}"
    )
    for conversation, cases in slices["test"].items():
        added = args.links / statistics.fmean(c.memory_tokens for c in cases)
        rows = {
            "default (no links)": None,
            f"{args.links} untrained links": start,
            f"{args.links} trained links": links,
        }
        for name, value in rows.items():
            kl, agree = measure(model, cases, value)
            cost = "0" if value is None else f"{args.links} tokens ({added:.1%} of the memory tokens)"
            print(f"{conversation} {name:<24} KL {kl:.4f}  agree {agree:.3f}  added: {cost}")


if __name__ == "__main__":
    main()
