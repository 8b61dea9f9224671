"""A Mem0 quickstart that runs on InferScale. The only line that differs from the Mem0 version is the import:

    from mem0 import Memory          # before
    from inferscale import Memory    # after

It calls the API in both of Mem0's shapes. In v1, ids are keyword arguments and the count is ``limit=``. In v2,
ids go inside ``filters={...}`` and the count is ``top_k=``. The config is in Mem0's shape too. Run it with
``.venv/bin/python examples/migrate_from_mem0.py``. The embedded SmolLM2 extracts the facts on CPU, so expect
seconds per ``add``.
"""

from __future__ import annotations

import tempfile
from typing import Any

from inferscale import Memory


def quickstart(m: Memory) -> dict[str, Any]:
    """The quickstart calls, in Mem0's v1 and v2 shapes. Returns what each step printed, for tests."""
    seen: dict[str, Any] = {}
    messages = [
        {"role": "user", "content": "Can you suggest a board game for Friday night?"},
        {"role": "assistant", "content": "How about a long strategy game like Twilight Imperium?"},
        {"role": "user", "content": "Long games bore me, but I love quick card games."},
    ]
    added = m.add(messages, user_id="alice", metadata={"category": "games"})
    seen["added"] = added["results"]

    # v1: scope ids as keyword arguments, `limit`.
    related = m.search("What games does Alice like?", user_id="alice", limit=3)
    seen["v1_search"] = related["results"]
    seen["v1_all"] = m.get_all(user_id="alice")["results"]

    # v2: scope ids inside `filters`, `top_k`, operators on metadata.
    related = m.search(
        "What games does Alice like?",
        filters={"AND": [{"user_id": "alice"}, {"category": {"in": ["games", "hobbies"]}}]},
        top_k=3,
    )
    seen["v2_search"] = related["results"]
    seen["v2_all"] = m.get_all(filters={"user_id": "alice"})["results"]

    if seen["v1_all"]:
        memory_id = seen["v1_all"][0]["id"]
        m.update(memory_id=memory_id, data="Loves quick card games, dislikes long strategy games")
        seen["history"] = m.history(memory_id=memory_id)
        m.delete(memory_id=memory_id)
    seen["deleted_all"] = m.delete_all(user_id="alice")
    m.reset()
    return seen


def main() -> None:
    folder = tempfile.mkdtemp(prefix="inferscale-mem0-")
    config = {
        "vector_store": {"provider": "faiss", "config": {"path": f"{folder}/faiss", "collection_name": "quickstart"}},
        "history_db_path": f"{folder}/history.db",
    }
    m = Memory.from_config(config)
    seen = quickstart(m)
    for step, value in seen.items():
        print(f"{step}: {value}")
    m.close()


if __name__ == "__main__":
    main()
