"""``inferscale bench throughput``: requests/s and TTFT versus concurrent users, prompt vs KV injection on vLLM.

N users (N in ``settings.users``) chat at once with vLLM's async engine (``AsyncLLM``, in process, with the
InferScale connector). Each user sends ``requests_per_user`` requests one after another (closed loop: the next
request leaves when the previous answer is complete), each with k memories, and both paths run on the same
engine, one after the other for each N:

- ``prompt``: the k facts' tokens pasted after the system prefix, prefilled by vLLM (Mem0-style);
- ``kv``: the same tokens with their pre-RoPE K/V injected by the connector, so vLLM prefills only the query.

Workload. A pool of ``settings.facts`` synthetic one-sentence facts is encoded once (after the system prefix, as
``MemoryClient`` does by default) and staged for vLLM's workers before any timing. Request r of user u takes its
own random k of them, in its own order (seeded by (u, r)), with its own question. Every request is salted with its
user (``cache_salt``, both modes), so vLLM's prefix cache is never shared between users; a user's own requests
share blocks only where their token sequences agree (the system prefix, and a first fact drawn twice). Retrieval is
not part of this benchmark: it costs the same in both modes (``bench ttft`` includes it).

Per (N, mode) it reports: requests/s and generated tokens/s over the wall time of the whole round, TTFT (from
submitting the request, including building the KV request, to its first token) and end-to-end latency, median
and p95 in ms, and the tokens vLLM took from its prefix cache or from the connector. The prefix cache is
emptied before each round. KV requests inject the system prefix with the memory (their salt also binds the
memory, so they never reuse a block computed by another request); prompt requests prefill it, once per user at
most (vLLM caches whole blocks only, and on CPU a block is 128 tokens, longer than the 37-token prefix, so there
every prompt request prefills it). Outputs:
``throughput_vs_users.json`` and ``throughput_vs_users.png`` in ``settings.out_dir``.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.table import Table

from inferscale.bench.common import check_engine, machine_info, percentile, write_json_and_plot
from inferscale.bench.ttft import synthetic_facts
from inferscale.errors import ConfigError

if TYPE_CHECKING:
    from inferscale.engines.vllm import VLLMEngine
    from inferscale.engines.vllm.engine import PreparedRequest
    from inferscale.kv.fact import FactKV

__all__ = [
    "DEFAULT_USERS",
    "ThroughputReport",
    "ThroughputRound",
    "ThroughputSettings",
    "print_throughput",
    "run_throughput_bench",
]

DEFAULT_USERS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 100)
"""Concurrent users of the paper's throughput figure."""

MODES: tuple[str, ...] = ("prompt", "kv")


@dataclass(frozen=True)
class ThroughputSettings:
    """What ``inferscale bench throughput`` measures.

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
    """

    users: tuple[int, ...] = DEFAULT_USERS
    k: int = 30
    requests_per_user: int = 2
    max_tokens: int = 16
    facts: int = 120
    modes: tuple[str, ...] = MODES
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    model: str | None = None
    kv_cache_bytes: int = 6 << 30
    max_num_seqs: int = 128
    enforce_eager: bool = True
    seed: int = 0
    out_dir: Path = Path("out/bench/throughput")

    def __post_init__(self) -> None:
        if not self.users or any(n < 1 for n in self.users) or len(set(self.users)) != len(self.users):
            raise ConfigError(f"users must be distinct counts >= 1, got {self.users!r}")
        if self.k < 1 or self.facts < self.k:
            raise ConfigError(f"need 1 <= k <= facts, got k={self.k}, facts={self.facts}")
        if self.requests_per_user < 1 or self.max_tokens < 1:
            raise ConfigError("requests_per_user and max_tokens must be >= 1")
        if not self.modes or set(self.modes) - set(MODES) or len(set(self.modes)) != len(self.modes):
            raise ConfigError(f"modes must be a non-empty subset of {list(MODES)}, got {self.modes!r}")


