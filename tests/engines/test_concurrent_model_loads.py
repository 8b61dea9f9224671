"""Model loads on several threads at once (two clients' first chats, an engine beside an embedder): transformers'
``from_pretrained`` patches process-wide state while it loads (``PreTrainedModel.tie_weights``, ``torch.nn.init``) and
puts back what it found, so two loads at once put back each other's patches. Both failed ("Cannot copy out of meta
tensor": ``lm_head`` never tied), and so did every later load in the process (a helper's threaded web app, 3 of 7
runs). Every load now holds the process's model-load lock."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from tiny_models import byte_chat_tokenizer, tiny_model

from inferscale.config import EngineConfig
from inferscale.engines.hf.loading import load_causal_lm
from inferscale.model_load import MODEL_LOADS, loading_model

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


def _held_elsewhere() -> tuple[threading.Thread, threading.Event]:
    """A thread holding MODEL_LOADS (a model loading) until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def loading() -> None:
        with MODEL_LOADS:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=loading)
    thread.start()
    assert held.wait(10)
    return thread, release


def test_a_tokenizer_or_config_read_does_not_wait_for_another_models_load(tmp_path: Path) -> None:
    """Only building a model patches transformers' process-wide state: a prompt's layout (the layout-only tokenizer,
    add's span check) waited 3 s behind another model's whole load (a review)."""
    folder = tmp_path / "tied"
    byte_chat_tokenizer().save_pretrained(folder)
    loading, release = _held_elsewhere()
    read: list[int] = []
    try:
        reader = threading.Thread(target=lambda: read.append(len(_tokenizer(folder)("hello")["input_ids"])))
        reader.start()
        reader.join(20)
        assert read  # read while the other load still held the lock
    finally:
        release.set()
        loading.join()


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    with loading_model("engine.model", str(folder)):
        return AutoTokenizer.from_pretrained(folder)


def test_a_child_forked_while_a_model_loads_loads_its_own(tmp_path: Path) -> None:
    """A fork while another thread held the load lock left it held in the child for good: its first load hung."""
    loading, release = _held_elsewhere()
    try:
        child = os.fork()
        if child == 0:  # the child: take the lock as its first load would, then leave at once
            with MODEL_LOADS:
                os._exit(0)
        deadline = time.monotonic() + 20
        status = 0
        while time.monotonic() < deadline:
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            raise AssertionError("the forked child waited for a lock its parent's thread held")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        loading.join()
