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
    answers = [part.splitlines()[0] for part in run.stdout.split("agent:")[1:]]
    injected = [part.splitlines()[0] for part in run.stdout.split("memories injected as K/V:")[1:]]
    assert len(answers) == 2 and all("Biscuit" in answer for answer in answers), run.stdout
    # limit=2: both times the beagle fact is injected; the question stored by the first run never comes back
    assert len(injected) == 2 and all("'My beagle is called Biscuit.'" in line for line in injected), run.stdout
    assert not any("What is my dog called?" in line for line in injected), run.stdout
    assert "stored after the runs: 4 memories" in run.stdout  # the second turn repeats the first verbatim
