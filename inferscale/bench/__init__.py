"""Benchmarks run from the command line (``inferscale bench ...``) and their argparse wiring.

- :mod:`inferscale.bench.ttft`: time to first token versus k, prompt injection against KV injection from each KV
  store tier, and the query alone, measured side by side in one run (its report in
  :mod:`inferscale.bench.ttft_report`, the tier staging in :mod:`inferscale.bench.kv_tiers`).
- :mod:`inferscale.bench.throughput`: requests/s and TTFT versus concurrent users on vLLM (its report in
  :mod:`inferscale.bench.throughput_report`).
- :mod:`inferscale.bench.report`: the table and plot helpers the bench and eval reports share.
- :mod:`inferscale.bench.settings`: the commands' settings (their flags), which import no torch.
- :mod:`inferscale.bench.cli`: ``add_bench_parser`` and ``add_eval_parser`` (the LoCoMo evaluation lives in
  :mod:`inferscale.eval.locomo_eval`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ loads, typed for the type checker
    from inferscale.bench.ttft import TTFTCell, TTFTReport, TTFTSettings, run_ttft_bench, synthetic_facts

__all__ = ["TTFTCell", "TTFTReport", "TTFTSettings", "run_ttft_bench", "synthetic_facts"]


def __getattr__(name: str) -> Any:
    """The names of :data:`__all__`, from :mod:`inferscale.bench.ttft` on first use: it imports torch, which the
    command line's parser (``inferscale --help``, through :mod:`inferscale.bench.cli`) must not wait for."""
    if name in __all__:
        return getattr(importlib.import_module("inferscale.bench.ttft"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
