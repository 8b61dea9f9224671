"""Model loads on several threads at once (two clients' first chats, an engine beside an embedder): transformers'
``from_pretrained`` patches process-wide state while it loads (``PreTrainedModel.tie_weights``, ``torch.nn.init``) and
puts back what it found, so two loads at once put back each other's patches. Both failed ("Cannot copy out of meta
tensor": ``lm_head`` never tied), and so did every later load in the process (a helper's threaded web app, 3 of 7
runs). Every load now holds the process's model-load lock."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale.config import EngineConfig
from inferscale.engines.hf.loading import load_causal_lm

THREADS = 3
ROUNDS = 4


def test_models_loaded_on_several_threads_at_once_are_whole_and_so_is_every_later_one(tmp_path: Path) -> None:
    folder = tmp_path / "tied"
    tiny_model("llama", tie_word_embeddings=True).save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    config = EngineConfig(model=str(folder), dtype="float32", device="cpu")
    reference = load_causal_lm(config, tmp_path)[1]
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        want = reference(ids).logits
    outcomes: list[str] = []
    lock = threading.Lock()

    def load(start: threading.Barrier) -> None:
        start.wait()
        try:
            model = load_causal_lm(config, tmp_path)[1]
            tied = model.lm_head.weight is model.model.embed_tokens.weight
            with torch.inference_mode():
                same = torch.equal(model(ids).logits, want)
            outcome = "whole" if tied and same else f"tied={tied} same logits={same}"
        except Exception as exc:  # recorded: the assertion below names it
            outcome = f"{type(exc).__name__}: {exc}"
        with lock:
            outcomes.append(outcome)

    for _ in range(ROUNDS):
        start = threading.Barrier(THREADS)
        threads = [threading.Thread(target=load, args=(start,)) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert outcomes == ["whole"] * (THREADS * ROUNDS)
    later = load_causal_lm(config, tmp_path)[1]
    assert later.lm_head.weight is later.model.embed_tokens.weight
