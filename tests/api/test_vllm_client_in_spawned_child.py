"""A script that builds a vLLM client in its top-level code, without ``if __name__ == "__main__":``, ran that code
again in every process vLLM spawned (on CPU vLLM spawns its engine): each child added the script's memories once more
to the user's database before vLLM failed with multiprocessing's bootstrapping error. The client now refuses to be
built in such a re-import, with the fix in the message. No vLLM is needed: building the client does no I/O, and a
plain spawned process re-imports the main module as vLLM's do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import multiprocessing
from inferscale import MemoryClient

client = MemoryClient({"engine": {"provider": "vllm"}, "data_dir": DATA_DIR})  # top level, as in a quick script
print("built in", multiprocessing.current_process().name, flush=True)


def work() -> None:
    pass


process = multiprocessing.get_context("spawn").Process(target=work)
process.start()
process.join()
print("child exit code", process.exitcode, flush=True)
"""


def test_a_vllm_client_built_by_a_spawned_childs_re_import_of_main_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(f"DATA_DIR = {str(tmp_path / 'data')!r}\n" + SCRIPT, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.splitlines() == ["built in MainProcess", "child exit code 1"], done.stderr[-2000:]
    assert 'put the code that builds the client and uses it under `if __name__ == "__main__":`' in done.stderr
