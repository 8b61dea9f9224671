"""The settings of ``inferscale bench ttft`` and ``inferscale bench throughput``: the options of each command
(:mod:`inferscale.cli_options` builds the flags from the fields), apart from the benchmarks, which import torch,
so that building the command line parser (``inferscale --help``) imports neither.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from inferscale.cli_options import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    MODEL_OPTION,
    THREADS_OPTION,
    cli,
    int_list,
    name_list,
    non_negative_int,
    output_folder,
    positive_int,
)
from inferscale.config import DType
from inferscale.errors import ConfigError

__all__ = [
    "DEFAULT_KS",
    "DEFAULT_QUERY",
    "DEFAULT_USERS",
    "MODES",
    "TIER_ORDER",
    "TTFTSettings",
    "ThroughputSettings",
]

TIER_ORDER: tuple[str, ...] = ("device", "host", "disk")
"""The KV store tiers a TTFT run measures, fastest first."""

DEFAULT_KS: tuple[int, ...] = (0, 5, 10, 20, 30, 50)
"""Memory counts of the paper's TTFT figure."""

DEFAULT_QUERY = "Which of my friends collects old maps, and since when?"
"""The query of every call (any query works: the same one retrieves the same top-k at every k)."""


@dataclass(frozen=True)
class TTFTSettings:
    """What ``inferscale bench ttft`` measures and where it writes; each field's flag and help are in its metadata.

    Attributes:
        ks: memory counts k (the facts retrieved per call), each >= 0.
        repeats: timed calls per cell (>= 1); medians and p95 are taken over them.
        engine: ``"transformers"`` or ``"vllm"`` (the latter needs ``inferscale.engines.vllm``).
        dtype: model dtype (``"auto"``, ``"bfloat16"``, ``"float16"``, ``"float32"``).
        device: ``"auto"``, ``"cpu"``, ``"cuda"``...
        model: model folder or name; ``None`` = the embedded SmolLM2-135M-Instruct.
        tiers: KV store tiers to measure; ``None`` = every tier the store has (device, host, disk).
        query: the query text.
        warmup: untimed rounds (every path once per round) before measuring.
        num_threads: torch CPU threads; ``None`` runs the engine's default (``"auto"``: the CPUs the process may use).
        out_dir: folder for ``ttft_vs_k.json`` and ``ttft_vs_k.png`` (created).
        data_dir: folder for the throwaway database and KV files; ``None`` = a new temporary folder.
        prefix_cache: vLLM only. ``"cold"`` empties vLLM's prefix cache before every timed call and then prefills
            the system prefix alone, as a running server would have it, so a repeat of the same request is
            computed (prompt) or injected (KV) again; ``"warm"`` keeps the cache, so repeats of a request are
            served from it. The transformers engine keeps nothing between requests (each builds its cache on the
            shared system prefix), so this changes nothing there.
        recompute: the ``kv.recompute`` policy the KV cells are served with; ``None`` keeps ``KVConfig``'s
            default. Its recomputed tokens are counted in the FLOP ratio.

    Raises:
        ConfigError: for an empty or negative ``ks`` or one without a k >= 1, ``repeats < 1``, ``warmup < 0``, an
            unknown ``prefix_cache``, an unknown tier or an unknown ``recompute`` policy.
    """

    ks: tuple[int, ...] = field(
        default=DEFAULT_KS,
        metadata=cli(
            "--ks", type=int_list, help=f"comma-separated k values (default {','.join(map(str, DEFAULT_KS))})"
        ),
    )
    repeats: int = field(
        default=5, metadata=cli("--repeats", type=positive_int, help="timed calls per cell (default 5)")
    )
    engine: Literal["transformers", "vllm"] = field(
        default="transformers", metadata=cli("--engine", help="chat engine (default transformers)")
    )
    dtype: DType = field(default="auto", metadata=DTYPE_OPTION)
    device: str = field(default="auto", metadata=DEVICE_OPTION)
    model: str | None = field(default=None, metadata=MODEL_OPTION)
    tiers: tuple[str, ...] | None = field(
        default=None,
        metadata=cli(
            "--tiers", type=name_list, help="KV tiers to measure, e.g. host,disk (default: every tier present)"
        ),
    )
    query: str = field(default=DEFAULT_QUERY, metadata=cli("--query", help="the query text"))
    warmup: int = field(
        default=2, metadata=cli("--warmup", type=non_negative_int, help="untimed warm-up rounds (default 2)")
    )
    num_threads: int | None = field(default=None, metadata=THREADS_OPTION)
    out_dir: Path = field(
        default=Path("out/bench/ttft"),
        metadata=cli("--out", type=output_folder, help="output folder (default out/bench/ttft)"),
    )
    data_dir: Path | None = None
    prefix_cache: Literal["cold", "warm"] = field(
        default="cold",
        metadata=cli(
            "--prefix-cache",
            help="vLLM only: empty its prefix cache before every timed call (cold, default) or keep it (warm)",
        ),
    )
    recompute: str | None = field(
        default=None,
        metadata=cli(
            "--recompute",
            metavar="POLICY",
            help="kv.recompute for the KV cells, e.g. tail:24 or none (default: the configured default)",
        ),
    )

    def __post_init__(self) -> None:
        if not self.ks or any(k < 0 for k in self.ks):
            raise ConfigError(f"ks must be non-empty and >= 0, got {self.ks!r}")
        if max(self.ks) == 0:  # it failed later, on storing an empty list of memories
            raise ConfigError("ks needs at least one k >= 1 (k=0, the query alone, is measured beside them)")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.warmup < 0:
            raise ConfigError(f"warmup must be >= 0, got {self.warmup}")
        if self.prefix_cache not in ("cold", "warm"):
            raise ConfigError(f"prefix_cache must be 'cold' or 'warm', got {self.prefix_cache!r}")
        if self.tiers is not None and (unknown := set(self.tiers) - set(TIER_ORDER)):
            raise ConfigError(f"unknown KV tiers {sorted(unknown)}; choose from {list(TIER_ORDER)}")
        if self.recompute is not None:
            from inferscale.kv.recompute import RecomputePolicy

            RecomputePolicy.parse(self.recompute)  # ConfigError for an unknown policy


