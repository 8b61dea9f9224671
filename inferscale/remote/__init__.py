"""The memory API on an InferScale server: :class:`RemoteMemoryClient` and :class:`AsyncRemoteMemoryClient`.

``MemoryClient(host="http://...", api_key="isk_...")`` and ``AsyncMemoryClient(host=..., api_key=...)`` return
them: the local clients' methods, arguments, results and exception types, sent over httpx. A Mem0 platform user
changes only the import and the host.

Modules, one job each: :mod:`~inferscale.remote.calls` (the memory calls as HTTP requests, no I/O),
:mod:`~inferscale.remote.chat` (the chat request, and results and chunks rebuilt from its reply or stream, no I/O),
:mod:`~inferscale.remote.errors` (replies to results and exceptions, no I/O), :mod:`~inferscale.remote.retry` (what is
retried, and the backoff), :mod:`~inferscale.remote.transport` (httpx and httpx-sse, sync and async),
:mod:`~inferscale.remote.health` (waiting for a starting server), and the two clients, thin shells over them.
"""

from inferscale.remote.async_client import AsyncRemoteMemoryClient
from inferscale.remote.sync_client import RemoteMemoryClient
from inferscale.remote.transport import API_KEY_ENV, DEFAULT_RETRIES, DEFAULT_TIMEOUT_S

__all__ = ["API_KEY_ENV", "DEFAULT_RETRIES", "DEFAULT_TIMEOUT_S", "AsyncRemoteMemoryClient", "RemoteMemoryClient"]
