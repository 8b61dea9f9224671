"""Learned link tokens between the injected memories and the query: does a trained bridge close the gap?

Issue #10's remaining gap is the attention between the retrieved facts, which no encoding done before retrieval can
know (docs/architecture.md, runs 5-10). KVLink (Yang et al., 2025, arXiv:2502.16002) adds trainable tokens after
each segment that are prefilled at serve time, attending to every segment before them, and fine-tunes the model
with them. This probe keeps the model frozen, as the product must (it serves any model as downloaded), and trains
only L input embeddings: prefilled after the memory segment and before the query, each attends to every injected
memory, as a recomputed tail does. They are trained by distillation, no gold answers: the loss is the first-token
KL(prompt || kv) with the links in KV mode, over cases of some LoCoMo conversations; the epoch kept is the one with
the lowest KL on held-out validation conversations (or none, the untrained links, when no epoch beats them); the
figures are on other, test conversations.

Every case is the one ``inferscale eval fidelity`` builds (the default setting: w=5 context-window encoding, pure
injection; the same memories in the same order), first token only, SmolLM2-135M-Instruct in float32:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/link_tokens.py --locomo ../shared/data/locomo/locomo10.json

Prints, per test conversation, mean KL (nats) and first-token agreement for the default (no links), for L untrained
links (each the embedding of ``--init``: what prefilling L more tokens does by itself) and for the trained links,
with the links' cost in added prefill tokens. It checks its plumbing on every conversation as soon as it is
prepared, the test ones first: with no links, its forward pass gives the engine's KV-mode logits (within 1e-4 in any
logit), and it stops otherwise. On 2 CPU cores, preparing a conversation's 40 cases (their facts encoded at w=5,
prompt mode's logits) takes ~1.7 min and an epoch over 240 cases ~70 s: ~30 min for the defaults (~17 to prepare,
~12 to train). Every prepared conversation stays in memory (~1 GB each, ~10 GB for the defaults); ``--cache-dir``
keeps them on disk between runs, under the model's fingerprint.
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
from locomo_probe import dynamic_cache, float32_engine

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
    ``reference``: ``[vocab]`` float32, prompt mode's first-token log-probabilities; ``kv_logits``: ``[vocab]``
    float32, the engine's own KV-mode logits (for the plumbing check); ``memory_tokens``: S, the segment's memory
    tokens (the links' cost is counted against it). Tensors made under inference mode: :func:`served_logits` clones
    what it extends.
    """

    keys: torch.Tensor
    values: torch.Tensor
    query_ids: list[int]
    reference: torch.Tensor
    kv_logits: torch.Tensor
    memory_tokens: int

    @property
    def n_tokens(self) -> int:
        """P + S tokens: the position the first link (or, without links, the query) is prefilled at."""
        return int(self.keys.shape[2])

    def to_dict(self) -> dict[str, Any]:
        """Tensors and ints only (what ``torch.load(..., weights_only=True)`` reads back)."""
        return {**vars(self), "query_ids": torch.tensor(self.query_ids)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedCase:
        return cls(**{**data, "query_ids": data["query_ids"].tolist()})


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
            out.append(
                PreparedCase(
                    keys=segment.keys.clone(),  # [layers, n_kv, P + S, head_dim]: a copy, not the workspace
                    values=segment.values.clone(),
                    query_ids=engine.conversation_token_ids(case.question),
                    reference=torch.log_softmax(reference, -1),
                    kv_logits=engine.first_token_logits(case.question, facts),
                    memory_tokens=segment.memory_tokens,
                )
            )
    return out


def load_or_prepare(
    engine: TransformersEngine, conversation: str, args: argparse.Namespace, embedder: Embedder
) -> list[PreparedCase]:
    """The conversation's first ``args.questions`` cases, retrieved top-``args.k``, through :func:`prepare`; kept
    in ``args.cache_dir`` (when given) under the model's fingerprint and the slice's name."""
    path = None
    if args.cache_dir is not None:
        name = f"{engine.fingerprint[:12]}-{conversation}-{args.system_prompt}-q{args.questions}-k{args.k}.pt"
        path = Path(args.cache_dir) / name
        if path.exists():
            return [PreparedCase.from_dict(d) for d in torch.load(path, weights_only=True)]
    cases = prepare(engine, locomo_cases(args.locomo, conversation, args.questions, args.k, embedder).cases)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save([c.to_dict() for c in cases], path)
    return cases


def served_logits(model: Any, case: PreparedCase, links: torch.Tensor | None) -> torch.Tensor:
    """``[vocab]`` float32: the first answer token's logits with ``links`` (``[L, hidden_size]`` float32, or none)
    and then the query prefilled after the memory segment, in one forward pass (differentiable in ``links``): the
    links at positions ``P+S .. P+S+L-1``, the query from ``P+S+L``, each attending causally to the whole cache."""
    cache = dynamic_cache(case.keys, case.values, model.config)
    embeds = model.model.embed_tokens(torch.tensor([case.query_ids]))
    if links is not None:
        embeds = torch.cat([links[None], embeds], dim=1)
    positions = torch.arange(case.n_tokens, case.n_tokens + embeds.shape[1])[None]
    out = model(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float()


def distillation_loss(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(reference || softmax(logits)) in nats, differentiable in ``logits`` (``[vocab]``); ``reference``:
    log-probabilities ``[vocab]``. The training loss: what :func:`~inferscale.eval.metrics.first_token_kl` measures."""
    return F.kl_div(torch.log_softmax(logits, -1), reference, reduction="sum", log_target=True)


def measure(model: Any, cases: Sequence[PreparedCase], links: torch.Tensor | None) -> tuple[float, float]:
    """Mean first-token KL(prompt || kv) in nats and first-token agreement (the fraction of cases whose top token
    is prompt mode's) over ``cases``, with ``links`` (``[L, hidden_size]``, or none)."""
    kls, agree = [], []
    with torch.inference_mode():
        for case in cases:
            logits = served_logits(model, case, links)
            kls.append(first_token_kl(case.reference, logits))
            agree.append(float(logits.argmax() == case.reference.argmax()))
    return statistics.fmean(kls), statistics.fmean(agree)


@dataclass(frozen=True)
class Epoch:
    """One epoch of :func:`train_links`: the mean of its steps' losses (nats, taken while the links moved), and
    the validation KL (nats) and agreement of the links it ended with."""

    train_kl: float
    validation_kl: float
    validation_agree: float


def train_links(
    model: Any,
    train: Sequence[PreparedCase],
    validation: Sequence[PreparedCase],
    start: torch.Tensor,
    epochs: int,
    lr: float,
    rng: random.Random,
) -> tuple[torch.Tensor, int, list[Epoch]]:
    """Adam on the links alone (``start``: ``[L, hidden_size]``), one case per step, in an order shuffled by
    ``rng`` each epoch. Returns the links of the epoch with the lowest validation KL, that epoch (0-based; -1 and
    ``start`` when no epoch beats ``start``'s validation KL) and every epoch's figures."""
    links = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([links], lr=lr)
    best, best_epoch, best_kl, log = start.clone(), -1, measure(model, validation, start)[0], []
    order = list(train)
    for epoch in range(epochs):
        rng.shuffle(order)
        losses = []
        for case in order:
            optimizer.zero_grad()
            loss = distillation_loss(case.reference, served_logits(model, case, links))
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        kl, agree = measure(model, validation, links.detach())
        log.append(Epoch(statistics.fmean(losses), kl, agree))
        if kl < best_kl:
            best, best_epoch, best_kl = links.detach().clone(), epoch, kl
    return best, best_epoch, log


PLUMBING_TOLERANCE = 1e-4
"""The largest |Δ| in a logit the plumbing check allows (float32 kernels' rounding is ~1e-5)."""


def plumbing_error(model: Any, cases: Sequence[PreparedCase]) -> float:
    """Largest |Δ| in any logit between :func:`served_logits` without links and the engine's KV mode."""
    with torch.inference_mode():
        return max(float((served_logits(model, c, None) - c.kv_logits).abs().max()) for c in cases)


def conversation_list(text: str) -> list[str]:
    """``--train`` / ``--validation`` / ``--test``: comma-separated LoCoMo sample ids, each once."""
    ids = [c.strip() for c in text.split(",") if c.strip()]
    if not ids or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct comma-separated sample ids")
    return ids


def positive_int(text: str) -> int:
    """``--links`` and ``--questions``: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Not locomo_probe.add_slice_arguments: this probe takes three lists of conversations, not one.
    parser.add_argument("--locomo", required=True, help="the LoCoMo file (never copied into the repo)")
    parser.add_argument(
        "--train",
        type=conversation_list,
        default="conv-41,conv-42,conv-43,conv-44,conv-47,conv-48",
        help="conversations the links are trained on (default %(default)s)",
    )
    parser.add_argument(
        "--validation",
        type=conversation_list,
        default="conv-49,conv-50",
        help="conversations that choose the epoch kept (default %(default)s)",
    )
    parser.add_argument(
        "--test", type=conversation_list, default="conv-26,conv-30", help="conversations measured (default %(default)s)"
    )
    parser.add_argument("--questions", type=positive_int, default=40, help="questions of categories 1-4 (default 40)")
    parser.add_argument("-k", type=positive_int, default=10, help="memories per question (default 10)")
    parser.add_argument("--links", type=positive_int, default=8, help="link tokens L (default 8)")
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate (default 3e-3)")
    parser.add_argument("--init", default="\n", help="the text whose mean token embedding starts every link")
    parser.add_argument("--system-prompt", default="default", choices=sorted(SYSTEM_PROMPTS))
    parser.add_argument("--cache-dir", default=None, help="where prepared conversations are kept between runs")
    parser.add_argument("--seed", type=int, default=0, help="the training order's seed (default 0)")
    args = parser.parse_args()
    lists = {name: getattr(args, name) for name in ("train", "validation", "test")}
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        if set(lists[a]) & set(lists[b]):
            parser.error(f"--{a} and --{b} share {sorted(set(lists[a]) & set(lists[b]))}")

    engine, model = float32_engine(args.system_prompt)
    engine.load()
    init_ids = engine.tokenizer(args.init, add_special_tokens=False)["input_ids"]
    if not init_ids:
        parser.error(f"--init {args.init!r} has no tokens")
    model.requires_grad_(False)
    embedder = SentenceTransformerEmbedder(None, "cpu")
    slices: dict[str, dict[str, list[PreparedCase]]] = {name: {} for name in ("test", "validation", "train")}
    worst = 0.0
    for name, cases_of in slices.items():  # the test slice first: a broken pass stops the run before training
        for conversation in lists[name]:
            cases_of[conversation] = load_or_prepare(engine, conversation, args, embedder)
            worst = max(worst, plumbing_error(model, cases_of[conversation]))
            if worst > PLUMBING_TOLERANCE:
                raise SystemExit(
                    f"plumbing check on {conversation}: no links gives KV mode's logits off by {worst:.2e} "
                    f"(> {PLUMBING_TOLERANCE:g})"
                )

    with torch.no_grad():
        start = model.model.embed_tokens(torch.tensor(init_ids)).mean(0).repeat(args.links, 1)
    train = [case for cases in slices["train"].values() for case in cases]
    validation = [case for cases in slices["validation"].values() for case in cases]
    links, kept, epochs = train_links(model, train, validation, start, args.epochs, args.lr, random.Random(args.seed))
    kl, agree = measure(model, validation, None)
    print(f"validation without links: KL {kl:.4f} agree {agree:.3f}")
    kl, agree = measure(model, validation, start)
    print(f"validation, untrained links: KL {kl:.4f} agree {agree:.3f}")
    for i, e in enumerate(epochs):
        print(
            f"epoch {i}: mean step loss {e.train_kl:.4f}, validation KL {e.validation_kl:.4f} "
            f"agree {e.validation_agree:.3f}"
        )
    print(
        f"{len(train)} training, {len(validation)} validation cases; L={args.links}, kept epoch {kept} "
        f"(-1: none beat the untrained links); {args.system_prompt} system prompt, k={args.k}, float32; "
        f"check: no links = KV mode within {worst:.1e}"
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
