"""benchmarks/link_tokens.py on a tiny random Llama: its serving pass and greedy decode against the engine's KV
mode, its teacher-forced pass against the engine's prompt mode, links against the same tokens prefilled as text,
its loss against the product's KL, and the epoch its training keeps."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmark_scripts import load_benchmark
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import FidelitySetting, run_fidelity, summarize_rows
from inferscale.eval.fidelity_cases import FidelityCase, FidelitySlice
from inferscale.eval.metrics import first_token_kl

lt = load_benchmark("link_tokens")

CASES = [
    FidelityCase(
        memories=["Maya plays chess.", "Raj taught her.", "She lives in Lyon."],
        question="Who taught Maya chess?",
        contexts=[["hi"], ["hi", "Maya plays chess."], []],
    ),
    FidelityCase(memories=["Tom has a dog."], question="What pet does Tom have?"),
]
BUDGET = 6
"""The answers' budget in tokens."""


@pytest.fixture(scope="module")
def engine() -> TransformersEngine:
    torch.manual_seed(0)
    model = tiny_model("llama")
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=byte_chat_tokenizer()
    ).load()
    model.requires_grad_(False)
    return engine


@pytest.fixture(scope="module")
def served(engine: TransformersEngine) -> tuple[Any, list[Any]]:
    """(the tiny model, :data:`CASES` prepared on an engine over it, answers of up to :data:`BUDGET` tokens)."""
    return engine.model, lt.prepare(engine, CASES, BUDGET)


def test_the_pass_without_links_is_the_engines_kv_mode(served: tuple[Any, list[Any]]) -> None:
    model, cases = served
    for case in cases:
        assert case.memory_tokens > 0
        torch.testing.assert_close(lt.served_logits(model, case, None), case.kv_logits, atol=1e-5, rtol=0)


def test_the_teacher_forced_answer_pass_is_a_plain_forward_over_the_whole_prompt(
    engine: TransformersEngine, served: tuple[Any, list[Any]]
) -> None:
    """Reference: one cacheless forward pass of plain transformers over the prefix, the memories' text, the query
    and prompt mode's answer; its logits at the answer's positions give every teacher-forced row."""
    model, cases = served
    for case, prepared in zip(CASES, cases, strict=True):
        fact_ids = [engine.fact_token_ids(t) for t in case.memories]
        answer = prepared.answer_ids
        assert answer == engine.generate_prompt(case.question, fact_ids, BUDGET).token_ids
        query_ids = engine.conversation_token_ids(case.question)
        n = len(answer) + 1
        got = lt.prompt_answer_log_probs(engine, fact_ids, query_ids, answer, n)
        ids = engine.system_prefix_ids() + [t for f in fact_ids for t in f] + query_ids + answer
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(ids) - n :]
        torch.testing.assert_close(got, torch.log_softmax(logits.float(), -1), atol=1e-5, rtol=0)
        torch.testing.assert_close(prepared.answer_reference, got[: lt.DISTILL_POSITIONS], atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match=r"positions 1\.\."):
            lt.prompt_answer_log_probs(engine, fact_ids, query_ids, answer, n + 1)
        with pytest.raises(ValueError, match=r"positions 1\.\."):
            lt.answer_logits(model, prepared, None, 0)


def test_the_answer_check_refuses_rows_that_are_not_prompt_modes_answer(served: tuple[Any, list[Any]]) -> None:
    _, cases = served
    case = cases[0]
    stop = {int(case.answer_reference[-1].argmax())} if len(case.answer_ids) < BUDGET else set()
    lt.check_answer_reference(case.answer_ids, case.answer_reference, BUDGET, stop)  # the prepared rows pass
    wrong = case.answer_reference.clone()
    wrong[1, case.answer_ids[1]] = -1e9  # row 1 no longer picks the answer's second token
    with pytest.raises(lt.PlumbingError, match="row 1 picks"):
        lt.check_answer_reference(case.answer_ids, wrong, BUDGET, stop)
    with pytest.raises(lt.PlumbingError, match="rows for an answer that needs"):
        lt.check_answer_reference(case.answer_ids, case.answer_reference[:-1], BUDGET, stop)
    # an answer that ended before the budget: the next row must pick an end-of-turn token
    short = case.answer_ids[:2]
    with pytest.raises(lt.PlumbingError, match="where prompt mode ended the answer"):
        lt.check_answer_reference(short, case.answer_reference[:3], BUDGET, {-1})
    lt.check_answer_reference(short, case.answer_reference[:3], BUDGET, {case.answer_ids[2]})


