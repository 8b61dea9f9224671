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


def test_a_number_not_measured_is_written_as_null_never_as_nan(tmp_path: Path) -> None:
    """``eval fidelity --first-token-only`` wrote ``"f1_kv_vs_prompt": NaN``: Python reads it, a strict JSON parser
    (JavaScript's ``JSON.parse``) refuses the whole report (a CLI user's report)."""
    path = tmp_path / "report.json"
    nan = float("nan")
    write_json(path, {"f1": nan, "cells": [{"kl": 0.5, "ttft_ms": np.float64(nan)}, (float("inf"), 1)], "n": 3})
    text = path.read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"f1": None, "cells": [{"kl": 0.5, "ttft_ms": None}, [None, 1]], "n": 3}


def test_an_out_path_that_is_a_file_is_refused_before_any_work(tmp_path: Path) -> None:
    """``bench ttft --out afile`` measured everything, then lost it to a ``FileExistsError`` traceback when writing
    its results; every ``--out`` is checked when the options are read."""
    import argparse

    from inferscale.cli_options import output_folder

    taken = tmp_path / "afile"
    taken.write_text("x")
    with pytest.raises(argparse.ArgumentTypeError, match="afile exists and is not a folder"):
        output_folder(str(taken))
    assert output_folder(str(tmp_path / "new")) == tmp_path / "new" and output_folder(str(tmp_path)) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # the check made "new" and removed it again


def test_an_out_path_under_a_file_or_where_nothing_can_be_written_is_refused(tmp_path: Path) -> None:
    """``--out x.json/sub`` and ``--out /proc/fo`` passed the check and lost a measured run to a traceback (a new
    user's find): the check now makes the folder and writes a file there, then removes what it made."""
    import argparse

    from inferscale.cli_options import output_folder

    (tmp_path / "x.json").write_text("{}")
    for bad in (tmp_path / "x.json" / "sub", tmp_path / "x.json" / "a" / "b", Path("/proc/inferscale-out")):
        with pytest.raises(argparse.ArgumentTypeError, match=f"cannot write results to {bad}: "):
            output_folder(str(bad))
    deep = tmp_path / "a" / "b" / "c"
    assert output_folder(str(deep)) == deep
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    (tmp_path / "kept").mkdir()
    assert output_folder(str(tmp_path / "kept" / "new")) == tmp_path / "kept" / "new"
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []
    # a review's find: the folders made were read from the text, so "new/../kept" took ./kept (there before, empty)
    # for one it made, and removed it
    assert output_folder(str(tmp_path / "new" / ".." / "kept")) == tmp_path / "new" / ".." / "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "x.json"]


@pytest.mark.parametrize(
    "command", [["bench", "ttft"], ["bench", "throughput"], ["eval", "fidelity"], ["eval", "locomo"]]
)
def test_every_out_option_refuses_a_file_with_a_usage_error(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from inferscale.cli import main

    taken = tmp_path / "afile"
    taken.write_text("x")
    with pytest.raises(SystemExit) as exited:
        main([*command, "--out", str(taken)])
    assert exited.value.code == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main([*command, "--out", str(taken / "sub")])
    assert exited.value.code == 2
    assert f"cannot write results to {taken / 'sub'}: " in capsys.readouterr().err
