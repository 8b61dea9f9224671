"""Learned link tokens between the injected memories and the query: does a trained bridge close the gap?

Issue #10's remaining gap is the attention between the retrieved facts, which no encoding done before retrieval can
know (docs/architecture.md, runs 5-10). KVLink (Yang et al., 2025, arXiv:2502.16002) adds trainable tokens after
each segment that are prefilled at serve time, attending to every segment before them, and fine-tunes the model
with them. This probe keeps the model frozen, as the product must (it serves any model as downloaded), and trains
only L input embeddings: prefilled after the memory segment and before the query, each attends to every injected
memory, as a recomputed tail does. They are trained by distillation, no gold answers: the loss is the first-token
KL(prompt || kv) with the links in KV mode, over cases of some LoCoMo conversations, or with ``--distill-tokens A``
the mean KL over the first A positions of prompt mode's greedy answer, teacher-forced (the student sees prompt mode's
answer so far, as in sequence-level distillation); the epoch kept is the one with the lowest first-token KL on
held-out validation conversations (or none, the untrained links, when no epoch beats them); the figures are on
other, test conversations.

Every case is the one ``inferscale eval fidelity`` builds (the default setting: w=5 context-window encoding, pure
injection; the same memories in the same order), SmolLM2-135M-Instruct in float32:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/link_tokens.py --locomo ../shared/data/locomo/locomo10.json

Prints, per test conversation, mean first-token KL (nats) and agreement, and the greedy answers' F1 against prompt
mode's (``--max-new-tokens`` budget), budget-hit and repeat rates, for the default (no links), for L untrained links
(each the embedding of ``--init``: what prefilling L more tokens does by itself) and for the trained links, with the
links' cost in added prefill tokens. It checks its plumbing on every conversation as soon as it is prepared (or
loaded from ``--cache-dir``), the test ones first, and stops if a check fails: with no links, its forward pass gives
the engine's KV-mode logits (within 1e-4 in any logit); its teacher-forced prompt-mode pass gives the engine's
prompt-mode first-token log-probabilities (the same bound) and picks prompt mode's greedy answer at every row; and
on the test conversations its greedy answers without links are the engine's KV-mode answers, token for token. On 2
CPU cores (Intel Xeon with AMX), preparing a conversation's 40 cases (their facts encoded at w=5, prompt mode's
logits and answers, KV mode's answers) takes 6.5-9 min, 65-80 min for the defaults' ten (two runs); an epoch over
240 cases takes ~70 s with A=1 (longer with A=16, not timed). Every prepared conversation stays in memory (~1.1 GB
each, ~11 GB for the defaults); ``--cache-dir`` keeps them on disk between runs, under the model's fingerprint.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from locomo_probe import dynamic_cache, float32_engine

from inferscale.engines.hf.answer_text import AnswerText
from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import SYSTEM_PROMPTS, FactCache, FidelitySetting, repeats
from inferscale.eval.fidelity_cases import FidelityCase, locomo_cases
from inferscale.eval.metrics import first_token_kl, token_f1
from inferscale.kv.compose import assemble
from inferscale.retrieval.embedder import Embedder, SentenceTransformerEmbedder

PLUMBING_TOLERANCE = 1e-4
"""The largest |Δ| in a logit (or log-probability) the plumbing checks allow (float32 kernels' rounding is ~1e-5)."""


class PlumbingError(RuntimeError):
    """The probe's own passes disagree with the engine's: its figures would not be the product's."""


@dataclass
class PreparedCase:
    """One question ready to serve with any links: the assembled cache and prompt mode's answer to match.

    ``keys`` / ``values``: ``[layers, n_kv_heads, n_tokens, head_dim]`` float32, the system prefix and the injected
    memories with their keys rotated to their serving positions; ``query_ids``: the tokens after the memory segment;
    ``reference``: ``[vocab]`` float32, prompt mode's first-token log-probabilities; ``kv_logits``: ``[vocab]``
    float32, the engine's own KV-mode logits (for the plumbing check); ``memory_tokens``: S, the segment's memory
    tokens (the links' cost is counted against it); ``answer_ids``: prompt mode's greedy answer (at most the
    budget, without its end-of-turn token); ``answer_reference``: ``[n, vocab]`` float32, prompt mode's
    log-probabilities at the answer's first n positions, teacher-forced: row i follows ``answer_ids[:i]``, so row
    ``len(answer_ids)`` is where prompt mode ended the answer (or, for an answer that filled the budget, what it
    would have said next); n = ``len(answer_ids) + 1``, at most :data:`DISTILL_POSITIONS`; row 0 holds
    ``reference`` itself (checked against it, then replaced, so that A=1 trains on exactly the engine's figures);
    ``kv_answer_ids``: the engine's greedy KV-mode answer (for the decode check). Tensors made under inference
    mode: :func:`answer_logits` clones what it extends.
    """

    keys: torch.Tensor
    values: torch.Tensor
    query_ids: list[int]
    reference: torch.Tensor
    kv_logits: torch.Tensor
    memory_tokens: int
    answer_ids: list[int]
    answer_reference: torch.Tensor
    kv_answer_ids: list[int]

    @property
    def n_tokens(self) -> int:
        """P + S tokens: the position the first link (or, without links, the query) is prefilled at."""
        return int(self.keys.shape[2])

    def to_dict(self) -> dict[str, Any]:
        """Tensors and ints only (what ``torch.load(..., weights_only=True)`` reads back)."""
        return {**vars(self), **{name: torch.tensor(getattr(self, name)) for name in _ID_LISTS}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedCase:
        return cls(**{**data, **{name: data[name].tolist() for name in _ID_LISTS}})


_ID_LISTS = ("query_ids", "answer_ids", "kv_answer_ids")
"""The token-id fields, stored as int64 tensors."""

DISTILL_POSITIONS = 16
"""How many of prompt mode's answer positions :func:`prepare` keeps log-probabilities for (``--distill-tokens``'
bound): 16 x 49,152 float32 are ~3 MB per case for SmolLM2."""


def _check_positions(n: int, answer_ids: Sequence[int]) -> None:
    if not 1 <= n <= len(answer_ids) + 1:
        raise ValueError(f"n={n}: an answer of {len(answer_ids)} tokens has positions 1..{len(answer_ids) + 1}")


def prompt_answer_log_probs(
    engine: TransformersEngine, fact_ids: Sequence[Sequence[int]], query_ids: list[int], answer_ids: list[int], n: int
) -> torch.Tensor:
    """``[n, vocab]`` float32: prompt mode's log-probabilities for the answer's first ``n`` positions, teacher-forced
    (position i after ``answer_ids[:i]``): the memory tokens, the query and ``answer_ids[:n-1]`` prefilled after the
    system prefix's cache in one pass, as the engine's prompt mode prefills them.

    Raises:
        ValueError: unless 1 <= ``n`` <= ``len(answer_ids) + 1``.
    """
    _check_positions(n, answer_ids)
    prefix = assemble(engine.prefix_kv, [], engine.rope_table)
    cache = dynamic_cache(prefix.keys, prefix.values, engine.model.config)
    ids = [t for f in fact_ids for t in f] + query_ids + answer_ids[: n - 1]
    positions = torch.arange(prefix.n_tokens, prefix.n_tokens + len(ids))[None]
    out = engine.model(
        input_ids=torch.tensor([ids]), position_ids=positions, cache=cache, use_cache=True, logits_to_keep=n
    )
    return torch.log_softmax(out.logits[0].float(), -1)


def prepare(engine: TransformersEngine, cases: Sequence[FidelityCase], max_new_tokens: int) -> list[PreparedCase]:
    """``cases`` ready to serve with any links: each case's facts encoded with the default setting (w=5), prompt
    mode's first-token log-probabilities, greedy answer (``max_new_tokens`` at most) and teacher-forced answer
    log-probabilities, and the engine's KV-mode logits and greedy answer.

    Raises:
        PlumbingError: when the teacher-forced pass's first position is off the engine's prompt-mode logits by more
            than :data:`PLUMBING_TOLERANCE` (in a log-probability), or disagrees with prompt mode's greedy answer
            (:func:`check_answer_reference`).
    """
    setting = FidelitySetting(first_memory_context_free=False)  # every slot in context, as the tokens were trained
    stored, stop_ids = FactCache(engine), set(engine.stop_token_ids)
    out = []
    with torch.inference_mode():
        for case in cases:
            fact_ids = [engine.fact_token_ids(t) for t in case.memories]
            query_ids = engine.conversation_token_ids(case.question)
            reference = torch.log_softmax(engine.first_token_logits(case.question, None, fact_ids), -1)
            answer_ids = engine.generate_prompt(case.question, fact_ids, max_new_tokens).token_ids
            n = min(len(answer_ids) + 1, DISTILL_POSITIONS)
            answer_reference = prompt_answer_log_probs(engine, fact_ids, query_ids, answer_ids, n)
            error = float((answer_reference[0] - reference).abs().max())
            if error > PLUMBING_TOLERANCE:
                raise PlumbingError(
                    f"{case.question!r}: the teacher-forced prompt-mode pass is off the engine's first-token "
                    f"log-probabilities by {error:.2e} (> {PLUMBING_TOLERANCE:g})"
                )
            answer_reference[0] = reference  # the engine's own figures where both exist
            check_answer_reference(answer_ids, answer_reference, max_new_tokens, stop_ids)
            facts = stored.get(case, setting)
            segment = assemble(engine.prefix_kv, facts, engine.rope_table)
            out.append(
                PreparedCase(
                    keys=segment.keys.clone(),  # [layers, n_kv, P + S, head_dim]: a copy, not the workspace
                    values=segment.values.clone(),
                    query_ids=query_ids,
                    reference=reference,
                    kv_logits=engine.first_token_logits(case.question, facts),
                    memory_tokens=segment.memory_tokens,
                    answer_ids=answer_ids,
                    answer_reference=answer_reference,
                    kv_answer_ids=engine.generate_kv(case.question, facts, max_new_tokens).token_ids,
                )
            )
    return out


def check_answer_reference(
    answer_ids: Sequence[int], answer_reference: torch.Tensor, max_new_tokens: int, stop_ids: Set[int]
) -> None:
    """That the teacher-forced rows are prompt mode's greedy answer: row i's top token is ``answer_ids[i]``, and
    where the answer ended before the budget and row ``len(answer_ids)`` is kept, its top token ends the turn; the
    rows kept are ``min(len(answer_ids) + 1, DISTILL_POSITIONS)``.

    Raises:
        PlumbingError: on the first row that disagrees, or a row count that is not that.
    """
    rows = min(len(answer_ids) + 1, DISTILL_POSITIONS)
    if answer_reference.shape[0] != rows:
        raise PlumbingError(f"{answer_reference.shape[0]} teacher-forced rows for an answer that needs {rows}")
    top = answer_reference.argmax(-1).tolist()
    for i, token in enumerate(top):
        if i < len(answer_ids) and token != answer_ids[i]:
            raise PlumbingError(f"teacher-forced row {i} picks token {token}, prompt mode's answer has {answer_ids[i]}")
        if i == len(answer_ids) < max_new_tokens and token not in stop_ids:
            raise PlumbingError(f"teacher-forced row {i} picks token {token}, where prompt mode ended the answer")


def load_or_prepare(
    engine: TransformersEngine, conversation: str, args: argparse.Namespace, embedder: Embedder
) -> list[PreparedCase]:
    """The conversation's first ``args.questions`` cases, retrieved top-``args.k``, through :func:`prepare`; kept
    in ``args.cache_dir`` (when given) under the model's fingerprint and the slice's name."""
    path = None
    if args.cache_dir is not None:
        name = (
            f"{engine.fingerprint[:12]}-{conversation}-{args.system_prompt}-q{args.questions}-k{args.k}"
            f"-a{args.max_new_tokens}.pt"
        )
        path = Path(args.cache_dir) / name
        if path.exists():
            cases = [PreparedCase.from_dict(d) for d in torch.load(path, weights_only=True)]
            stop_ids = set(engine.stop_token_ids)
            for case in cases:
                check_answer_reference(case.answer_ids, case.answer_reference, args.max_new_tokens, stop_ids)
            return cases
    slice_ = locomo_cases(  # each memory's context within its own session, as runs 11 and 13 measured
        args.locomo, conversation, args.questions, args.k, embedder, across_sessions=False
    )
    cases = prepare(engine, slice_.cases, args.max_new_tokens)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save([c.to_dict() for c in cases], path)
    return cases


def answer_logits(model: Any, case: PreparedCase, links: torch.Tensor | None, n: int = 1) -> torch.Tensor:
    """``[n, vocab]`` float32: the logits of the answer's first ``n`` positions, teacher-forced on prompt mode's
    answer, with ``links`` (``[L, hidden_size]`` float32, or none), the query and ``case.answer_ids[:n-1]``
    prefilled after the memory segment in one forward pass (differentiable in ``links``): the links at positions
    ``P+S .. P+S+L-1``, the query from ``P+S+L``, each attending causally to the whole cache.

    Raises:
        ValueError: unless 1 <= ``n`` <= ``len(case.answer_ids) + 1``.
    """
    _check_positions(n, case.answer_ids)
    return _prefill(model, case, links, case.query_ids + case.answer_ids[: n - 1], n)[0]


def _prefill(
    model: Any, case: PreparedCase, links: torch.Tensor | None, ids: list[int], n: int
) -> tuple[torch.Tensor, Any, int]:
    """``links`` then ``ids`` prefilled after the memory segment in one pass: (``[n, vocab]`` float32 logits of the
    last ``n`` positions, the cache it extended, the next position)."""
    cache = dynamic_cache(case.keys, case.values, model.config)
    embeds = model.model.embed_tokens(torch.tensor([ids]))
    if links is not None:
        embeds = torch.cat([links[None], embeds], dim=1)
    end = case.n_tokens + embeds.shape[1]
    positions = torch.arange(case.n_tokens, end)[None]
    out = model(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=n)
    return out.logits[0].float(), cache, end


def served_logits(model: Any, case: PreparedCase, links: torch.Tensor | None) -> torch.Tensor:
    """``[vocab]`` float32: the first answer token's logits (:func:`answer_logits` with n=1)."""
    return answer_logits(model, case, links)[-1]


def distillation_loss(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(reference || softmax(logits)) in nats, differentiable in ``logits``; both
    ``[n, vocab]`` (or ``[vocab]``, one position), ``reference`` as log-probabilities. For one position it is what
    :func:`~inferscale.eval.metrics.first_token_kl` measures.

    Raises:
        ValueError: when the two shapes differ.
    """
    if reference.shape != logits.shape:
        raise ValueError(f"reference {tuple(reference.shape)} against logits {tuple(logits.shape)}")
    positions = reference.shape[0] if reference.dim() == 2 else 1
    return F.kl_div(torch.log_softmax(logits, -1), reference, reduction="sum", log_target=True) / positions


def greedy_answer(
    model: Any, case: PreparedCase, links: torch.Tensor | None, max_new_tokens: int, stop_ids: Set[int]
) -> list[int]:
    """The greedy answer's token ids with ``links`` (``[L, hidden_size]`` float32, or none): the links and the query
    prefilled after the memory segment, then one token per pass until an end-of-turn token in ``stop_ids`` or
    ``max_new_tokens`` tokens, as the engine's greedy decode does (the end-of-turn token is not part of the answer;
    no pass is run for a token the budget would not keep)."""
    with torch.inference_mode():
        logits, cache, position = _prefill(model, case, links, case.query_ids, 1)
        answer: list[int] = []
        token = int(logits[-1].argmax())
        while token not in stop_ids and len(answer) < max_new_tokens:
            answer.append(token)
            if len(answer) == max_new_tokens:
                break
            out = model(
                input_ids=torch.tensor([[token]]),
                position_ids=torch.tensor([[position]]),
                cache=cache,
                use_cache=True,
            )
            position += 1
            token = int(out.logits[0, -1].argmax())
    return answer


@dataclass(frozen=True)
class Answers:
    """The greedy answers of some cases served in KV mode with some links (``kv``) against prompt mode's, as
    ``inferscale eval fidelity`` reports them: ``f1_vs_prompt``, the mean token F1 (0..1) of each answer against
    prompt mode's; the fractions (0..1) of answers that fill the budget and that repeat themselves, kv and prompt;
    ``as_engine``: how many kv answers equal the engine's KV-mode answer token for token."""

    f1_vs_prompt: float
    kv_budget_hit: float
    prompt_budget_hit: float
    kv_repeat: float
    prompt_repeat: float
    as_engine: int


def answer_text(tokenizer: Any, token_ids: Sequence[int]) -> str:
    """An answer's text, detokenized as the engine streams it (:class:`~inferscale.engines.hf.answer_text.AnswerText`,
    no stop strings)."""
    answer = AnswerText(tokenizer)
    for token in token_ids:
        answer.push(token)
    answer.finish()
    return answer.text


def measure_answers(
    model: Any,
    tokenizer: Any,
    cases: Sequence[PreparedCase],
    links: torch.Tensor | None,
    max_new_tokens: int,
    stop_ids: Set[int],
) -> Answers:
    """:class:`Answers` of ``cases`` with ``links`` (``[L, hidden_size]`` float32, or none): greedy answers of at
    most ``max_new_tokens`` tokens, their text detokenized as the engine's answers are (:func:`answer_text`)."""
    answers = [greedy_answer(model, case, links, max_new_tokens, stop_ids) for case in cases]
    pairs = list(zip(answers, cases, strict=True))
    return Answers(
        f1_vs_prompt=statistics.fmean(
            token_f1(answer_text(tokenizer, a), answer_text(tokenizer, c.answer_ids)) for a, c in pairs
        ),
        kv_budget_hit=statistics.fmean(len(a) >= max_new_tokens for a in answers),
        prompt_budget_hit=statistics.fmean(len(c.answer_ids) >= max_new_tokens for c in cases),
        kv_repeat=statistics.fmean(repeats(a) for a in answers),
        prompt_repeat=statistics.fmean(repeats(c.answer_ids) for c in cases),
        as_engine=sum(a == c.kv_answer_ids for a, c in pairs),
    )


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
    """One epoch of :func:`train_links`: the mean of its steps' :func:`distillation_loss` (nats, over the positions
    trained on, taken while the links moved), and the validation first-token KL (nats) and agreement of the links
    it ended with."""

    train_loss: float
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
    distill_tokens: int = 1,
) -> tuple[torch.Tensor, int, list[Epoch]]:
    """Adam on the links alone (``start``: ``[L, hidden_size]``), one case per step, in an order shuffled by
    ``rng`` each epoch; each step's loss is the :func:`distillation_loss` over the first ``distill_tokens``
    positions of prompt mode's answer (fewer where the answer is shorter). Returns the links of the epoch with the
    lowest validation first-token KL (the figure issue #10 sets a bound on, whatever ``distill_tokens`` trains on),
    that epoch (0-based; -1 and ``start`` when no epoch beats ``start``'s validation KL) and every epoch's figures."""
    links = start.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([links], lr=lr)
    best, best_epoch, best_kl, log = start.clone(), -1, measure(model, validation, start)[0], []
    order = list(train)
    for epoch in range(epochs):
        rng.shuffle(order)
        losses = []
        for case in order:
            optimizer.zero_grad()
            n = min(distill_tokens, case.answer_reference.shape[0])
            loss = distillation_loss(case.answer_reference[:n], answer_logits(model, case, links, n))
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
        kl, agree = measure(model, validation, links.detach())
        log.append(Epoch(statistics.fmean(losses), kl, agree))
        if kl < best_kl:
            best, best_epoch, best_kl = links.detach().clone(), epoch, kl
    return best, best_epoch, log


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
    """``--links``, ``--questions``, ``-k``, ``--max-new-tokens``: an integer >= 1."""
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
    parser.add_argument(
        "--distill-tokens",
        type=positive_int,
        default=1,
        help=f"answer positions the loss covers, at most {DISTILL_POSITIONS} (default 1: the first token)",
    )
    parser.add_argument(
        "--max-new-tokens", type=positive_int, default=32, help="the answers' budget in tokens (default 32)"
    )
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
    if args.distill_tokens > DISTILL_POSITIONS:
        parser.error(f"--distill-tokens {args.distill_tokens}: at most {DISTILL_POSITIONS}")

    engine, model = float32_engine(args.system_prompt)
    engine.load()
    init_ids = engine.tokenizer(args.init, add_special_tokens=False)["input_ids"]
    if not init_ids:
        parser.error(f"--init {args.init!r} has no tokens")
    model.requires_grad_(False)
    embedder = SentenceTransformerEmbedder(None, "cpu")
    slices: dict[str, dict[str, list[PreparedCase]]] = {name: {} for name in ("test", "validation", "train")}
    worst = 0.0
    stop_ids = set(engine.stop_token_ids)
    without_links: dict[str, Answers] = {}  # the test conversations' answers with no links, checked on the way
    for name, cases_of in slices.items():  # the test slice first: a broken pass stops the run before training
        for conversation in lists[name]:
            try:
                cases_of[conversation] = load_or_prepare(engine, conversation, args, embedder)
            except PlumbingError as error:
                raise SystemExit(f"plumbing check on {conversation}: {error}") from error
            worst = max(worst, plumbing_error(model, cases_of[conversation]))
            if worst > PLUMBING_TOLERANCE:
                raise SystemExit(
                    f"plumbing check on {conversation}: no links gives KV mode's logits off by {worst:.2e} "
                    f"(> {PLUMBING_TOLERANCE:g})"
                )
            if name == "test":
                cases = cases_of[conversation]
                answers = measure_answers(model, engine.tokenizer, cases, None, args.max_new_tokens, stop_ids)
                if answers.as_engine != len(cases):
                    raise SystemExit(
                        f"decode check on {conversation}: without links only {answers.as_engine} of {len(cases)} "
                        "greedy answers equal the engine's KV-mode answers"
                    )
                without_links[conversation] = answers

    with torch.no_grad():
        start = model.model.embed_tokens(torch.tensor(init_ids)).mean(0).repeat(args.links, 1)
    train = [case for cases in slices["train"].values() for case in cases]
    validation = [case for cases in slices["validation"].values() for case in cases]
    links, kept, epochs = train_links(
        model, train, validation, start, args.epochs, args.lr, random.Random(args.seed), args.distill_tokens
    )
    kl, agree = measure(model, validation, None)
    print(f"validation without links: KL {kl:.4f} agree {agree:.3f}")
    kl, agree = measure(model, validation, start)
    print(f"validation, untrained links: KL {kl:.4f} agree {agree:.3f}")
    for i, e in enumerate(epochs):
        print(
            f"epoch {i}: mean step loss {e.train_loss:.4f}, validation KL {e.validation_kl:.4f} "
            f"agree {e.validation_agree:.3f}"
        )
    print(
        f"{len(train)} training, {len(validation)} validation cases; L={args.links}, A={args.distill_tokens}, "
        f"kept epoch {kept} "
        f"(-1: none beat the untrained links); {args.system_prompt} system prompt, k={args.k}, float32; "
        f"checks: no links = KV mode within {worst:.1e}, and gives the engine's KV-mode answers on the test "
        "conversations; the teacher-forced rows pick prompt mode's answers"
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
            if value is None:
                answers = without_links[conversation]
            else:
                answers = measure_answers(model, engine.tokenizer, cases, value, args.max_new_tokens, stop_ids)
            cost = "0" if value is None else f"{args.links} tokens ({added:.1%} of the memory tokens)"
            print(
                f"{conversation} {name:<24} KL {kl:.4f}  agree {agree:.3f}  F1 kv~prompt {answers.f1_vs_prompt:.3f}  "
                f"budget hit kv/prompt {answers.kv_budget_hit:.2f}/{answers.prompt_budget_hit:.2f}  "
                f"repeat kv/prompt {answers.kv_repeat:.2f}/{answers.prompt_repeat:.2f}  added: {cost}"
            )


if __name__ == "__main__":
    main()