def test_the_greedy_decode_without_links_is_the_engines_kv_answer(
    engine: TransformersEngine, served: tuple[Any, list[Any]]
) -> None:
    model, cases = served
    stop_ids = set(engine.stop_token_ids)
    for case in cases:
        assert len(case.kv_answer_ids) == BUDGET  # the random model fills the budget: the stop path is below
        assert lt.greedy_answer(model, case, None, BUDGET, stop_ids) == case.kv_answer_ids
        assert lt.greedy_answer(model, case, None, 3, stop_ids) == case.kv_answer_ids[:3]
        # a stop token ends the answer before it, at its first occurrence
        stop = case.kv_answer_ids[2]
        want = case.kv_answer_ids[: case.kv_answer_ids.index(stop)]
        assert lt.greedy_answer(model, case, None, BUDGET, {stop}) == want
    # links equal to token embeddings decode as those tokens prefilled before the query
    links = model.model.embed_tokens(torch.tensor([10, 20, 30]))
    as_text = lt.PreparedCase(**{**vars(cases[0]), "query_ids": [10, 20, 30, *cases[0].query_ids]})
    with_links = lt.greedy_answer(model, cases[0], links, BUDGET, stop_ids)
    assert with_links == lt.greedy_answer(model, as_text, None, BUDGET, stop_ids)


def test_the_answer_figures_are_inferscale_eval_fidelitys(
    engine: TransformersEngine, served: tuple[Any, list[Any]]
) -> None:
    """Reference: ``inferscale eval fidelity``'s runner and summary over the same cases, default setting."""
    model, cases = served
    rows = run_fidelity({"default": engine}, [FidelitySlice("tiny", CASES)], [FidelitySetting()], BUDGET)
    (summary,) = summarize_rows(rows)
    got = lt.measure_answers(model, engine.tokenizer, cases, None, BUDGET, set(engine.stop_token_ids))
    assert got.as_engine == len(cases)
    assert got.f1_vs_prompt == pytest.approx(summary.f1_kv_vs_prompt, abs=1e-12)
    assert (got.kv_budget_hit, got.prompt_budget_hit) == (summary.kv_budget_hit, summary.prompt_budget_hit)
    assert (got.kv_repeat, got.prompt_repeat) == (summary.kv_repeat, summary.prompt_repeat)
    assert [r["kv_answer"] for r in rows] == [lt.answer_text(engine.tokenizer, c.kv_answer_ids) for c in cases]
    assert [r["prompt_answer"] for r in rows] == [lt.answer_text(engine.tokenizer, c.answer_ids) for c in cases]


def test_links_equal_to_token_embeddings_are_those_tokens_prefilled_before_the_query(
    served: tuple[Any, list[Any]],
) -> None:
    model, cases = served
    case = cases[0]
    ids = [10, 20, 30]
    links = model.model.embed_tokens(torch.tensor(ids))
    as_text = lt.PreparedCase(**{**vars(case), "query_ids": ids + case.query_ids})
    with torch.no_grad():
        torch.testing.assert_close(
            lt.served_logits(model, case, links), lt.served_logits(model, as_text, None), atol=1e-5, rtol=0
        )


def test_the_loss_is_the_first_token_kl() -> None:
    torch.manual_seed(1)
    reference, logits = torch.randn(257), torch.randn(257)
    loss = lt.distillation_loss(torch.log_softmax(reference, -1), logits)
    assert float(loss) == pytest.approx(first_token_kl(reference, logits), rel=1e-5)
    assert float(lt.distillation_loss(torch.log_softmax(reference, -1), reference)) == pytest.approx(0, abs=1e-6)


def test_the_loss_over_answer_positions_is_their_mean_first_token_kl() -> None:
    torch.manual_seed(2)
    reference, logits = torch.randn(3, 257), torch.randn(3, 257)
    loss = lt.distillation_loss(torch.log_softmax(reference, -1), logits)
    want = sum(first_token_kl(r, g) for r, g in zip(reference, logits, strict=True)) / 3
    assert float(loss) == pytest.approx(want, rel=1e-5)


