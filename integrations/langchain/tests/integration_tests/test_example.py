"""``examples/langchain_agent.py`` runs as a user runs it: a subprocess on the embedded models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "langchain_agent.py"


def test_the_agent_example_answers_from_memory() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Biscuit" in run.stdout.split("agent:", 1)[1].splitlines()[0]
    assert "memories injected as K/V: ['" in run.stdout
    assert "stored after the run: 4 memories" in run.stdout
