"""MemoryStore against SQLite (a temporary file) and a real PostgreSQL server (a fresh schema per test)."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferscale.errors import ConfigError, InvalidInputError, MemoryNotFoundError, ScopeError
from inferscale.scope import Scope
from inferscale.storage import ChangeSet, MemoryRecord, MemoryStore, MemoryUpdate, hash_text, make_engine
from inferscale.storage.kv_entries import MemoryChangedError

ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")


@pytest.fixture
def store(db_url: str) -> Iterator[MemoryStore]:
    """A store on each backend (SQLite file, fresh PostgreSQL schema; see ``db_url`` in conftest.py)."""
    store = MemoryStore(db_url)
    yield store
    store.close()


def _snapshot(store: MemoryStore) -> tuple[list[MemoryRecord], dict[str, list[Any]]]:
    memories = store.all_memories()
    return memories, {m.id: store.history(m.id) for m in memories}


# ---- construction and engine ---------------------------------------------------------------------------------


def test_constructor_does_no_io(tmp_path: Path) -> None:
    folder = tmp_path / "not" / "yet"
    store = MemoryStore(f"sqlite:///{folder}/memory.db")
    assert not folder.exists()
    assert store.list(ALICE) == []
    assert (folder / "memory.db").exists()
    store.close()


def test_bad_url_fails_on_first_use_with_config_error() -> None:
    store = MemoryStore("nosuchdialect://x/y")  # no I/O, so no error yet
    with pytest.raises(ConfigError, match="nosuchdialect"):
        store.list(ALICE)
    with pytest.raises(ConfigError):
        MemoryStore("")


def test_sqlite_engine_pragmas(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/a/b/pragmas.db")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
        assert (tmp_path / "a" / "b" / "pragmas.db").exists()
    finally:
        engine.dispose()


def test_in_memory_sqlite_is_shared_across_threads() -> None:
    store = MemoryStore("sqlite://")
    record = store.add("in memory", ALICE)
    seen: list[MemoryRecord | None] = []
    worker = threading.Thread(target=lambda: seen.append(store.get(record.id)))
    worker.start()
    worker.join()
    assert seen == [record]
    store.close()


def test_sqlite_data_survives_reopen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/memory.db"
    first = MemoryStore(url)
    record = first.add("persisted fact", ALICE, {"n": 1})
    first.close()
    second = MemoryStore(url)
    assert second.get(record.id) == record
    second.close()


# ---- add / get -------------------------------------------------------------------------------------------------


def test_add_returns_and_stores_the_memory(store: MemoryStore) -> None:
    scope = Scope(user_id="alice", agent_id="planner", run_id="r1")
    record = store.add(
        "Alice is allergic to peanuts",
        scope,
        metadata={"source": "chat", "tags": ["health"], "score": 0.5, "nested": {"ok": True, "none": None}},
        context=["user: I can't eat that", "assistant: why not?"],
        actor="extractor",
    )
    assert uuid.UUID(record.id).version == 4
    assert isinstance(record.vector_id, int) and record.vector_id >= 1
    assert record.text == "Alice is allergic to peanuts"
    assert record.hash == hashlib.sha256(b"Alice is allergic to peanuts").hexdigest() == hash_text(record.text)
    assert record.scope_dict() == {"user_id": "alice", "agent_id": "planner", "run_id": "r1"}
    assert record.metadata == {"source": "chat", "tags": ["health"], "score": 0.5, "nested": {"ok": True, "none": None}}
    assert record.context == ["user: I can't eat that", "assistant: why not?"]
    assert record.created_at.tzinfo is not None and record.created_at.utcoffset() == UTC.utcoffset(None)
    assert record.updated_at == record.created_at

    fetched = store.get(record.id)
    assert fetched == record
    assert fetched is not None and fetched.created_at.utcoffset() == UTC.utcoffset(None)

    (event,) = store.history(record.id)
    assert (event.event, event.old_text, event.new_text) == ("ADD", None, "Alice is allergic to peanuts")
    assert event.old_metadata is None and event.new_metadata == record.metadata
    assert event.actor == "extractor"
    assert event.memory_id == record.id


def test_defaults_and_json_normalisation(store: MemoryStore) -> None:
    record = store.add("plain", ALICE, metadata={"pair": (1, 2), "unicode": "café ☕"})
    assert record.metadata == {"pair": [1, 2], "unicode": "café ☕"}
    assert store.get(record.id) == record
    bare = store.add("bare", ALICE)
    assert (bare.metadata, bare.context, bare.scope_dict()) == ({}, [], {"user_id": "alice"})


def test_get_unknown_and_out_of_scope(store: MemoryStore) -> None:
    record = store.add("bob's secret", BOB)
    assert store.get(str(uuid.uuid4())) is None
    assert store.get(record.id, BOB) == record
    assert store.get(record.id, ALICE) is None
    assert store.get(record.id, Scope(user_id="bob", agent_id="other")) is None


def test_get_many_reads_the_memories_of_many_ids_in_any_scope(store: MemoryStore) -> None:
    a = store.add("a", ALICE)
    b = store.add("b", BOB)
    deleted = store.add("gone", ALICE)
    store.delete(deleted.id)
    assert store.get_many([]) == {}
    assert store.get_many([b.id, str(uuid.uuid4()), a.id, deleted.id, a.id]) == {a.id: a, b.id: b}
    many = [store.add(f"fact {i}", ALICE) for i in range(5)]
    assert store.get_many([r.id for r in many]) == {r.id: r for r in many}
    for bad in ("", None, 7):
        with pytest.raises(InvalidInputError):
            store.get_many([a.id, bad])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="a list of ids"):  # review: it read one id per character
        store.get_many(a.id)


# ---- scope isolation ------------------------------------------------------------------------------------------


def test_scope_isolation(store: MemoryStore) -> None:
    a1 = store.add("likes tea", ALICE)
    a2 = store.add("lives in Paris", Scope(user_id="alice", agent_id="travel"))
    b1 = store.add("likes tea", BOB)  # same text, same hash, other tenant
    b2 = store.add("has a dog", Scope(user_id="bob", agent_id="travel"))

    assert [m.id for m in store.list(ALICE)] == [a1.id, a2.id]
    assert [m.id for m in store.list(BOB)] == [b1.id, b2.id]
    assert [m.id for m in store.list(Scope(user_id="alice", agent_id="travel"))] == [a2.id]
    assert [m.id for m in store.list(Scope(agent_id="travel"))] == [a2.id, b2.id]
    assert store.list(Scope(user_id="carol")) == []

    assert store.get(b1.id, ALICE) is None and store.get(b2.id, ALICE) is None
    assert store.get(a1.id, BOB) is None

    tea = hash_text("likes tea")
    assert [r.id for r in store.memories_with_hash(tea, ALICE)] == [a1.id]
    assert [r.id for r in store.memories_with_hash(tea, BOB)] == [b1.id]
    assert store.memories_with_hash(hash_text("has a dog"), ALICE) == []
    assert store.memories_with_hash(tea, Scope(user_id="alice", run_id="r9")) == []

    ids_a = store.vector_ids_in_scope(ALICE)
    ids_b = store.vector_ids_in_scope(BOB)
    assert ids_a.dtype == np.int64 and ids_b.dtype == np.int64
    assert ids_a.tolist() == [a1.vector_id, a2.vector_id]
    assert ids_b.tolist() == [b1.vector_id, b2.vector_id]
    assert store.vector_ids_in_scope(Scope(user_id="carol")).shape == (0,)


def test_list_is_oldest_first_with_limit(store: MemoryStore) -> None:
    records = [store.add(f"fact {i}", ALICE) for i in range(5)]
    assert [m.text for m in store.list(ALICE)] == [f"fact {i}" for i in range(5)]
    assert [m.id for m in store.list(ALICE, limit=2)] == [records[0].id, records[1].id]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidInputError):
            store.list(ALICE, limit=bad)  # type: ignore[arg-type]


def test_by_vector_ids_and_all_memories(store: MemoryStore) -> None:
    a = store.add("a", ALICE)
    b = store.add("b", BOB)
    c = store.add("c", ALICE)
    assert store.by_vector_ids([]) == {}
    found = store.by_vector_ids(np.array([c.vector_id, a.vector_id, 999_999, a.vector_id], dtype=np.int64))
    assert found == {a.vector_id: a, c.vector_id: c}
    assert store.by_vector_ids([b.vector_id]) == {b.vector_id: b}
    assert [m.id for m in store.all_memories()] == [a.id, b.id, c.id]
    with pytest.raises(InvalidInputError):
        store.by_vector_ids(["1"])  # type: ignore[list-item]


# ---- update / delete ------------------------------------------------------------------------------------------


def test_update_text_and_metadata(store: MemoryStore) -> None:
    record = store.add("likes coffee", ALICE, {"v": 1}, context=["turn"])
    updated = store.update(record.id, "likes green tea", actor="reconciler")
    assert updated.id == record.id and updated.vector_id == record.vector_id
    assert updated.text == "likes green tea" and updated.hash == hash_text("likes green tea")
    assert updated.metadata == {"v": 1} and updated.context == ["turn"]
    assert updated.created_at == record.created_at and updated.updated_at >= record.updated_at
    assert store.get(record.id) == updated

    again = store.update(record.id, None, metadata={"v": 2})
    assert again.text == "likes green tea" and again.metadata == {"v": 2}

    events = store.history(record.id)
    assert [e.event for e in events] == ["ADD", "UPDATE", "UPDATE"]
    assert (events[1].old_text, events[1].new_text, events[1].actor) == (
        "likes coffee",
        "likes green tea",
        "reconciler",
    )
    assert (events[2].old_metadata, events[2].new_metadata) == ({"v": 1}, {"v": 2})
    assert store.memories_with_hash(hash_text("likes coffee"), ALICE) == []
    assert store.memories_with_hash(hash_text("likes green tea"), ALICE) == [again]


def test_update_errors(store: MemoryStore) -> None:
    record = store.add("kept", ALICE)
    with pytest.raises(MemoryNotFoundError):
        store.update(str(uuid.uuid4()), "x")
    with pytest.raises(InvalidInputError, match="nothing to update"):
        store.update(record.id, None)
    assert store.history(record.id)[-1].event == "ADD"


def test_delete_removes_memory_and_kv_entries(store: MemoryStore) -> None:
    keep = store.add("keep me", ALICE)
    gone = store.add("forget me", ALICE, {"m": 1})
    store.put_kv_entry(gone.id, gone.hash, "fp", "w0", 3, 1024, "/kv/gone.safetensors")
    store.put_kv_entry(keep.id, keep.hash, "fp", "w0", 2, 512, "/kv/keep.safetensors")

    deleted = store.delete(gone.id, actor="user")
    assert deleted == gone
    assert store.get(gone.id) is None
    assert store.get_kv_entry(gone.id, "fp", "w0") is None
    assert store.get_kv_entry(keep.id, "fp", "w0") is not None
    assert [m.id for m in store.list(ALICE)] == [keep.id]

    events = store.history(gone.id)
    assert [e.event for e in events] == ["ADD", "DELETE"]
    assert (events[1].old_text, events[1].new_text, events[1].old_metadata, events[1].actor) == (
        "forget me",
        None,
        {"m": 1},
        "user",
    )
    with pytest.raises(MemoryNotFoundError):
        store.delete(gone.id)

    newer = store.add("forget me", ALICE)  # vector ids are never reused
    assert newer.vector_id > gone.vector_id


def test_delete_scope_only_touches_that_scope(store: MemoryStore) -> None:
    a1 = store.add("a1", ALICE)
    a2 = store.add("a2", Scope(user_id="alice", run_id="r1"))
    b1 = store.add("b1", BOB)
    store.put_kv_entry(a2.id, a2.hash, "fp", "w0", 1, 8, "loc")

    removed = store.delete_scope(Scope(user_id="alice", run_id="r1"))
    assert [m.id for m in removed] == [a2.id]
    assert [m.id for m in store.list(ALICE)] == [a1.id]
    assert store.get_kv_entry(a2.id, "fp", "w0") is None

    removed = store.delete_scope(ALICE, actor="admin")
    assert [m.id for m in removed] == [a1.id]
    assert store.list(ALICE) == []
    assert store.history(a1.id)[-1].event == "DELETE" and store.history(a1.id)[-1].actor == "admin"
    assert store.list(BOB) == [b1]
    assert store.delete_scope(Scope(user_id="carol")) == []


def test_history_of_unknown_id_is_empty(store: MemoryStore) -> None:
    assert store.history(str(uuid.uuid4())) == []


# ---- KV entries -----------------------------------------------------------------------------------------------


def test_kv_entry_upsert_get_delete(store: MemoryStore) -> None:
    record = store.add("fact", ALICE)
    first = store.put_kv_entry(record.id, record.hash, "fp-a", "w0", 5, 2048, "/kv/1")
    assert (first.memory_id, first.fingerprint, first.encoding_key, first.n_tokens, first.nbytes) == (
        record.id,
        "fp-a",
        "w0",
        5,
        2048,
    )
    assert store.get_kv_entry(record.id, "fp-a", "w0") == first

    replaced = store.put_kv_entry(record.id, "h2", "fp-a", "w0", 6, 4096, "/kv/2")
    assert replaced.id == first.id
    assert (replaced.text_hash, replaced.n_tokens, replaced.nbytes, replaced.location) == ("h2", 6, 4096, "/kv/2")

    other = store.put_kv_entry(record.id, record.hash, "fp-b", "w0", 5, 100, "/kv/3")
    assert other.id != first.id
    assert store.get_kv_entry(record.id, "fp-a", "w2") is None

    removed = store.delete_kv_entries(record.id)
    assert sorted(e.location for e in removed) == ["/kv/2", "/kv/3"]
    assert store.get_kv_entry(record.id, "fp-a", "w0") is None
    assert store.delete_kv_entries(record.id) == []
    assert store.get(record.id) == record  # the memory itself stays


def test_new_text_deletes_kv_entries_in_the_same_transaction_and_metadata_keeps_them(store: MemoryStore) -> None:
    record = store.add("I have a beagle.", ALICE)
    entry = store.put_kv_entry(record.id, record.hash, "fp", "w0", 5, 2048, "/kv/1")
    store.update(record.id, None, {"topic": "pets"})
    assert store.get_kv_entry(record.id, "fp", "w0") == entry
    store.apply(ChangeSet(ALICE, updates=(MemoryUpdate(record.id, metadata={"topic": "dogs"}),)))
    assert store.get_kv_entry(record.id, "fp", "w0") == entry
    store.update(record.id, "I have a poodle.")
    assert store.get_kv_entry(record.id, "fp", "w0") is None

    other = store.add("I play chess.", ALICE)
    store.put_kv_entry(other.id, other.hash, "fp", "w0", 4, 1024, "/kv/2")
    store.apply(ChangeSet(ALICE, updates=(MemoryUpdate(other.id, text="I play go."),)))
    assert store.get_kv_entry(other.id, "fp", "w0") is None


def test_a_kv_entry_is_written_only_while_the_memory_has_the_text_and_context_it_was_encoded_from(
    store: MemoryStore,
) -> None:
    """Given the record as the encoder read it, the write is refused once another client re-worded the memory or
    scrubbed a deleted text from its context; without it (the store's own callers) any text hash is written."""
    dog = store.add("My dog is Rex.", ALICE)
    city = store.add("I live in Porto.", ALICE, context=["My dog is Rex."])
    read = store.get(city.id)
    assert read is not None

    def put(record: MemoryRecord, location: str) -> Any:
        return store.put_kv_entry(record.id, record.hash, "fp", "w1", 4, 64, location, encoded_from=record)

    store.delete(dog.id)  # its text leaves the city's stored context
    with pytest.raises(MemoryChangedError, match="changed after its K/V were encoded"):
        put(read, "/kv/1")
    scrubbed = store.get(city.id)
    assert scrubbed is not None and scrubbed.context == [] and store.get_kv_entry(city.id, "fp", "w1") is None
    store.update(city.id, "I live in Lisbon.")
    with pytest.raises(MemoryChangedError):
        put(scrubbed, "/kv/2")
    now = store.get(city.id)
    assert now is not None and store.get_kv_entry(city.id, "fp", "w1") is None
    assert put(now, "/kv/3") == store.get_kv_entry(city.id, "fp", "w1")
    assert store.put_kv_entry(city.id, "h-of-another-text", "fp", "w1", 4, 64, "/kv/4").text_hash == "h-of-another-text"
    with pytest.raises(InvalidInputError, match="encoded_from must be the MemoryRecord of the entry's memory"):
        store.put_kv_entry(dog.id, dog.hash, "fp", "w1", 4, 64, "/kv/5", encoded_from=now)  # another memory's


def test_kv_entry_for_unknown_memory(store: MemoryStore) -> None:
    with pytest.raises(MemoryNotFoundError):
        store.put_kv_entry(str(uuid.uuid4()), "h", "fp", "w0", 1, 1, "loc")


# ---- validation leaves data intact ----------------------------------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[MemoryStore, str], object]]] = [
    ("empty text", lambda s, _: s.add("", ALICE)),
    ("blank text", lambda s, _: s.add("   \n", ALICE)),
    ("non-str text", lambda s, _: s.add(42, ALICE)),  # type: ignore[arg-type]
    ("dict scope", lambda s, _: s.add("x", {"user_id": "alice"})),  # type: ignore[arg-type]
    ("metadata not a dict", lambda s, _: s.add("x", ALICE, [1, 2])),  # type: ignore[arg-type]
    ("metadata object value", lambda s, _: s.add("x", ALICE, {"when": object()})),
    ("metadata int key", lambda s, _: s.add("x", ALICE, {1: "a"})),  # type: ignore[dict-item]
    ("metadata nan", lambda s, _: s.add("x", ALICE, {"score": float("nan")})),
    ("metadata numpy value", lambda s, _: s.add("x", ALICE, {"n": np.int64(3)})),
    ("context str", lambda s, _: s.add("x", ALICE, context="one turn")),
    ("context non-str item", lambda s, _: s.add("x", ALICE, context=["ok", 3])),  # type: ignore[list-item]
    ("actor empty", lambda s, _: s.add("x", ALICE, actor="")),
    ("update empty text", lambda s, mid: s.update(mid, "")),
    ("update bad metadata", lambda s, mid: s.update(mid, "new", {"x": {1, 2}})),
    ("update non-str id", lambda s, _: s.update(7, "new")),  # type: ignore[arg-type]
    ("delete empty id", lambda s, _: s.delete("")),
    ("kv negative tokens", lambda s, mid: s.put_kv_entry(mid, "h", "fp", "w0", -1, 1, "loc")),
    ("kv bool nbytes", lambda s, mid: s.put_kv_entry(mid, "h", "fp", "w0", 1, True, "loc")),
    ("kv long fingerprint", lambda s, mid: s.put_kv_entry(mid, "h", "f" * 300, "w0", 1, 1, "loc")),
    ("get non-scope", lambda s, mid: s.get(mid, "alice")),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("call", [c for _, c in BAD_CALLS], ids=[name for name, _ in BAD_CALLS])
def test_bad_input_raises_and_leaves_data_intact(
    store: MemoryStore, call: Callable[[MemoryStore, str], object]
) -> None:
    record = store.add("original", ALICE, {"k": "v"})
    store.put_kv_entry(record.id, record.hash, "fp", "w0", 1, 1, "loc")
    before = _snapshot(store)
    kv_before = store.get_kv_entry(record.id, "fp", "w0")
    with pytest.raises(InvalidInputError):
        call(store, record.id)
    assert _snapshot(store) == before
    assert store.get_kv_entry(record.id, "fp", "w0") == kv_before


def test_scope_requires_an_id() -> None:
    with pytest.raises(ScopeError):
        Scope()


# ---- reset and concurrency ------------------------------------------------------------------------------------


def test_reset_deletes_everything(store: MemoryStore) -> None:
    record = store.add("x", ALICE)
    gone = store.add("deleted before the reset", ALICE)
    store.delete(gone.id)
    store.put_kv_entry(record.id, record.hash, "fp", "w0", 1, 1, "loc")
    assert store.reset() == sorted([record.id, gone.id])  # every memory it knew, for the caller's K/V files
    assert store.all_memories() == []
    assert store.history(record.id) == []
    assert store.get_kv_entry(record.id, "fp", "w0") is None
    assert store.add("after reset", ALICE).text == "after reset"


def test_concurrent_adds_from_threads(store: MemoryStore) -> None:
    # The first use happens in many threads at once: lazy initialisation must create the schema exactly once.
    n_threads, per_thread = 8, 10
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(worker: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                store.add(f"w{worker} fact {i}", Scope(user_id=f"user{worker}"))
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    everything = store.all_memories()
    assert len(everything) == n_threads * per_thread
    assert len({m.vector_id for m in everything}) == n_threads * per_thread
    for w in range(n_threads):
        assert [m.text for m in store.list(Scope(user_id=f"user{w}"))] == [f"w{w} fact {i}" for i in range(per_thread)]


def test_a_sqlite_url_under_home_is_opened_where_it_is_switched_to_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:///~/m.db``: WAL was switched on at ``$HOME/m.db`` (a file made there) while the driver opened
    ``./~/m.db``, which failed as an unreachable database (a review's find). Both read the expanded path now."""
    home, elsewhere = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    store = MemoryStore("sqlite:///~/m.db")
    store.add("likes tea", ALICE)
    assert [m.text for m in store.list(ALICE)] == ["likes tea"]
    store.close()
    assert sorted(p.name for p in home.iterdir()) == ["m.db"] and list(elsewhere.iterdir()) == []