@dataclass
class ThroughputRound:
    """One (N, mode) round: every user's requests, timed.

    Attributes:
        users: N, the concurrent users.
        mode: ``"prompt"`` or ``"kv"``.
        wall_s: from the first submission to the last answer (s).
        ttft_ms, latency_ms: per request, time to the first token and to the last one (ms).
        output_tokens: tokens generated over the round.
        prompt_tokens: prompt tokens over the round (prefix + memory + query).
        cached_tokens: prompt tokens vLLM did not compute (prefix-cache hits plus tokens the connector injected).
        injected_tokens: prompt tokens whose K/V the connector wrote.
    """

    users: int
    mode: str
    wall_s: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    injected_tokens: int = 0

    @property
    def requests(self) -> int:
        """Requests completed."""
        return len(self.ttft_ms)

    @property
    def requests_per_s(self) -> float:
        """Completed requests per second of wall time."""
        return self.requests / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def output_tokens_per_s(self) -> float:
        """Generated tokens per second of wall time."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary and raw samples."""
        return {
            "users": self.users,
            "mode": self.mode,
            "requests": self.requests,
            "wall_s": round(self.wall_s, 4),
            "requests_per_s": round(self.requests_per_s, 4),
            "output_tokens_per_s": round(self.output_tokens_per_s, 3),
            "ttft_p50_ms": round(statistics.median(self.ttft_ms), 3) if self.ttft_ms else None,
            "ttft_p95_ms": round(percentile(self.ttft_ms, 95), 3) if self.ttft_ms else None,
            "latency_p50_ms": round(statistics.median(self.latency_ms), 3) if self.latency_ms else None,
            "latency_p95_ms": round(percentile(self.latency_ms, 95), 3) if self.latency_ms else None,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "injected_tokens": self.injected_tokens,
            "ttft_ms": [round(v, 3) for v in self.ttft_ms],
            "latency_ms": [round(v, 3) for v in self.latency_ms],
        }


