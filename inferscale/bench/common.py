"""What the benchmarks share: where they ran, percentiles, the engine check, the synthetic facts they store, and a
JSON document with its plot."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime
from pathlib import Path, PurePath
from typing import Any

import numpy as np

from inferscale.engines.availability import check_engine

__all__ = ["check_engine", "machine_info", "percentile", "synthetic_facts", "write_json", "write_json_and_plot"]


_PEOPLE = ("Daniel", "Clara", "Raj", "Ines", "Tomas", "Leila", "Marco", "Yuki", "Ana", "Pedro", "Noor", "Felix")
_HOBBIES = (
    "old maps",
    "jazz records",
    "sourdough baking",
    "trail running",
    "green tea",
    "board games",
    "film cameras",
    "origami",
)
_PLACES = ("Porto", "Lyon", "Kyoto", "Austin", "Nairobi", "Oslo", "Lima", "Hanoi", "Tbilisi")
_MONTHS = ("January", "March", "May", "July", "September", "November")


def synthetic_facts(n: int) -> list[str]:
    """``n`` distinct one-sentence facts (about 20 tokens each) about friends, hobbies, places and dates.

    Deterministic: the same ``n`` gives the same list, and the first ``m`` facts of ``synthetic_facts(n)`` equal
    ``synthetic_facts(m)``.
    """
    facts: list[str] = []
    for i in range(n):
        person = _PEOPLE[i % len(_PEOPLE)]
        hobby = _HOBBIES[(i // len(_PEOPLE)) % len(_HOBBIES)]
        place = _PLACES[(i * 7) % len(_PLACES)]
        month = _MONTHS[(i * 5) % len(_MONTHS)]
        facts.append(f"My friend {person} took up {hobby} in {place} in {month} {2015 + i % 9}, memory number {i + 1}.")
    return facts


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by linear interpolation (NaN when empty)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def machine_info() -> dict[str, Any]:
    """Where the benchmark ran: platform, CPU, the vector ISA torch's CPU kernels use, CPU count, torch threads,
    load average, CUDA device (if any)."""
    import torch

    from inferscale.engines.hf.dtype import cpu_isa, cpu_model

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": cpu_model() or platform.processor() or platform.machine(),
        "cpu_isa": cpu_isa(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if hasattr(os, "getloadavg"):
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return info


def _json_value(value: object) -> object:
    """What ``json`` writes for a value it cannot hold: a date or a path as text, a numpy scalar as its number.

    Raises:
        TypeError: for anything else, so that a report never holds a value written as a mere ``repr``.
    """
    if isinstance(value, date | PurePath):
        return str(value)
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a {type(value).__name__} has no JSON form in a report: convert it first ({value!r})")


def _finite_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float (numpy's included) made ``None``: "not measured" is ``null`` in
    JSON, which has no NaN (a strict parser refused a report holding one)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(item) for item in value]
    return value


def write_json(path: Path, document: Any) -> Path:
    """Write ``document`` as indented UTF-8 JSON to ``path`` (its folder created); dates and paths are written as
    text, numpy scalars as numbers, and a NaN or infinite number (not measured) as ``null``.

    Returns:
        ``path``.

    Raises:
        TypeError: for another value JSON cannot hold.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite_json(document), indent=2, default=_json_value, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def write_json_and_plot(
    out_dir: Path, stem: str, document: Mapping[str, Any], plot: Callable[[Path], None]
) -> tuple[Path, Path]:
    """Write ``document`` to ``out_dir/<stem>.json`` and ``plot(out_dir/<stem>.png)``; ``out_dir`` is created.

    Returns:
        ``(json_path, png_path)``.
    """
    json_path, png_path = write_json(Path(out_dir) / f"{stem}.json", document), Path(out_dir) / f"{stem}.png"
    plot(png_path)
    return json_path, png_path
