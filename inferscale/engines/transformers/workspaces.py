"""Segment workspaces lent to requests, one request per workspace, so that open streams never share K/V buffers.

A :class:`~inferscale.kv.compose.SegmentWorkspace` keeps the system prefix's K/V in reusable buffers; a cache
assembled in it is valid only until the next assembly in the same workspace. A streamed answer keeps its cache
from the call that opens it until its last token, and other requests run in between (the engine locks each forward
pass, not the whole stream), so each request borrows a workspace of its own and gives it back when it ends. Idle
workspaces are kept for reuse (the common case, one request at a time, reuses one and never allocates).
"""

from __future__ import annotations

import threading

from inferscale.kv.compose import PrefixKV, SegmentWorkspace


class WorkspacePool:
    """Workspaces over one system prefix, each lent to one request at a time.

    Args:
        prefix: the system prefix's K/V (post-RoPE) every workspace starts with.
        keep_idle: how many returned workspaces are kept for reuse; more are dropped (their memory freed).
    """

    def __init__(self, prefix: PrefixKV, keep_idle: int = 2) -> None:
        self._prefix = prefix
        self._keep_idle = keep_idle
        self._idle: list[SegmentWorkspace] = []
        self._lock = threading.Lock()

    def borrow(self) -> SegmentWorkspace:
        """An idle workspace, or a new one; the caller owns it until :meth:`give_back`. One that is never given
        back (a stream that was never read) is simply freed with its last reference."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return SegmentWorkspace(self._prefix)

    def give_back(self, workspace: SegmentWorkspace) -> None:
        """Return ``workspace``; no cache assembled in it may be used afterwards."""
        with self._lock:
            if len(self._idle) < self._keep_idle:
                self._idle.append(workspace)