@dataclass
class ThroughputReport:
    """Every round of one run, with the settings and the machine.

    Attributes:
        settings: what was asked (JSON-ready).
        machine: where it ran.
        rounds: one per (N, mode).
        json_path, png_path: the files written.
    """

    settings: dict[str, Any]
    machine: dict[str, Any]
    rounds: list[ThroughputRound]
    json_path: Path | None = None
    png_path: Path | None = None

    def round(self, users: int, mode: str) -> ThroughputRound | None:
        """The round of ``mode`` at N = ``users``, or ``None``."""
        return next((r for r in self.rounds if r.users == users and r.mode == mode), None)

    def ratios(self) -> dict[str, float | None]:
        """Per N: KV over prompt requests/s (``throughput_kv_over_prompt_n{N}``) and prompt over KV TTFT median
        (``ttft_prompt_over_kv_n{N}``)."""
        out: dict[str, float | None] = {}
        for n in sorted({r.users for r in self.rounds}):
            kv, prompt = self.round(n, "kv"), self.round(n, "prompt")
            if kv is None or prompt is None:
                continue
            out[f"throughput_kv_over_prompt_n{n}"] = round(kv.requests_per_s / prompt.requests_per_s, 3)
            out[f"ttft_prompt_over_kv_n{n}"] = round(
                statistics.median(prompt.ttft_ms) / statistics.median(kv.ttft_ms), 3
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON document written to ``throughput_vs_users.json``."""
        return {
            "benchmark": "throughput_vs_users",
            "settings": self.settings,
            "machine": self.machine,
            "ratios": self.ratios(),
            "rounds": [r.to_dict() for r in self.rounds],
        }


# ---------------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class _Draw:
    """One request of the workload: who asks what, over which facts (indices into the pool, in layout order)."""

    user: int
    index: int
    question: str
    facts: tuple[int, ...]


def draws(settings: ThroughputSettings, users: int) -> list[list[_Draw]]:
    """Per user, its requests: a question and k distinct fact indices in a random order, seeded by (user, r)."""
    out: list[list[_Draw]] = []
    for u in range(users):
        mine = []
        for r in range(settings.requests_per_user):
            rng = random.Random(f"{settings.seed}/{u}/{r}")
            picked = tuple(rng.sample(range(settings.facts), settings.k))
            question = f"User {u}, question {r + 1}: which friend took up a new hobby most recently, and where?"
            mine.append(_Draw(u, r, question, picked))
        out.append(mine)
    return out


def _stats(output: Any) -> dict[str, Any]:
    params = getattr(output, "kv_transfer_params", None) or {}
    return params.get("inferscale", {}) if isinstance(params, dict) else {}


class _Runner:
    """Drives rounds on one ``AsyncLLM``: builds each request, submits it, records its timings."""

    def __init__(self, engine: VLLMEngine, llm: Any, pool: Sequence[FactKV], settings: ThroughputSettings) -> None:
        from vllm import SamplingParams

        self._engine = engine
        self._llm = llm
        self._pool = list(pool)
        self._settings = settings
        # ignore_eos: every request decodes exactly max_tokens, so both modes generate the same amount of work.
        self._sampling = SamplingParams(temperature=0.0, max_tokens=settings.max_tokens, ignore_eos=True)

    def _prepare(self, draw: _Draw, mode: str) -> PreparedRequest:
        from inferscale.scope import Scope

        facts = [self._pool[i] for i in draw.facts]
        scope = Scope(user_id=f"bench-user-{draw.user}").key()
        if mode == "kv":
            return self._engine.prepare_kv(draw.question, facts, scope)
        return self._engine.prepare_prompt(draw.question, [f.token_ids.tolist() for f in facts], scope)

    async def _one(self, draw: _Draw, mode: str, into: ThroughputRound) -> None:
        t0 = time.perf_counter()
        prompt, sampling = self._prepare(draw, mode).vllm_inputs(self._sampling)
        first: float | None = None
        final = None
        async for output in self._llm.generate(prompt, sampling, request_id=f"{mode}-{uuid.uuid4().hex}"):
            if first is None and output.outputs and output.outputs[0].token_ids:
                first = time.perf_counter()
            final = output
        end = time.perf_counter()
        if final is None:
            raise RuntimeError("vLLM returned no output")
        into.ttft_ms.append(((first or end) - t0) * 1000.0)
        into.latency_ms.append((end - t0) * 1000.0)
        into.output_tokens += len(final.outputs[0].token_ids)
        into.prompt_tokens += len(final.prompt_token_ids or [])
        into.cached_tokens += int(final.num_cached_tokens or 0)
        into.injected_tokens += int(_stats(final).get("injected_tokens", 0))

    async def _user(self, requests: list[_Draw], mode: str, into: ThroughputRound) -> None:
        for draw in requests:
            await self._one(draw, mode, into)

    def stage_pool(self) -> None:
        """Write (or link) every fact of the pool for vLLM's workers, so no timed request pays for it."""
        self._engine.prepare_kv("", self._pool, "")

    async def reset(self) -> None:
        """Empty vLLM's prefix cache.

        Raises:
            RuntimeError: when vLLM refuses (requests still running): the round would not start cold.
        """
        if not await self._llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache")

    async def round(self, users: int, mode: str) -> ThroughputRound:
        """Run N users' requests concurrently in ``mode``, from an empty prefix cache; returns the timed round."""
        await self.reset()
        result = ThroughputRound(users, mode)
        per_user = draws(self._settings, users)
        t0 = time.perf_counter()
        await asyncio.gather(*(self._user(mine, mode, result) for mine in per_user))
        result.wall_s = time.perf_counter() - t0
        return result


# ---------------------------------------------------------------------------------------------------- running


def _settings_dict(settings: ThroughputSettings) -> dict[str, Any]:
    return {
        "users": list(settings.users),
        "k": settings.k,
        "requests_per_user": settings.requests_per_user,
        "max_tokens": settings.max_tokens,
        "facts": settings.facts,
        "modes": list(settings.modes),
        "dtype": settings.dtype,
        "model": settings.model,
        "kv_cache_bytes": settings.kv_cache_bytes,
        "max_num_seqs": settings.max_num_seqs,
        "enforce_eager": settings.enforce_eager,
        "seed": settings.seed,
    }


def run_throughput_bench(settings: ThroughputSettings, console: Console | None = None) -> ThroughputReport:
    """Encode the fact pool, start vLLM's async engine with the connector, run every (N, mode) round, write
    ``throughput_vs_users.json`` and ``throughput_vs_users.png`` and return the report.

    Raises:
        ConfigError: when vLLM (or the vLLM engine of this package) is not installed.
    """
    check_engine("vllm")
    from inferscale.config import EngineConfig, MemoryConfig
    from inferscale.engines.vllm import VLLMEngine
    from inferscale.kv.encode import EncodeRequest

    console = console or Console(stderr=True)
    config = MemoryConfig(engine=EngineConfig(provider="vllm", model=settings.model, dtype=settings.dtype))
    engine = VLLMEngine(
        config.engine,
        config.system_prompt,
        home=config.home_dir(),
        encode_batch_size=config.kv.encode_batch_size,
        kv_cache_bytes=settings.kv_cache_bytes,
        enforce_eager=settings.enforce_eager,
        llm_kwargs={"max_num_seqs": settings.max_num_seqs, "disable_log_stats": True},
    )
    try:
        with console.status("encoding the fact pool"):
            prefix_ids = engine.system_prefix_ids()
            texts = synthetic_facts(settings.facts)
            pool = engine.encode_facts([EncodeRequest(engine.fact_token_ids(t), prefix_ids) for t in texts])
        with console.status("starting vLLM (async engine)"):
            llm = engine.start_async_llm()
        try:
            rounds = asyncio.run(_run_rounds(engine, llm, pool, settings, console))
        finally:
            llm.shutdown()
            del llm
            gc.collect()  # AsyncLLM.__del__ shuts down again; let it run now, not at interpreter exit
    finally:
        engine.close()
    report = ThroughputReport(settings=_settings_dict(settings), machine=machine_info(), rounds=rounds)
    report.machine["model"] = Path(str(engine.model.config._name_or_path)).name
    write_outputs(report, settings.out_dir)
    return report


async def _run_rounds(
    engine: VLLMEngine, llm: Any, pool: Sequence[FactKV], settings: ThroughputSettings, console: Console
) -> list[ThroughputRound]:
    runner = _Runner(engine, llm, pool, settings)
    runner.stage_pool()
    for mode in settings.modes:  # untimed: kernels and allocator of both paths
        await runner.round(1, mode)
    rounds: list[ThroughputRound] = []
    for i, n in enumerate(settings.users):
        # Alternate which mode goes first, so drift on a shared machine does not always favour the same one.
        modes = list(settings.modes) if i % 2 == 0 else list(reversed(settings.modes))
        for mode in modes:
            console.print(f"N={n} users, {mode}: {n * settings.requests_per_user} requests", style="dim")
            rounds.append(await runner.round(n, mode))
    return rounds


# ---------------------------------------------------------------------------------------------------- outputs


def write_outputs(report: ThroughputReport, out_dir: Path) -> None:
    """Write ``throughput_vs_users.json`` and ``throughput_vs_users.png`` into ``out_dir`` (created) and set their
    paths."""
    report.json_path, report.png_path = write_json_and_plot(
        out_dir, "throughput_vs_users", report.to_dict(), lambda path: plot_report(report, path)
    )


def plot_report(report: ThroughputReport, path: Path) -> None:
    """Two panels versus N (log scale): requests/s, and TTFT median with p95 dashed, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.3), dpi=120)
    labels = {"prompt": "prompt injection", "kv": "KV injection"}
    for mode in report.settings["modes"]:
        rounds = sorted((r for r in report.rounds if r.mode == mode), key=lambda r: r.users)
        if not rounds:
            continue
        xs = [r.users for r in rounds]
        (line,) = left.plot(xs, [r.requests_per_s for r in rounds], marker="o", label=labels[mode])
        right.plot(
            xs,
            [statistics.median(r.ttft_ms) for r in rounds],
            marker="o",
            color=line.get_color(),
            label=f"{labels[mode]} p50",
        )
        right.plot(
            xs,
            [percentile(r.ttft_ms, 95) for r in rounds],
            linestyle="--",
            color=line.get_color(),
            label=f"{labels[mode]} p95",
        )
    s = report.settings
    users = sorted({r.users for r in report.rounds})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(users, [str(n) for n in users])
        ax.minorticks_off()
        ax.set_xlabel("concurrent users N")
        ax.grid(alpha=0.3)
        ax.legend()
    left.set_ylabel("requests/s")
    right.set_ylabel("TTFT (ms)")
    right.set_yscale("log")
    fig.suptitle(
        f"vLLM, k={s['k']} memories, {s['requests_per_user']} request(s) per user, {s['max_tokens']} tokens each "
        f"({report.machine.get('model')}, {s['dtype']})"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def print_throughput(report: ThroughputReport, console: Console | None = None) -> None:
    """Print the table (requests/s, TTFT p50/p95 ms per mode and N) and the KV/prompt ratios."""
    console = console or Console()
    machine = report.machine
    table = Table(
        title=(
            f"Throughput vs concurrent users · vLLM, k={report.settings['k']}, "
            f"{report.settings['requests_per_user']} req/user, {report.settings['max_tokens']} tokens · "
            f"{machine.get('model')} {report.settings['dtype']} on {machine.get('cuda') or machine.get('processor')}"
        )
    )
    table.add_column("N", justify="right")
    for mode in report.settings["modes"]:
        table.add_column(f"{mode} req/s", justify="right")
        table.add_column(f"{mode} TTFT p50 / p95 ms", justify="right")
    if len(report.settings["modes"]) == 2:
        table.add_column("kv/prompt req/s", justify="right")
    for n in sorted({r.users for r in report.rounds}):
        row = [str(n)]
        for mode in report.settings["modes"]:
            r = report.round(n, mode)
            if r is None:
                row += ["", ""]
                continue
            row += [f"{r.requests_per_s:.2f}", f"{statistics.median(r.ttft_ms):.0f} / {percentile(r.ttft_ms, 95):.0f}"]
        kv, prompt = report.round(n, "kv"), report.round(n, "prompt")
        if len(report.settings["modes"]) == 2:
            row.append(f"{kv.requests_per_s / prompt.requests_per_s:.2f}×" if kv and prompt else "")
        table.add_row(*row)
    console.print(table)
    for r in report.rounds:
        console.print(
            f"N={r.users} {r.mode}: {r.prompt_tokens} prompt tokens, {r.cached_tokens} not computed by vLLM "
            f"({r.injected_tokens} injected), {r.output_tokens} generated",
            style="dim",
        )
    for name, value in report.ratios().items():
        console.print(f"{name} = {value}")
    if report.json_path is not None:
        console.print(f"wrote {report.json_path} and {report.png_path}", style="dim")
