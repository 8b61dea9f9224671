"""The read every scoped search starts with (the scope's vector ids, public ids and text hashes, by vector id) is
served by an index alone, on a table of many users: a user's rows lie spread over the table, so reading them from
it would cost a page each (revision 0002_user_scope_index)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from inferscale.scope import Scope
from inferscale.storage import MemoryStore
from inferscale.storage.queries import select_latest, select_versions


def test_a_users_scope_is_read_from_the_covering_index_alone(tmp_path: Path) -> None:
    with MemoryStore(f"sqlite:///{tmp_path / 'memory.db'}") as store:
        for i in range(60):
            store.add(f"fact {i}", Scope(user_id=f"u{i % 6}"))
        stmt = select_versions(Scope(user_id="u2"), None, "sqlite")
        compiled = str(stmt.compile(store.engine, compile_kwargs={"literal_binds": True}))
        with store.engine.connect() as conn:
            plan = " | ".join(row[-1] for row in conn.execute(text(f"EXPLAIN QUERY PLAN {compiled}")))
            ids = conn.execute(stmt).all()
        assert plan == "SEARCH memories USING COVERING INDEX ix_memories_user_scope (user_id=?)"  # no sort, no table
        assert [row[0] for row in ids] == sorted(r.vector_id for r in store.list(Scope(user_id="u2")))
        assert len(ids) == 10


def test_the_latest_memories_of_a_scope_are_read_without_sorting_the_scope(tmp_path: Path) -> None:
    """``add``'s read of the scope's last memories (a new memory's context turns) sorted the whole scope by
    ``created_at``: 32 ms per add at 5,000 memories on SQLite (a review). It walks the user's index backwards by
    ``pk``, the order the rows were stored in, also when a clock set back gave a later row an older time."""
    with MemoryStore(f"sqlite:///{tmp_path / 'memory.db'}") as store:
        for i in range(60):
            store.add(f"fact {i}", Scope(user_id=f"u{i % 6}"))
        store.add("an agent's own", Scope(user_id="u2", agent_id="a"))  # not of exactly u2's scope
        with store.engine.begin() as conn:  # the clock was set back for the last one u2 stored
            conn.execute(text("UPDATE memories SET created_at = '2001-01-01 00:00:00' WHERE text = 'fact 56'"))
        stmt = select_latest(Scope(user_id="u2"), 3)
        compiled = str(stmt.compile(store.engine, compile_kwargs={"literal_binds": True}))
        with store.engine.connect() as conn:
            plan = " | ".join(row[-1] for row in conn.execute(text(f"EXPLAIN QUERY PLAN {compiled}")))
        assert plan == "SEARCH memories USING INDEX ix_memories_user_scope (user_id=?)"  # no TEMP B-TREE: no sort
        assert [m.text for m in store.latest(Scope(user_id="u2"), 3)] == ["fact 44", "fact 50", "fact 56"]
