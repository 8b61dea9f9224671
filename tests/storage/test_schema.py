"""The versioned schema (inferscale.storage.schema, Alembic): a fresh database is created at the head revision and
equals the models; tables made by the unversioned ``create_all`` of InferScale 0.1 are checked, stamped and keep
their rows; tables that differ, and a revision this code does not know, are a SchemaError before anything changes;
and clients whose first use starts at the same moment on one fresh database all succeed (threads and coroutines;
processes: tests/storage/test_concurrent_writes.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from contextlib import closing
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config
from sqlalchemy import Engine, MetaData, column, inspect, table, text
from sqlalchemy.orm import Session
from store_workers import HEADS, chains, revisions

from inferscale import AsyncMemoryClient, InvalidInputError, MemoryClient, SchemaError
from inferscale.scope import Scope
from inferscale.server.keys import ApiKeyRow, KeyStore, _Base
from inferscale.storage import MemoryStore, make_engine
from inferscale.storage.async_store import AsyncMemoryStore
from inferscale.storage.migrations.baseline import baseline_metadata
from inferscale.storage.models import utc_now
from inferscale.storage.schema import MEMORY_SCHEMA, MIGRATION_LOCK, SchemaChain, alembic_config, ensure_schema

ALICE = Scope(user_id="alice")


def diffs(engine: Engine, chain: SchemaChain, metadata: MetaData) -> list[object]:
    """Alembic's differences between the database's tables of ``chain`` and ``metadata`` (``[]``: equal)."""
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_name": lambda name, kind, _: kind != "table" or name in metadata.tables}
        )
        return list(compare_metadata(context, metadata))


def test_a_fresh_database_is_created_at_the_head_and_equals_the_models(db_url: str) -> None:
    with MemoryStore(db_url) as store, closing(KeyStore(db_url)) as keys:
        store.add("I like tea", ALICE)
        assert keys.list() == []
    engine = make_engine(db_url)
    assert revisions(engine) == HEADS
    for chain, metadata in chains():
        assert diffs(engine, chain, metadata) == [], chain.name
    again = ensure_schema(engine, MEMORY_SCHEMA)
    assert (again.before, again.after, again.stamped) == ("0005_kv_store_id", "0005_kv_store_id", False)
    engine.dispose()


def test_tables_made_before_versioning_are_stamped_and_keep_their_rows(db_url: str) -> None:
    """A database as InferScale 0.1 left it: every table from ``create_all``, rows in them, no version table."""
    engine = make_engine(db_url)
    baseline = baseline_metadata()
    baseline.create_all(engine)  # the memory tables as 0.1 made them (the models have moved on)
    _Base.metadata.create_all(engine)
    now = utc_now()
    with Session(engine) as s, s.begin():
        # written as 0.1 wrote them: into its columns (the model has columns of later revisions)
        row = dict(id="m-1", text="I like tea", hash="h" * 64, user_id="alice", metadata={}, context=[])
        s.execute(baseline.tables["memories"].insert().values(**row, created_at=now, updated_at=now))
        history = dict(memory_id="m-1", event="ADD", new_text="I like tea", created_at=now)
        s.execute(baseline.tables["memory_history"].insert().values(**history))
        s.add(ApiKeyRow(key_id="a" * 12, name="old", salt=bytes(16), secret_hash=bytes(64), admin=True, created_at=now))
    assert revisions(engine) == {}
    with MemoryStore(db_url) as store, closing(KeyStore(db_url)) as keys:
        assert [m.text for m in store.list(ALICE)] == ["I like tea"]
        assert [(h.event, h.scope) for h in store.history("m-1", ALICE)] == [("ADD", ALICE)]
        store.add("I like coffee", ALICE)
        assert [k.key_id for k in keys.list()] == ["a" * 12]
    assert revisions(engine) == HEADS
    engine.dispose()


def test_tables_made_before_versioning_that_differ_are_refused(db_url: str) -> None:
    """A ``memories`` table of another shape (three columns, no history table) cannot be stamped: SchemaError naming
    the differences, and the database stays as it was (no version table, no new table)."""
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("create table memories (pk integer primary key, id varchar(36) not null, text text)"))
    with MemoryStore(db_url) as store, pytest.raises(SchemaError, match="missing tables: kv_entries, memory_history"):
        store.list(ALICE)
    assert revisions(engine) == {}
    assert sorted(inspect(engine).get_table_names()) == ["memories"]
    engine.dispose()


def test_a_revision_this_code_does_not_know_is_a_schema_error(db_url: str) -> None:
    """A database that a newer InferScale upgraded: every store refuses it with SchemaError on first use."""
    with MemoryStore(db_url) as store, closing(KeyStore(db_url)) as keys:
        store.add("I like tea", ALICE)
        keys.list()
    engine = make_engine(db_url)
    with engine.begin() as conn:
        for chain, _ in chains():
            conn.execute(text(f"update {chain.version_table} set version_num = '9999_from_a_newer_inferscale'"))
    with MemoryStore(db_url) as store, pytest.raises(SchemaError, match="9999_from_a_newer_inferscale"):
        store.list(ALICE)
    with closing(KeyStore(db_url)) as keys, pytest.raises(SchemaError, match="newer InferScale"):
        keys.list()

    async def first_async_read() -> None:
        store = AsyncMemoryStore(db_url)
        try:
            await store.list(ALICE)
        finally:
            await store.close()

    with pytest.raises(SchemaError, match="9999_from_a_newer_inferscale"):
        asyncio.run(first_async_read())
    engine.dispose()


def _from_head_down_to(engine: Engine, revision: str) -> None:
    """Check that the memory store's schema is at its head, then downgrade it to ``revision``."""
    version = MEMORY_SCHEMA.version_table
    assert revisions(engine)[version] == HEADS[version]
    with MIGRATION_LOCK, engine.begin() as conn:
        command.downgrade(alembic_config(MEMORY_SCHEMA, conn), revision)


