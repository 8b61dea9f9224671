"""The report of ``inferscale bench throughput``: the timed rounds, their ratios, and their table, JSON document and
plot (``throughput_vs_users.json``, ``throughput_vs_users.png``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale.bench.common import percentile, write_json_and_plot
from inferscale.bench.report import figure, percentile_lines, print_ratios, print_written, report_table

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ThroughputReport", "ThroughputRound", "plot_report", "print_throughput", "write_outputs"]


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


# ---------------------------------------------------------------------------------------------------- outputs


def write_outputs(report: ThroughputReport, out_dir: Path) -> None:
    """Write ``throughput_vs_users.json`` and ``throughput_vs_users.png`` into ``out_dir`` (created) and set their
    paths."""
    report.json_path, report.png_path = write_json_and_plot(
        out_dir, "throughput_vs_users", report.to_dict(), lambda path: plot_report(report, path)
    )


def plot_report(report: ThroughputReport, path: Path) -> None:
    """Two panels versus N (log scale): requests/s, and TTFT median with p95 dashed, per mode.

    Raises:
        ConfigError: when matplotlib is not installed (the ``apps`` extra).
    """
    labels = {"prompt": "prompt injection", "kv": "KV injection"}
    s = report.settings
    users = sorted({r.users for r in report.rounds})
    with figure(path, (11.0, 4.3), ncols=2) as (left, right):
        for mode in s["modes"]:
            rounds = sorted((r for r in report.rounds if r.mode == mode), key=lambda r: r.users)
            if not rounds:
                continue
            xs = [r.users for r in rounds]
            (line,) = left.plot(xs, [r.requests_per_s for r in rounds], marker="o", label=labels[mode])
            p50 = [statistics.median(r.ttft_ms) for r in rounds]
            p95 = [percentile(r.ttft_ms, 95) for r in rounds]
            percentile_lines(right, xs, p50, p95, f"{labels[mode]} p50", p95_as="line", color=line.get_color())
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
        left.figure.suptitle(
            f"vLLM, k={s['k']} memories, {s['requests_per_user']} request(s) per user, {s['max_tokens']} tokens "
            f"each ({report.machine.get('model')}, {report.machine.get('model_dtype') or s['dtype']})"
        )


def print_throughput(report: ThroughputReport, console: Console | None = None) -> None:
    """Print the table (requests/s, TTFT p50/p95 ms per mode and N) and the KV/prompt ratios.

    Raises:
        ConfigError: when rich is not installed (the ``apps`` extra).
    """
    from inferscale.apps_extra import console as make_console

    console = console or make_console()
    machine = report.machine
    modes = report.settings["modes"]
    columns = ["N"]
    for mode in modes:
        columns += [f"{mode} req/s", f"{mode} TTFT p50 / p95 ms"]
    if len(modes) == 2:
        columns.append("kv/prompt req/s")
    table = report_table(
        f"Throughput vs concurrent users · vLLM, k={report.settings['k']}, "
        f"{report.settings['requests_per_user']} req/user, {report.settings['max_tokens']} tokens · "
        f"{machine.get('model')} {machine.get('model_dtype') or report.settings['dtype']} on "
        f"{machine.get('cuda') or machine.get('processor')} ({machine.get('cpu_isa')})",
        [],
        columns,
    )
    for n in sorted({r.users for r in report.rounds}):
        row = [str(n)]
        for mode in modes:
            r = report.round(n, mode)
            if r is None:
                row += ["", ""]
                continue
            row += [f"{r.requests_per_s:.2f}", f"{statistics.median(r.ttft_ms):.0f} / {percentile(r.ttft_ms, 95):.0f}"]
        kv, prompt = report.round(n, "kv"), report.round(n, "prompt")
        if len(modes) == 2:
            row.append(f"{kv.requests_per_s / prompt.requests_per_s:.2f}×" if kv and prompt else "")
        table.add_row(*row)
    console.print(table)
    for r in report.rounds:
        console.print(
            f"N={r.users} {r.mode}: {r.prompt_tokens} prompt tokens, {r.cached_tokens} not computed by vLLM "
            f"({r.injected_tokens} injected), {r.output_tokens} generated",
            style="dim",
        )
    print_ratios(report.ratios(), console)
    print_written(report.json_path, report.png_path, console)
