"""Waiting for a server that is starting: poll ``GET /health`` until it answers 200 (tenacity), for scripts and tests
that start ``inferscale serve`` themselves."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_fixed


class _NotHealthyYet(Exception):
    """``/health`` answered, but not 200 yet."""


def _stderr_tail(process: subprocess.Popen[Any]) -> str:
    """``": "`` and the last 2,000 characters the exited ``process`` wrote to its stderr pipe, or ``""``."""
    if process.stderr is None:
        return ""
    written = process.stderr.read()
    text = written.decode(errors="replace") if isinstance(written, bytes) else written
    return f": {text[-2000:]}" if text else ""


def wait_until_healthy(
    base_url: str,
    *,
    process: subprocess.Popen[Any] | None = None,
    timeout_s: float = 300.0,
    interval_s: float = 0.5,
) -> None:
    """Return once ``{base_url}/health`` answers 200, asking every ``interval_s`` seconds.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:8000"``.
        process: the server's process, when the caller started it: its exit ends the wait at once.
        timeout_s: how long to wait in all (seconds); a starting server loads its models first.
        interval_s: the pause between two requests (seconds).

    Raises:
        ChildProcessError: as soon as ``process`` has exited (with its exit code and, when its stderr is a pipe,
            the end of what it wrote there).
        TimeoutError: when ``timeout_s`` passed without a 200 (naming the last failure).
    """

    def healthy() -> None:
        if process is not None and process.poll() is not None:
            raise ChildProcessError(f"the server exited with {process.returncode}{_stderr_tail(process)}")
        status = httpx.get(f"{base_url}/health", timeout=min(1.0, timeout_s)).status_code
        if status != 200:
            raise _NotHealthyYet(f"/health answered {status}")

    retrying = Retrying(
        retry=retry_if_exception_type((httpx.TransportError, _NotHealthyYet)),
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
    )
    try:
        retrying(healthy)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        raise TimeoutError(f"{base_url} did not answer /health within {timeout_s} s (last: {last!r})") from exc


__all__ = ["wait_until_healthy"]
