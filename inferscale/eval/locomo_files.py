"""The files of a LoCoMo run folder (``--out``), which make a run resumable.

- ``results.jsonl``: one JSON row per answered question, appended and flushed as each is answered;
- ``run.json``: the settings that change answers (:data:`~inferscale.eval.locomo_settings.RUN_KEYS`), so a resumed
  run cannot mix in results made with other settings;
- ``ingested.json``: the conversations already stored, with their memory counts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from inferscale.errors import ConfigError
from inferscale.eval.locomo_settings import LATER_RUN_KEYS, LocomoEvalSettings

__all__ = ["INGESTED_FILE", "RESULTS_FILE", "RUN_FILE", "check_run_file", "ingested", "load_results", "mark_ingested"]

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
"""One JSON line per answered question."""

RUN_FILE = "run.json"
"""The settings that change answers, written by the first run in a folder."""

INGESTED_FILE = "ingested.json"
"""``{sample_id: memories stored}`` of the conversations already ingested."""


def load_results(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of a ``results.jsonl`` by key (a torn last line, from a killed run, is ignored)."""
    rows: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            log.warning("ignoring a torn line in %s", path)
            continue
        rows[str(row["key"])] = row
    return rows


def check_run_file(out_dir: Path, settings: LocomoEvalSettings) -> None:
    """Record the run's settings in ``out_dir/run.json``, or check them against the ones recorded there.

    Raises:
        ConfigError: when ``run.json`` holds other values of the settings that change answers (named).
    """
    path = out_dir / RUN_FILE
    # Compared as they read back from JSON (a tuple setting comes back as a list), so a resumed run matches itself.
    current = json.loads(json.dumps(settings.run_dict()))
    if path.exists():
        previous = {**LATER_RUN_KEYS, **json.loads(path.read_text(encoding="utf-8"))}
        changed = {k: (previous.get(k), v) for k, v in current.items() if previous.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ConfigError(
                f"{out_dir} holds results made with other settings ({detail}); pass another --out to start a new run"
            )
        return
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")


def ingested(out_dir: Path) -> dict[str, int]:
    """The conversations ingested so far in ``out_dir``: ``{sample_id: memories stored}``."""
    path = out_dir / INGESTED_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def mark_ingested(out_dir: Path, sample_id: str, n: int) -> None:
    """Record that ``sample_id`` was ingested with ``n`` memories."""
    done = ingested(out_dir)
    done[sample_id] = n
    (out_dir / INGESTED_FILE).write_text(json.dumps(done, indent=2) + "\n", encoding="utf-8")