WHEN = ("created_at", "updated_at")

LEGACY_SCOPES = {
    "m-user-agent": Scope(user_id="alice", agent_id="travel"),
    "m-agent": Scope(agent_id="travel"),
    "m-run": Scope(run_id="r1"),
}
"""Live memories whose history rows were written before revision 0004 (no scope recorded), by id."""


def test_history_rows_written_without_a_scope_take_their_live_memorys(db_url: str) -> None:
    """A database at revision 0003 holding the history of live memories (user + agent, agent only, run only) and of
    one deleted before the upgrade; the upgrade rewrites no row. Each live memory's rows take its scope, so the ids
    that find it read them (and those of a row an older process writes after the upgrade); the deleted one's scope
    is unknown, so its rows are read without ids only, never under anyone's. Down to 0003 and up again keeps every
    row."""
    engine = make_engine(db_url)
    with MIGRATION_LOCK, engine.begin() as conn:
        command.upgrade(alembic_config(MEMORY_SCHEMA, conn), "0003_chain_from")
    columns = ("id", "text", "hash", "user_id", "agent_id", "run_id", "metadata", "context", *WHEN)
    memories = table("memories", *(column(c) for c in columns))
    history = table(
        "memory_history", *(column(c) for c in ("memory_id", "event", "new_text", "old_text", "created_at"))
    )
    now = utc_now()
    with engine.begin() as conn:
        for memory_id, scope in LEGACY_SCOPES.items():
            row = dict(id=memory_id, text=memory_id, hash="h" * 64, metadata="{}", context="[]", **scope.as_dict())
            conn.execute(memories.insert().values(**row, created_at=now, updated_at=now))
            conn.execute(history.insert().values(memory_id=memory_id, event="ADD", new_text=memory_id, created_at=now))
        conn.execute(history.insert().values(memory_id="m-gone", event="ADD", new_text="coffee", created_at=now))
        conn.execute(history.insert().values(memory_id="m-gone", event="DELETE", old_text="coffee", created_at=now))
    queries = [Scope(user_id="alice"), Scope(agent_id="travel"), Scope(run_id="r1"), Scope(user_id="bob")]
    with MemoryStore(db_url) as store:
        for memory_id, scope in LEGACY_SCOPES.items():
            assert [(h.event, h.scope) for h in store.history(memory_id)] == [("ADD", scope)]
            for query in queries:
                sees = all(getattr(scope, k) == v for k, v in query.as_dict().items())
                assert [h.event for h in store.history(memory_id, query)] == (["ADD"] if sees else []), query
        assert [(h.event, h.scope) for h in store.history("m-gone")] == [("ADD", None), ("DELETE", None)]
        assert [store.history("m-gone", query) for query in queries] == [[], [], [], []]
    with engine.begin() as conn:  # an older InferScale, still running, records no scope
        conn.execute(history.insert().values(memory_id="m-run", event="UPDATE", new_text="x", created_at=now))
    with MemoryStore(db_url) as store:
        assert [(h.event, h.scope) for h in store.history("m-run", Scope(run_id="r1"))] == [
            ("ADD", LEGACY_SCOPES["m-run"]),
            ("UPDATE", LEGACY_SCOPES["m-run"]),
        ]
        # deleted after the upgrade: its rows of no scope took the live memory's, which the deletion records in them
        # first (a scoped read gave the DELETE row alone)
        store.delete("m-agent")
        store.delete_scope(Scope(user_id="alice"))
        for memory_id in ("m-agent", "m-user-agent"):
            scope = LEGACY_SCOPES[memory_id]
            assert [(h.event, h.scope) for h in store.history(memory_id, Scope(agent_id="travel"))] == [
                ("ADD", scope),
                ("DELETE", scope),
            ]
        assert store.history("m-agent", Scope(user_id="alice")) == []
    _from_head_down_to(engine, "0003_chain_from")
    assert "user_id" not in {c["name"] for c in inspect(engine).get_columns("memory_history")}
    with MemoryStore(db_url) as store:
        assert [h.event for h in store.history("m-gone")] == ["ADD", "DELETE"]
        assert [h.event for h in store.history("m-run", Scope(run_id="r1"))] == ["ADD", "UPDATE"]
        # the downgrade dropped the scopes recorded for deleted memories with their columns
        assert [h.event for h in store.history("m-agent")] == ["ADD", "DELETE"]
    assert revisions(engine)[MEMORY_SCHEMA.version_table] == HEADS[MEMORY_SCHEMA.version_table]
    engine.dispose()


