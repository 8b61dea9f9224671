"""The report writer every benchmark shares (``inferscale.bench.common.write_json``)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import numpy as np
import pytest

from inferscale.bench.common import write_json


def test_write_json_creates_the_folder_and_writes_what_json_cannot_hold_as_text(tmp_path: Path) -> None:
    """Eight benchmarks wrote their report with their own copy of these lines, five of them without a final newline
    and only one able to write a date or a path (as any value's ``str``)."""
    path = tmp_path / "new" / "deeper" / "report.json"
    document = {"ttft_ms": [1.5, 2.0], "day": date(2026, 12, 5), "out": tmp_path / "x", "name": "Zoë"}
    assert write_json(path, document) == path
    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert json.loads(text) == {"ttft_ms": [1.5, 2.0], "day": "2026-12-05", "out": str(tmp_path / "x"), "name": "Zoë"}
    write_json(path, {"p50_ms": np.float32(1.5), "n": np.int64(3)})
    assert json.loads(path.read_text(encoding="utf-8")) == {"p50_ms": 1.5, "n": 3}
    with pytest.raises(TypeError, match="a object has no JSON form in a report"):  # never a repr in a report
        write_json(path, {"x": object()})
