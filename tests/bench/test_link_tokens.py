"""benchmarks/link_tokens.py on a tiny random Llama: its serving pass against the engine's KV mode, links against
the same tokens prefilled as text, its loss against the product's KL, and the epoch its training keeps."""

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
from inferscale.eval.fidelity_cases import FidelityCase
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


@pytest.fixture(scope="module")
def served() -> tuple[Any, list[Any]]:
    """(the tiny model, :data:`CASES` prepared on an engine over it)."""
    torch.manual_seed(0)
    model = tiny_model("llama")
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), "Memories:\n", model=model, tokenizer=byte_chat_tokenizer()
    ).load()
    model.requires_grad_(False)
    return model, lt.prepare(engine, CASES)


def test_the_pass_without_links_is_the_engines_kv_mode(served: tuple[Any, list[Any]]) -> None:
    model, cases = served
    for case in cases:
        assert case.memory_tokens > 0
        torch.testing.assert_close(lt.served_logits(model, case, None), case.kv_logits, atol=1e-5, rtol=0)


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
        for field in ("keys", "values", "reference", "kv_logits"):
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