DEFAULT_USERS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 100)
"""Concurrent users of the paper's throughput figure."""

MODES: tuple[str, ...] = ("prompt", "kv")
"""The injection modes a throughput run compares."""


@dataclass(frozen=True)
class ThroughputSettings:
    """What ``inferscale bench throughput`` measures; each field's flag and help are in its metadata.

    Attributes:
        users: concurrent user counts N, each >= 1.
        k: memories per request (>= 1, at most ``facts``).
        requests_per_user: requests each user sends, one after another (>= 1).
        max_tokens: answer budget per request (tokens, >= 1); decoding is greedy and stops only at the budget.
        facts: size of the fact pool the requests draw from (>= k).
        modes: ``"prompt"`` and/or ``"kv"``.
        dtype: model dtype of vLLM and of the fact encoder.
        model: model folder; ``None`` = the embedded SmolLM2-135M-Instruct.
        kv_cache_bytes: vLLM's paged KV cache size (bytes); it must hold N requests' prompts at the largest N.
        max_num_seqs: most requests vLLM runs at once (>= max(users), or the rest queue).
        enforce_eager: run vLLM without CUDA graphs / torch.compile (needed for a quick start on CPU; pass False on
            a GPU for representative figures).
        seed: seed of the fact draws.
        out_dir: folder for the JSON and the plot (created).

    Raises:
        ConfigError: for repeated or non-positive user counts, ``k`` outside 1..facts, ``requests_per_user`` or
            ``max_tokens`` below 1, or modes that are not a non-empty subset of ``prompt``, ``kv``.
    """

    users: tuple[int, ...] = field(
        default=DEFAULT_USERS,
        metadata=cli(
            "--users",
            type=int_list,
            help=f"comma-separated concurrent user counts (default {','.join(map(str, DEFAULT_USERS))})",
        ),
    )
    k: int = field(default=30, metadata=cli("-k", "--k", type=positive_int, help="memories per request (default 30)"))
    requests_per_user: int = field(
        default=2,
        metadata=cli("--requests-per-user", type=positive_int, help="requests each user sends in turn (default 2)"),
    )
    max_tokens: int = field(
        default=16, metadata=cli("--max-tokens", type=positive_int, help="tokens generated per request (default 16)")
    )
    facts: int = field(
        default=120, metadata=cli("--facts", type=positive_int, help="fact pool the requests draw from (default 120)")
    )
    modes: tuple[str, ...] = field(
        default=MODES, metadata=cli("--modes", type=name_list, help="prompt,kv (default both)")
    )
    dtype: DType = field(default="auto", metadata=DTYPE_OPTION)
    model: str | None = field(default=None, metadata=MODEL_OPTION)
    kv_cache_bytes: int = field(
        default=6 << 30,
        metadata=cli("--kv-cache-bytes", type=positive_int, help="vLLM paged KV cache size in bytes (default 6 GiB)"),
    )
    max_num_seqs: int = field(
        default=128,
        metadata=cli("--max-num-seqs", type=positive_int, help="most requests vLLM runs at once (default 128)"),
    )
    enforce_eager: bool = field(
        default=True,
        metadata=cli(
            "--enforce-eager",
            action=argparse.BooleanOptionalAction,
            help="run vLLM eagerly (default; quick start on CPU); --no-enforce-eager for CUDA graphs on a GPU",
        ),
    )
    seed: int = field(
        default=0, metadata=cli("--seed", type=non_negative_int, help="seed of the fact draws (default 0)")
    )
    out_dir: Path = field(
        default=Path("out/bench/throughput"),
        metadata=cli("--out", type=output_folder, help="output folder (default out/bench/throughput)"),
    )

    def __post_init__(self) -> None:
        if not self.users or any(n < 1 for n in self.users) or len(set(self.users)) != len(self.users):
            raise ConfigError(f"users must be distinct counts >= 1, got {self.users!r}")
        if self.k < 1 or self.facts < self.k:
            raise ConfigError(f"need 1 <= k <= facts, got k={self.k}, facts={self.facts}")
        if self.requests_per_user < 1 or self.max_tokens < 1:
            raise ConfigError("requests_per_user and max_tokens must be >= 1")
        if not self.modes or set(self.modes) - set(MODES) or len(set(self.modes)) != len(self.modes):
            raise ConfigError(f"modes must be a non-empty subset of {list(MODES)}, got {self.modes!r}")