def test_teacher_forced_training_steps_on_the_first_a_positions(
    served: tuple[Any, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, cases = served
    start = model.model.embed_tokens(torch.tensor([10, 10])).detach()
    short = lt.PreparedCase(**{**vars(cases[1]), "answer_ids": cases[1].answer_ids[:1]})
    short.answer_reference = cases[1].answer_reference[:2]  # a one-token answer: 2 positions to distil on
    steps: list[int] = []
    answer_logits = lt.answer_logits

    def spy(model: Any, case: Any, links: Any, n: int = 1) -> torch.Tensor:
        if links is not None and links.requires_grad:
            steps.append(n)
        return answer_logits(model, case, links, n)

    monkeypatch.setattr(lt, "answer_logits", spy)
    lt.train_links(model, [cases[0], short], cases, start, 2, 5e-2, random.Random(0), distill_tokens=3)
    assert sorted(steps) == [2, 2, 3, 3]  # two epochs; the short answer's steps take its 2 positions

    def answer_loss(links: torch.Tensor) -> float:
        with torch.no_grad():
            return float(lt.distillation_loss(cases[0].answer_reference[:3], answer_logits(model, cases[0], links, 3)))

    monkeypatch.undo()
    kept, _, epochs = lt.train_links(model, cases, cases, start, 4, 5e-2, random.Random(0), distill_tokens=3)
    assert epochs[0].train_loss > epochs[-1].train_loss  # the three-position loss fell while training
    assert answer_loss(kept) < answer_loss(start)


def test_training_lowers_the_kl_of_the_cases_it_trains_on(served: tuple[Any, list[Any]]) -> None:
    model, cases = served
    start = model.model.embed_tokens(torch.tensor([10, 10])).detach()
    kept, epoch, epochs = lt.train_links(model, cases, cases, start, 4, 5e-2, random.Random(0))
    assert len(epochs) == 4 and 0 <= epoch < 4
    before, after = lt.measure(model, cases, start)[0], lt.measure(model, cases, kept)[0]
    assert after < before
    assert epochs[epoch].validation_kl == pytest.approx(after, rel=1e-6)


@pytest.mark.parametrize(
    ("scripted", "kept_epoch"),
    [
        ([0.4, 0.5, 0.3, 0.1, 0.2], 2),  # the best epoch, not the last
        ([0.1, 0.2, 0.3], -1),  # no epoch beats the untrained links: they are kept
    ],
)
def test_training_keeps_the_epoch_with_the_lowest_validation_kl(
    served: tuple[Any, list[Any]], monkeypatch: pytest.MonkeyPatch, scripted: list[float], kept_epoch: int
) -> None:
    model, cases = served
    start = model.model.embed_tokens(torch.tensor([10, 10])).detach()
    seen: list[torch.Tensor] = []  # the links each validation measured: the start, then each epoch's

    def scripted_measure(_model: Any, _cases: Any, links: torch.Tensor) -> tuple[float, float]:
        seen.append(links.clone())
        return scripted[len(seen) - 1], 0.5

    monkeypatch.setattr(lt, "measure", scripted_measure)
    kept, epoch, epochs = lt.train_links(model, cases, cases, start, len(scripted) - 1, 5e-2, random.Random(0))
    assert epoch == kept_epoch
    assert [e.validation_kl for e in epochs] == scripted[1:]
    torch.testing.assert_close(kept, seen[kept_epoch + 1], atol=0, rtol=0)
    assert not torch.equal(seen[1], seen[0])  # the links did move


def test_prepared_cases_survive_a_weights_only_round_trip(served: tuple[Any, list[Any]], tmp_path: Path) -> None:
    _, cases = served
    torch.save([c.to_dict() for c in cases], tmp_path / "cases.pt")
    back = [lt.PreparedCase.from_dict(d) for d in torch.load(tmp_path / "cases.pt", weights_only=True)]
    for got, want in zip(back, cases, strict=True):
        assert got.query_ids == want.query_ids and got.memory_tokens == want.memory_tokens
        assert got.answer_ids == want.answer_ids and got.kv_answer_ids == want.kv_answer_ids
        for field in ("keys", "values", "reference", "kv_logits", "answer_reference"):
            assert torch.equal(getattr(got, field), getattr(want, field))


def test_arguments_refuse_repeats_and_non_positive_counts() -> None:
    assert lt.conversation_list("conv-41, conv-42") == ["conv-41", "conv-42"]
    for bad in ("", ",", "conv-41,conv-41"):
        with pytest.raises(argparse.ArgumentTypeError, match="distinct comma-separated"):
            lt.conversation_list(bad)
    assert lt.positive_int("8") == 8
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not an integer >= 1"):
            lt.positive_int(bad)


def test_prepare_stops_when_its_prompt_mode_pass_is_off_the_engines(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = lt.prompt_answer_log_probs

    def off_by_1e3(*args: Any) -> torch.Tensor:
        return honest(*args) + 1e-3  # every log-probability 1e-3 off: ten times the tolerance

    monkeypatch.setattr(lt, "prompt_answer_log_probs", off_by_1e3)
    with pytest.raises(
        lt.PlumbingError,
        match=r"'What pet does Tom have\?'.*off the engine's first-token log-probabilities by 1\.00e-03",
    ):
        lt.prepare(engine, CASES[1:], BUDGET)
