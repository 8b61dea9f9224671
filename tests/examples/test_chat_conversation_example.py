"""``examples/chat_conversation.py`` runs as a user runs it (a subprocess on the embedded defaults), and its
conversation retrieves with each turn's question and streams every answer in full."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inferscale import MemoryClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat_conversation.py"

pytestmark = pytest.mark.slow  # SmolLM2 and MiniLM


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chat_conversation", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_runs_three_streamed_turns() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("user:") == 3 and run.stdout.count("[memories:") == 3


def test_each_turn_retrieves_with_its_question_and_answers_from_memory(tmp_path: Path) -> None:
    example = _example()
    client = MemoryClient({"data_dir": str(tmp_path), "engine": {"dtype": "float32"}})
    try:
        for memory in example.MEMORIES:
            client.add(memory, user_id="alice", infer=False)
        turns = example.converse(client, "alice")
    finally:
        client.close()
    assert [t["memories"][0] for t in turns] == example.MEMORIES  # each question's own memory ranks first
    assert "Biscuit" in turns[0]["answer"]
    assert all(t["answer"] and 0 < t["ttft_ms"] <= t["total_ms"] for t in turns)
