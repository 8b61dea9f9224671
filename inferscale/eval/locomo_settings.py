"""What ``inferscale eval locomo`` runs: its settings (each field is also its command-line option) and protocol
constants."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from inferscale.cli_options import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    MODEL_OPTION,
    THREADS_OPTION,
    cli,
    integer,
    name_list,
    non_negative_int,
    output_folder,
    positive_int,
)
from inferscale.config import DType, KVConfig
from inferscale.errors import ConfigError

__all__ = ["ANSWERED_CATEGORIES", "LATER_RUN_KEYS", "RUN_KEYS", "TEMPORAL_HINT", "LocomoEvalSettings"]

ANSWERED_CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
"""Numeric category codes that are answered and scored (5, adversarial, is excluded as in Mem0's protocol)."""

TEMPORAL_HINT = " Use the dates of the memories to answer with an approximate date."
"""Appended to category-2 (temporal) questions, as LoCoMo's own prediction code does."""

RUN_KEYS = (
    "k",
    "context_window",
    "recompute",
    "memory_attention_scale",
    "position_buckets",
    "encode_after_system_prefix",
    "first_memory_context_free",
    "model",
    "dtype",
    "max_new_tokens",
    "captions",
    "date_in_text",
    "infer",
    "judge_model",
)
"""Settings that change the answers: a resumed run must use the same values."""

LATER_RUN_KEYS: dict[str, Any] = {"first_memory_context_free": False}
"""Run keys added after runs were recorded, with the value a ``run.json`` without them was made with."""

_KV = KVConfig.model_fields


@dataclass(frozen=True)
class LocomoEvalSettings:
    """What ``inferscale eval locomo`` runs; each field's command-line flag and help are in its metadata.

    Attributes:
        data: path of ``locomo10.json``.
        conversations: sample ids to run (``None``: all ten).
        limit: at most this many questions (categories 1-4, file order) per conversation; ``None``: all.
        k: memories retrieved per question.
        context_window: w, preceding turns each memory is encoded after (``KVConfig.context_window``).
        recompute: ``KVConfig.recompute`` (``none``, ``head:m``, ``tail:n``, ``structure``, ``selective:r``).
        memory_attention_scale: ``KVConfig.memory_attention_scale`` s (1 = off).
        position_buckets: ``KVConfig.position_buckets`` (position-aware encoding distances, tokens).
        encode_after_system_prefix: encode facts after the system prefix (``KVConfig``; sink remedy).
        first_memory_context_free: serve the first memory from its context-free encoding
            (``KVConfig.first_memory_context_free``).
        out_dir: results folder (``results.jsonl``, ``summary.*``, the memory store).
        judge_base_url, judge_model, judge_api_key: OpenAI-compatible LLM judge; J is skipped unless both URL and
            model are set.
        model: chat model folder or name (``None``: the embedded SmolLM2-135M-Instruct).
        dtype, device: engine dtype and device.
        max_new_tokens: answer budget (tokens).
        captions: render a shared photo's BLIP caption after the turn text (``[shares …]``).
        date_in_text: prefix each memory with its session date, so that both modes can answer temporal questions.
        infer: extract facts with the LLM instead of storing turns verbatim (no dia_ids, so no recall).
        fidelity: compute the first-token KL (two extra forward passes per question).
        num_threads: torch CPU threads (``None``: torch's default).

    Raises:
        ConfigError: for ``k`` or ``limit`` below 1, a negative context window, invalid KV settings, or a judge
            with only one of URL and model.
    """

    data: Path = field(metadata=cli("--data", help="path of locomo10.json (e.g. ../shared/data/locomo/locomo10.json)"))
    conversations: tuple[str, ...] | None = field(
        default=None, metadata=cli("--conversations", type=name_list, help="sample ids, e.g. conv-26,conv-30")
    )
    limit: int | None = field(
        default=None, metadata=cli("--limit", type=positive_int, help="at most N questions per conversation")
    )
    k: int = field(default=10, metadata=cli("-k", "--k", type=positive_int, help="memories per question (default 10)"))
    context_window: int = field(
        default=_KV["context_window"].default,
        metadata=cli(
            "--context-window",
            type=non_negative_int,
            help="w: context turns per fact (default: KVConfig's, %(default)s)",
        ),
    )
    recompute: str = field(
        default=_KV["recompute"].default,
        metadata=cli(
            "--recompute",
            help="memory tokens recomputed at serve time: none, head:M, tail:N, structure or selective:R "
            f"(default {_KV['recompute'].default})",
        ),
    )
    memory_attention_scale: float = field(
        default=_KV["memory_attention_scale"].default,
        metadata=cli(
            "--memory-attention-scale",
            help=f"s, the memory block's attention scale (default {_KV['memory_attention_scale'].default})",
        ),
    )
    position_buckets: tuple[int, ...] = field(
        default=tuple(_KV["position_buckets"].default),
        metadata=cli(
            "--position-buckets",
            type=integer,
            nargs="+",
            help="distances from the system prefix facts are encoded at, tokens "
            f"(default {' '.join(map(str, _KV['position_buckets'].default))})",
        ),
    )
    encode_after_system_prefix: bool = field(
        default=True,
        metadata=cli(
            "--encode-after-system-prefix",
            action=argparse.BooleanOptionalAction,
            help="encode facts after the system prefix (default on)",
        ),
    )
    first_memory_context_free: bool = field(
        default=_KV["first_memory_context_free"].default,
        metadata=cli(
            "--first-memory-context-free",
            action=argparse.BooleanOptionalAction,
            help="serve the first memory from its context-free encoding (default: KVConfig's, %(default)s)",
        ),
    )
    out_dir: Path = field(
        default=Path("out/eval/locomo"),
        metadata=cli("--out", type=output_folder, help="results folder (default out/eval/locomo)"),
    )
    judge_base_url: str | None = field(
        default=None,
        metadata=cli("--judge-base-url", help="OpenAI-compatible API root for the LLM judge, e.g. http://host/v1"),
    )
    judge_model: str | None = field(default=None, metadata=cli("--judge-model", help="judge model name"))
    judge_api_key: str | None = field(
        default=None, metadata=cli("--judge-api-key", help="judge API key (default $INFERSCALE_JUDGE_API_KEY)")
    )
    model: str | None = field(
        default=None,
        metadata=MODEL_OPTION,
    )
    dtype: DType = field(default="bfloat16", metadata=DTYPE_OPTION)  # explicit: a resumed run must not change dtype
    device: str = field(default="auto", metadata=DEVICE_OPTION)
    max_new_tokens: int = field(
        default=32, metadata=cli("--max-new-tokens", type=positive_int, help="answer budget in tokens (default 32)")
    )
    captions: bool = field(
        default=True,
        metadata=cli("--captions", action=argparse.BooleanOptionalAction, help="keep photo captions (default on)"),
    )
    date_in_text: bool = field(
        default=True,
        metadata=cli(
            "--date-in-text",
            action=argparse.BooleanOptionalAction,
            help="prefix each memory with its session date (default on)",
        ),
    )
    infer: bool = field(
        default=False,
        metadata=cli("--infer", action=argparse.BooleanOptionalAction, help="extract facts with the LLM (no recall)"),
    )
    fidelity: bool = field(
        default=True,
        metadata=cli(
            "--fidelity",
            action=argparse.BooleanOptionalAction,
            help="compute the first-token KL (two extra forward passes per question; default on)",
        ),
    )
    num_threads: int | None = field(default=None, metadata=THREADS_OPTION)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")
        if self.context_window < 0:
            raise ConfigError(f"context window must be >= 0, got {self.context_window}")
        self.kv_config()  # the KV settings validate as KVConfig does
        if bool(self.judge_base_url) != bool(self.judge_model):
            raise ConfigError("the LLM judge needs both --judge-base-url and --judge-model")

    def kv_config(self) -> KVConfig:
        """The run's :class:`KVConfig`.

        Raises:
            ConfigError: when a KV setting is invalid.
        """
        try:
            return KVConfig(
                context_window=self.context_window,
                encode_after_system_prefix=self.encode_after_system_prefix,
                first_memory_context_free=self.first_memory_context_free,
                recompute=self.recompute,
                memory_attention_scale=self.memory_attention_scale,
                position_buckets=self.position_buckets,
            )
        except ValidationError as exc:
            raise ConfigError(f"invalid KV settings: {exc}") from exc

    @property
    def judged(self) -> bool:
        """Whether an LLM judge is configured."""
        return bool(self.judge_base_url and self.judge_model)

    def run_dict(self) -> dict[str, Any]:
        """The settings that change answers (recorded in ``run.json``)."""
        return {key: getattr(self, key) for key in RUN_KEYS}
