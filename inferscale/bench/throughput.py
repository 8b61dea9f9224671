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
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale.bench.common import check_engine, machine_info, synthetic_facts
from inferscale.bench.settings import DEFAULT_USERS, ThroughputSettings
from inferscale.bench.throughput_report import ThroughputReport, ThroughputRound, print_throughput, write_outputs

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.engines.vllm import VLLMEngine
    from inferscale.engines.vllm.engine import PreparedRequest
    from inferscale.kv.fact import FactKV

__all__ = [
    "DEFAULT_USERS",
    "ThroughputReport",
    "ThroughputRound",
    "ThroughputSettings",
    "draws",
    "print_throughput",
    "run_throughput_bench",
    "write_outputs",
]


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
        self._engine.builder.stage(self._pool)

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
    check_engine("vllm", "bench throughput")
    from inferscale.apps_extra import console as make_console
    from inferscale.config import EngineConfig, MemoryConfig
    from inferscale.engines.hf.dtype import loaded_dtype
    from inferscale.engines.vllm import VLLMEngine
    from inferscale.kv.encode import EncodeRequest

    console = console or make_console(stderr=True)
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
        model_name = Path(str(engine.model.config.name_or_path)).name
        model_dtype = loaded_dtype(engine.model)  # what "auto" chose
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
    report.machine["model"] = model_name
    report.machine["model_dtype"] = model_dtype
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
