"""examples/llamaindex_chat.py runs on the embedded models (in a subprocess with this venv's python)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "llamaindex_chat.py"


def test_the_llamaindex_chat_example_runs(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["user", "assistant"] * 3
    assert all(line.removeprefix("assistant:").strip() for line in lines[1::2])
