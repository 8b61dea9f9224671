"""``inferscale serve`` stops within its shutdown grace while a stream is running: it stopped only when the stream
ended (155 s after SIGTERM for a 3,000-token answer, in a user's test), so a process manager's SIGTERM was followed
by its SIGKILL and the memory client was never closed. And while memories wait for the background K/V encoder: it
drained its whole queue first (67.6 s after SIGTERM with ``--shutdown-grace 8`` and 69 memories, a tester's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_harness import free_port

from inferscale import MemoryClient, MemoryConfig
from inferscale.remote.health import wait_until_healthy

pytestmark = pytest.mark.slow

GRACE_S = 1
LONG_ANSWER = "Write a very long story about a dragon, with many chapters."
"""Greedy SmolLM2 answers this with about 3,000 tokens: the stream outlives the grace by minutes."""


def _serve(data_dir: Path) -> tuple[str, subprocess.Popen[str]]:
    """``inferscale serve`` on a free port and ``data_dir`` with a grace of :data:`GRACE_S`, offline, its stderr
    piped: the port and the process."""
    port = str(free_port())
    argv = ["serve", "--port", port, "--data-dir", str(data_dir), "--shutdown-grace", str(GRACE_S)]
    server = subprocess.Popen(
        [sys.executable, "-m", "inferscale.serve_cli", *argv],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return port, server


def test_sigterm_cancels_a_running_stream_after_the_grace_and_closes_the_client(tmp_path: Path) -> None:
    port, server = _serve(tmp_path)
    lines: list[str] = []
    errors: list[Exception] = []

    def read_stream() -> None:
        body = {"model": "m", "stream": True, "max_tokens": 4000, "temperature": 0, "user": "u1"}
        body["messages"] = [{"role": "user", "content": LONG_ANSWER}]
        try:
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300) as r:
                lines.extend(r.iter_lines())
        except httpx.HTTPError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read_stream, daemon=True)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process=server)
        reader.start()
        deadline = time.monotonic() + 120
        while len(lines) < 20 and time.monotonic() < deadline:  # the answer is being streamed
            time.sleep(0.2)
        assert len(lines) >= 20 and reader.is_alive()
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=GRACE_S + 30)  # the whole answer takes minutes
        stopped_after = time.monotonic() - sent
    finally:
        if server.poll() is None:
            server.kill()
        stderr = server.communicate()[1]
    reader.join(timeout=10)
    assert stopped_after >= GRACE_S, stopped_after  # the grace was given
    assert "data: [DONE]" not in lines and errors, (lines[-3:], errors)  # cut, not finished
    assert "timeout graceful shutdown exceeded" in stderr
    assert "Application shutdown complete" in stderr  # the lifespan ran: the memory client was closed


N_MEMORIES = 60
"""Memories added in one request right before SIGTERM: SmolLM2 on CPU (the server's device) encodes them for far
longer than the grace (69 took about a minute in the tester's run)."""


def test_sigterm_stops_the_background_encoder_within_the_grace_and_loses_no_memory(tmp_path: Path) -> None:
    port, server = _serve(tmp_path)
    messages = [
        {"role": "user", "content": f"Fact {i}: locker {i} holds my spare key number {i * 7}."}
        for i in range(N_MEMORIES)
    ]
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process=server)
        body = {"messages": messages, "user_id": "u1", "infer": False}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/memories/", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["results"]) == N_MEMORIES
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=GRACE_S + 120)  # a hang guard; before the fix it ran until every memory was encoded
    finally:
        if server.poll() is None:
            server.kill()
        stderr = server.communicate()[1]
    (line,) = [line for line in stderr.splitlines() if "memories were not encoded" in line]
    left = int(line.split("the K/V of ")[1].split(" memories")[0])
    assert 0 < left <= N_MEMORIES, line
    assert "inferscale prepare-kv" in line  # the encoder was stopped, not drained (the bounded close itself:
    # tests/api/test_background_encoding.py, counted, not timed)
    assert "Application shutdown complete" in stderr
    with MemoryClient(MemoryConfig(data_dir=str(tmp_path))) as reopened:
        stored = reopened.get_all(user_id="u1", limit=1000)["results"]
    assert sorted(m["memory"] for m in stored) == sorted(m["content"] for m in messages)  # every memory kept