def test_k_v_rows_written_before_folders_had_ids_keep_their_place(db_url: str) -> None:
    """A database at revision 0004 holding a K/V row: the upgrade rewrites no row, the row reads with no folder id
    (reconciliation then judges it by its location), a new write records one, and down to 0004 and up again keeps
    the row."""
    engine = make_engine(db_url)
    with MIGRATION_LOCK, engine.begin() as conn:
        command.upgrade(alembic_config(MEMORY_SCHEMA, conn), "0004_history_scope")
    columns = ("id", "text", "hash", "metadata", "context", *WHEN)
    kv_columns = ("memory_id", "text_hash", "fingerprint", "encoding_key", "n_tokens", "nbytes", "location")
    now = utc_now()
    with engine.begin() as conn:
        memory = dict(id="m1", text="tea", hash="h" * 64, metadata="{}", context="[]", created_at=now, updated_at=now)
        conn.execute(table("memories", *(column(c) for c in columns)).insert().values(**memory))
        row = dict(memory_id="m1", text_hash="h" * 64, fingerprint="fp", encoding_key="k", n_tokens=3, nbytes=9)
        kv = table("kv_entries", *(column(c) for c in (*kv_columns, "created_at")))
        conn.execute(kv.insert().values(**row, location="/kv/m1/a.safetensors", created_at=now))
    with MemoryStore(db_url) as store:
        (old,) = store.all_kv_entries()
        assert (old.memory_id, old.location, old.store_id) == ("m1", "/kv/m1/a.safetensors", None)
        new = store.put_kv_entry("m1", "h" * 64, "fp", "k2", 3, 9, "/kv/m1/b.safetensors", store_id="f" * 32)
        assert new.store_id == "f" * 32
        with pytest.raises(InvalidInputError, match="store_id is 33 characters"):
            store.put_kv_entry("m1", "h" * 64, "fp", "k3", 3, 9, "/kv/m1/c.safetensors", store_id="f" * 33)
    _from_head_down_to(engine, "0004_history_scope")
    assert "store_id" not in {c["name"] for c in inspect(engine).get_columns("kv_entries")}
    with MemoryStore(db_url) as store:
        assert sorted((r.encoding_key, r.store_id) for r in store.all_kv_entries()) == [("k", None), ("k2", None)]
    engine.dispose()


FIRST_USERS = 4


def test_clients_whose_first_add_starts_at_once_all_succeed(db_url: str, tmp_path: Path) -> None:
    """Four sync clients, each in its own thread, add at the same moment on a fresh database. Before the schema was
    created under a lock on PostgreSQL too, 3 of the 4 raised IntegrityError from CREATE TABLE in 10 of 10 tries."""
    clients = [
        MemoryClient(fake_config(tmp_path / str(i), db_url), embedder=HashEmbedder(), generator=ScriptedGenerator())
        for i in range(FIRST_USERS)
    ]
    barrier = threading.Barrier(FIRST_USERS)
    errors: list[BaseException] = []

    def first_add(i: int) -> None:
        barrier.wait()
        try:
            clients[i].add(f"client {i} was here", user_id="alice", infer=False)
        except BaseException as exc:  # reported below; a thread cannot raise into the test
            errors.append(exc)

    threads = [threading.Thread(target=first_add, args=(i,)) for i in range(FIRST_USERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    stored = clients[0].get_all(user_id="alice")["results"]
    assert sorted(m["memory"] for m in stored) == [f"client {i} was here" for i in range(FIRST_USERS)]
    for client in clients:
        client.close()


def test_async_clients_whose_first_add_starts_at_once_all_succeed(db_url: str, tmp_path: Path) -> None:
    """Four async clients on one event loop, gathered: their schema upgrades take turns without blocking the loop."""

    async def main() -> list[str]:
        clients = [AsyncMemoryClient(fake_config(tmp_path / str(i), db_url), embedder=HashEmbedder()) for i in range(4)]
        try:
            await asyncio.gather(
                *(c.add(f"client {i} was here", user_id="alice", infer=False) for i, c in enumerate(clients))
            )
            return sorted(m["memory"] for m in (await clients[0].get_all(user_id="alice"))["results"])
        finally:
            for client in clients:
                await client.close()

    assert asyncio.run(main()) == [f"client {i} was here" for i in range(4)]
