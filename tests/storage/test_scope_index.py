"""The read every scoped search starts with (the scope's vector ids, public ids and text hashes, by vector id) is
served by an index alone, on a table of many users: a user's rows lie spread over the table, so reading them from
it would cost a page each (revision 0002_user_scope_index)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from inferscale.scope import Scope
from inferscale.storage import MemoryStore
from inferscale.storage.queries import select_versions


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
