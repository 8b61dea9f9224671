"""docs/server.md's quick start, run as written: its shell block (``inferscale keys create``, then ``inferscale
serve`` as a child process), then its Python block with the printed key, whose output must be the one the page
shows (the answer's wording aside: it must name the dog). Only the data folder (a temporary one) and the port (a
free one) change."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_harness import free_port

from inferscale.remote.health import wait_until_healthy

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
DOC_PORT = "8000"
DOC_DATA_DIR = "./inferscale-data"


def quick_start_blocks() -> list[tuple[str, str]]:
    """The fenced code blocks of the quick start section, as ``(language, text)``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [(lang, body) for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)]


def command(line: str, data_dir: Path, port: str) -> list[str]:
    """A documented ``inferscale ...`` line as this interpreter's argv, on the test's folder and port."""
    argv = shlex.split(line)
    assert argv[0] == "inferscale", line
    argv = [str(data_dir) if a == DOC_DATA_DIR else port if a == DOC_PORT else a for a in argv[1:]]
    return [sys.executable, "-m", "inferscale.cli", *argv]


def _child(code: str, *argv: str) -> subprocess.Popen[str]:
    """A Python child process running ``code`` with ``argv``."""
    return subprocess.Popen([sys.executable, "-c", code, *argv], text=True)


HEALTH_SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_wait_until_healthy_returns_once_health_answers_200() -> None:
    port = str(free_port())
    server = _child(HEALTH_SERVER, port)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process=server, timeout_s=30)
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_wait_until_healthy_fails_at_once_when_the_server_exited() -> None:
    server = _child("raise SystemExit(3)")
    server.wait(timeout=10)
    started = time.monotonic()
    with pytest.raises(ChildProcessError, match="exited with 3"):
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", process=server, timeout_s=30)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("text", [True, False])
def test_wait_until_healthy_says_what_the_exited_server_wrote_to_stderr(text: bool) -> None:
    code = "import sys; sys.stderr.write('no model found:'); raise SystemExit(4)"
    server = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=text)
    server.wait(timeout=10)
    with pytest.raises(ChildProcessError) as exited:
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", process=server, timeout_s=30)
    assert str(exited.value) == "the server exited with 4: no model found:"


def test_wait_until_healthy_fails_when_the_deadline_passes() -> None:
    server = _child("import time; time.sleep(30)")  # alive, but nothing listens on the port
    try:
        with pytest.raises(TimeoutError, match=r"did not answer /health within 1\.0 s \(last: ConnectError"):
            wait_until_healthy(f"http://127.0.0.1:{free_port()}", process=server, timeout_s=1.0)
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_the_page_has_the_three_blocks() -> None:
    assert [lang for lang, _ in quick_start_blocks()] == ["bash", "python", ""]


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    (_, shell), (_, python), (_, expected) = quick_start_blocks()
    keys_line, serve_line = [line for line in shell.splitlines() if line.strip()]
    port = str(free_port())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    created = subprocess.run(
        command(keys_line, tmp_path, port), capture_output=True, text=True, check=True, env=env, cwd=tmp_path
    )
    key = re.search(r"isk_\S+", created.stdout)
    assert key is not None, created.stdout

    server = subprocess.Popen(
        command(serve_line, tmp_path, port),
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process=server)
        source = python.replace('"isk_..."', repr(key.group(0))).replace(f":{DOC_PORT}", f":{port}")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, str(DOC), "exec"), {})  # the page's block, unchanged but for key and port
    finally:
        server.terminate()
        server.wait(timeout=60)
    memory, answer, refused = printed.getvalue().splitlines()
    doc_memory, _, doc_refused = expected.strip().splitlines()
    assert (memory, refused) == (doc_memory, doc_refused)
    assert "Biscuit" in answer  # the memory reached the model through the server
