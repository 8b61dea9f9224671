"""Atomic file writes whose temporary files name their writer, and the sweep of those a dead writer left.

A file is written to ``.<name>.<host>-<pid>.<random>.tmp`` in its own folder, flushed (and fsynced), then renamed
over ``<name>``: a reader sees the old file, the new one or none, never a partial one. A crash between the write and
the rename leaves the temporary file; its name says which process wrote it, so :func:`sweep_temp_files` removes it
once that process is gone, and leaves alone those of live writers (another process of the same store may be
writing right now).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import BinaryIO

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

TEMP_SUFFIX = ".tmp"

log = logging.getLogger(__name__)

TEMP_MAX_AGE_S = 3600.0
"""A temporary file older than this (seconds) is removed whoever wrote it; a writer renames within milliseconds."""

TEMP_MIN_AGE_S = 60.0
"""A temporary file younger than this (seconds) is kept even when its writer looks dead: containers sharing a host
name but not a pid namespace see each other's writers as gone."""

HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This machine, as temporary file names record it (8 hex characters of a digest of the host name)."""

_TEMP_NAME = re.compile(r"\..+\.(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]+)\.[0-9a-f]+\.tmp")


def temp_path(target: Path) -> Path:
    """A fresh temporary path beside ``target`` that names this process: ``.<name>.<host>-<pid>.<random>.tmp``."""
    return target.with_name(f".{target.name}.{HOST_TAG}-{os.getpid()}.{uuid.uuid4().hex}{TEMP_SUFFIX}")


def _write_all(out: BinaryIO, data: bytes | memoryview, fsync: bool) -> None:
    out.write(data)
    out.flush()
    if fsync:
        os.fsync(out.fileno())


def _write_file(path: Path, data: bytes | memoryview, fsync: bool) -> None:
    with open(path, "wb") as out:
        _write_all(out, data, fsync)


def atomic_write(target: Path, data: bytes | memoryview, fsync: bool = True) -> None:
    """Write ``data`` to ``target`` through :func:`temp_path` and ``os.replace`` (the folder must exist).

    Args:
        target: the final file.
        data: its whole content.
        fsync: fsync the temporary file before the rename (durable across power loss; a few ms).

    Raises:
        OSError: when the file cannot be written; nothing partial is left under ``target``, and the temporary file
            is removed.
    """
    tmp = temp_path(target)
    try:
        _write_file(tmp, data, fsync)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def create_once(target: Path, data: bytes, fsync: bool = True) -> bytes:
    """Write ``data`` to ``target`` unless ``target`` exists, and return what ``target`` holds then: ``data``, or the
    content another writer put there first (the folder must exist).

    The file is written in full to :func:`temp_path` and hard-linked to ``target``, which fails when ``target``
    exists, so of several writers racing (threads, processes, hosts on a shared file system) exactly one wins and
    every reader sees that writer's whole content, never a partial or a replaced one. On a file system without
    hard links, ``target`` is created exclusively and written in place instead (a racing reader waits out the
    instant between its creation and its write).

    Raises:
        OSError: when the file cannot be written or read; nothing partial is left under ``target``.
    """
    tmp = temp_path(target)
    try:
        _write_file(tmp, data, fsync)
        try:
            os.link(tmp, target)
        except FileExistsError:
            return target.read_bytes()
        except OSError:  # no hard links here (some FUSE or FAT file systems): an exclusive create instead
            try:
                _write_file_exclusive(target, data, fsync)
            except FileExistsError:
                return _read_once_written(target)
        return data
    finally:
        tmp.unlink(missing_ok=True)


def _read_once_written(path: Path) -> bytes:
    """The content of ``path``, created exclusively by another writer, once that writer has written it: read again
    for up to a second while it is empty (the instant between its create and its write)."""
    reading = Retrying(
        retry=retry_if_result(lambda content: not content),
        stop=stop_after_delay(1.0),
        wait=wait_fixed(0.002),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome is not None else b"",
    )
    return bytes(reading(path.read_bytes))


def _write_file_exclusive(path: Path, data: bytes, fsync: bool) -> None:
    """Create ``path`` (``FileExistsError`` when it exists) and write ``data`` to it; a failed write removes it."""
    with open(path, "xb") as out:
        try:
            _write_all(out, data, fsync)
        except BaseException:
            path.unlink(missing_ok=True)
            raise


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (a zombie counts as alive until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def left_over(path: Path, now: float, max_age_s: float = TEMP_MAX_AGE_S, min_age_s: float | None = None) -> bool:
    """Whether the temporary file ``path`` is left over: older than ``min_age_s`` seconds (default
    :data:`TEMP_MIN_AGE_S`, read at each call) and written by a process of this machine that is gone (as its name
    says), or older than ``max_age_s`` seconds (another machine's, or a name without its writer)."""
    try:
        age = now - path.stat().st_mtime
    except FileNotFoundError:
        return False
    if age > max_age_s:
        return True
    if age < (TEMP_MIN_AGE_S if min_age_s is None else min_age_s):
        return False
    match = _TEMP_NAME.fullmatch(path.name)
    return match is not None and match["host"] == HOST_TAG and not _alive(int(match["pid"]))


def sweep_temp_files(folder: Path, pattern: str, max_age_s: float = TEMP_MAX_AGE_S) -> int:
    """Remove the temporary files under ``folder`` matching the glob ``pattern`` (e.g. ``"*/.*.tmp"``) that
    :func:`left_over` says are left over; returns how many were removed. Safe while other processes write. One that
    cannot be removed (a read-only folder) is left for a later sweep: it is never read."""
    if not folder.is_dir():
        return 0
    now = time.time()
    removed = 0
    for path in folder.glob(pattern):
        if path.name.endswith(TEMP_SUFFIX) and left_over(path, now, max_age_s):
            try:
                path.unlink()
            except FileNotFoundError:  # removed meanwhile
                continue
            except OSError as exc:
                log.debug("could not remove the temporary file %s: %s", path, exc)
                continue
            removed += 1
    return removed


__all__ = [
    "HOST_TAG",
    "TEMP_MAX_AGE_S",
    "TEMP_MIN_AGE_S",
    "TEMP_SUFFIX",
    "atomic_write",
    "create_once",
    "left_over",
    "sweep_temp_files",
    "temp_path",
]
