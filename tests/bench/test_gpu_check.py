"""benchmarks/gpu_check.py runs end to end (on a tiny model on the CPU here; the GPU run is the same code)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a Python process that imports torch and runs a tiny model: seconds of CPU
def test_gpu_check_prints_every_k_on_a_tiny_model() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--repeats", "1", "--ks", "0", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0] in ("0", "3")]
    assert [r[0] for r in rows] == ["0", "3"]
    assert rows[1][1] == str(3 * 26)  # memory tokens at k=3
    assert "encoded 3 facts" in out
