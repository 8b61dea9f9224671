"""What the LoCoMo fidelity probes share (``gap_probes.py``, ``block_contexts.py``, ``semantic_context.py``,
``context_ensemble.py``, ``link_tokens.py``): the options that choose the slice, the float32 engine they measure on,
the transformers cache they prefill a query on, a conversation's memories embedded (LoCoMo's or the demo's), and
the answer figures they print.

The probes run as scripts (``python benchmarks/<probe>.py``), so this folder is on ``sys.path`` and they import
this module by name.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from inferscale.config import EngineConfig
from inferscale.engines.hf import load_causal_lm
from inferscale.engines.transformers import TransformersEngine
from inferscale.eval.fidelity import SYSTEM_PROMPTS, SettingSummary
from inferscale.eval.fidelity_cases import demo_conversation, locomo_conversation, memories_with_contexts
from inferscale.eval.metrics import normalize_answer
from inferscale.retrieval.embedder import Embedder


def add_slice_arguments(parser: argparse.ArgumentParser, locomo_required: bool = True) -> None:
    """``--locomo``, ``--conversation``, ``--questions`` and ``-k``: which LoCoMo questions, with how many retrieved
    memories each (the slice ``inferscale eval fidelity`` measures: conv-26, 40 questions, k=10). ``--locomo`` may be
    left out only where ``locomo_required`` is false (a probe that also runs on another slice checks it itself)."""
    parser.add_argument("--locomo", required=locomo_required, help="the LoCoMo file (never copied into the repo)")
    parser.add_argument("--conversation", default="conv-26", help="LoCoMo sample id (default conv-26)")
    parser.add_argument("--questions", type=int, default=40, help="questions of categories 1-4 (default 40)")
    parser.add_argument("-k", type=int, default=10, help="memories per question (default 10)")


def float32_engine(system_prompt: str = "default") -> tuple[TransformersEngine, Any]:
    """The embedded SmolLM2-135M-Instruct in float32 on the CPU, as a transformers engine with one of
    :data:`~inferscale.eval.fidelity.SYSTEM_PROMPTS`, and its model (a transformers causal LM, typed ``Any``: the
    probes reach into its layers).

    Raises:
        KeyError: for a ``system_prompt`` that is not one of :data:`~inferscale.eval.fidelity.SYSTEM_PROMPTS`.
    """
    config = EngineConfig(dtype="float32", device="cpu")
    _, model, tokenizer = load_causal_lm(config, None)
    return TransformersEngine(config, SYSTEM_PROMPTS[system_prompt], model=model, tokenizer=tokenizer), model


def dynamic_cache(keys: torch.Tensor, values: torch.Tensor, config: Any) -> DynamicCache:
    """A transformers cache holding ``keys`` / ``values`` (``[layers, n_kv_heads, T, head_dim]``, keys post-RoPE),
    each layer copied: a forward pass on it appends to the copies and leaves the tensors given unchanged."""
    data = [(keys[i][None].clone(), values[i][None].clone()) for i in range(keys.shape[0])]
    return DynamicCache(ddp_cache_data=data, config=config)


@dataclass(frozen=True)
class EmbeddedConversation:
    """One conversation (LoCoMo's or the demo's) as the context probes see it (``semantic_context.py``,
    ``context_ensemble.py``).

    Attributes:
        memories: each distinct turn once, in conversation order (:func:`memories_with_contexts`).
        temporal: each memory's context turns, as the product records them.
        questions: ``(question, gold answer)`` pairs.
        vectors: float32 ``[n_memories, dim]``, unit norm: the memories embedded as ``search`` embeds them.
    """

    memories: list[str]
    temporal: list[list[str]]
    questions: list[tuple[str, str | None]]
    vectors: np.ndarray

    def texts(self, order: Sequence[Sequence[int]]) -> list[list[str]]:
        """Contexts given as memory indices (one row per memory), as memory texts."""
        return [[self.memories[j] for j in row] for row in order]


def embedded_conversation(path: str, conversation: str, n_questions: int, embedder: Embedder) -> EmbeddedConversation:
    """LoCoMo's ``conversation`` (read from ``path``) and its first ``n_questions`` questions of categories 1-4, its
    memories embedded by ``embedder``."""
    sessions, questions = locomo_conversation(path, conversation, n_questions)
    return _embedded(sessions, questions, embedder)


def embedded_demo(embedder: Embedder) -> EmbeddedConversation:
    """The bundled demo conversation (every message a memory, as ``inferscale demo`` stores them) and its questions
    with their expected answers, its memories embedded by ``embedder``."""
    sessions, questions = demo_conversation()
    return _embedded(sessions, questions, embedder)


def _embedded(
    sessions: Sequence[Sequence[str]], questions: list[tuple[str, str | None]], embedder: Embedder
) -> EmbeddedConversation:
    memories, temporal = memories_with_contexts(sessions, across_sessions=False)  # as the runs before 23 measured
    vectors = np.asarray(embedder.embed(memories), dtype=np.float32)
    return EmbeddedConversation(memories, temporal, questions, vectors)


def figure(value: float | None) -> str:
    """A summary figure to three decimals, or "-" where none was measured (no gold answer)."""
    return "-" if value is None else f"{value:.3f}"


def answer_line(summary: SettingSummary, budget: int) -> str:
    """One setting's answer figures as one plain line (a log keeps it readable): F1 between the kv and prompt answers
    and against gold, budget hits and repeats, for answers of at most ``budget`` tokens."""
    s = summary
    return (
        f"{s.setting:<32} F1 kv~prompt {s.f1_kv_vs_prompt:.3f}  F1 gold kv {figure(s.f1_kv_gold)} / prompt "
        f"{figure(s.f1_prompt_gold)}  budget hit kv {s.kv_budget_hit:.2f} / prompt {s.prompt_budget_hit:.2f}  "
        f"repeat kv {s.kv_repeat:.2f} / prompt {s.prompt_repeat:.2f}  ({budget}-token budget)"
    )


def contains_answer(answer: str, expected: str | None) -> bool:
    """Whether ``answer`` holds ``expected`` as whole words, both normalised as LoCoMo normalises answers: how the
    probes count an answer right (the demo tables of docs/architecture.md were counted by eye before). An
    ``expected`` with no words left after normalising (``"The"``), or none, is never held."""
    want = normalize_answer(expected) if expected is not None else ""
    return bool(want) and f" {want} " in f" {normalize_answer(answer)} "
