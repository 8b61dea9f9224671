"""`inferscale demo --json` end to end on the embedded models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale.cli import main

pytestmark = pytest.mark.slow  # every test loads SmolLM2


def test_demo_json_prints_one_row_per_question(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json", "-k", "3", "--data-dir", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(rows) == 5
    for row in rows:
        assert row["memory_ids_same"] is True
        assert row["k"] == 3
        assert row["kv"]["answer"] and row["prompt"]["answer"]
        assert row["kv"]["ttft_ms"] > 0 and row["prompt"]["ttft_ms"] > 0
        assert row["memory_tokens"] > 0
    assert rows[0]["question"].startswith("Which city")
    assert (tmp_path / "memory.db").exists()
