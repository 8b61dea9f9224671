"""Which memory ids a URL path can carry: the one rule the HTTP server and the remote clients share.

Memory ids are UUIDs (:mod:`inferscale.storage.changes`). The server routes on the decoded path, where an escaped
``/`` is a separator again, and ``/v1/memories/search/`` is another route: neither kind of id can name a memory, so
the server refuses a reserved word as a method that route does not answer, and the remote clients answer both as
an unknown id without sending them.
"""

from __future__ import annotations

RESERVED_MEMORY_IDS = frozenset({"search"})
"""Path words of other routes under ``/v1/memories/``, never memory ids."""


def routable(memory_id: str) -> bool:
    """Whether ``/v1/memories/{memory_id}/`` reaches the id-addressed routes with ``memory_id`` as the id: not for
    an id holding a ``/`` (``"<id>/history"`` would reach that memory's history) or for a path word of another
    route (:data:`RESERVED_MEMORY_IDS`)."""
    return "/" not in memory_id and memory_id not in RESERVED_MEMORY_IDS


__all__ = ["RESERVED_MEMORY_IDS", "routable"]
