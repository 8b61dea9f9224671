"""benchmarks/link_tokens.py on a tiny random Llama: its serving pass against the engine's KV mode, links against
the same tokens prefilled as text, its loss against the product's KL, and the epoch its training keeps."""

from __future__ import annotations

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


def test_training_keeps_the_epoch_with_the_lowest_validation_kl(served: tuple[Any, list[Any]]) -> None:
    model, cases = served
    start = model.model.embed_tokens(torch.tensor([10, 10])).detach()
    kept, epoch, log = lt.train_links(model, cases, cases, start, epochs=0, lr=1e-2)
    assert epoch == -1 and log == [] and torch.equal(kept, start)  # no epoch: the start

    torch.manual_seed(0)
    kept, epoch, log = lt.train_links(model, cases, cases, start, epochs=4, lr=5e-2)
    assert len(log) == 4 and 0 <= epoch < 4
    before, after = lt.measure(model, cases, start)[0], lt.measure(model, cases, kept)[0]
    assert after < before  # trained on the cases it is measured on: the kept links fit them better
    logged = [float(line.split("validation KL ")[1].split()[0]) for line in log]
    assert logged[epoch] == pytest.approx(after, abs=1e-4) and logged[epoch] == min(logged)
