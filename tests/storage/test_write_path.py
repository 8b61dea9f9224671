"""The storage layer's one write path: store calls and change sets through the same session functions, the async
store through them too, and the package's import structure (SQLite and PostgreSQL)."""

from __future__ import annotations

import ast
import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text as sa_text

from inferscale.errors import InvalidInputError, MemoryNotFoundError
from inferscale.scope import Scope
from inferscale.storage import ChangeSet, MemoryStore, MemoryUpdate, NewMemory, PastChange, hash_text
from inferscale.storage.change_sets import validate_changes

ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")


@pytest.fixture
def store(db_url: str) -> Iterator[MemoryStore]:
    """A store on each backend (SQLite file, fresh PostgreSQL schema; see ``db_url`` in conftest.py)."""
    store = MemoryStore(db_url)
    yield store
    store.close()


# ---- one write path: store methods are change sets -------------------------------------------------------------


def test_update_that_changes_nothing_is_still_recorded(store: MemoryStore) -> None:
    # MemoryStore.update always writes (history row, new updated_at); a change set skips a no-op update.
    record = store.add("likes tea", ALICE, {"k": 1})
    same = store.update(record.id, "likes tea", {"k": 1}, actor="eval")
    assert (same.text, same.metadata) == ("likes tea", {"k": 1}) and same.updated_at >= record.updated_at
    assert [e.event for e in store.history(record.id)] == ["ADD", "UPDATE"]

    applied = store.apply(ChangeSet(ALICE, updates=(MemoryUpdate(record.id, "likes tea"),)))
    assert applied.updated == [] and applied.skipped == [f"UPDATE of memory {record.id!r} skipped: nothing changes"]
    assert [e.event for e in store.history(record.id)] == ["ADD", "UPDATE"]


# Found by the property-based suite (tests/properties): metadata {"topic": 0} updated to {"topic": 0.0} (or 1 to True)
# was skipped as "nothing changes", and even a written update left the old value in the database (SQLAlchemy skips a
# JSON value == to the loaded one) while the call returned the new one.
LOOK_ALIKES: list[tuple[Any, Any]] = [(0, 0.0), (1, True), (True, 1), (0, False), (2.0, 2), ([1, 0], [True, False])]


@pytest.mark.parametrize(("old", "new"), LOOK_ALIKES, ids=repr)
def test_metadata_python_calls_equal_but_json_does_not_is_an_update(store: MemoryStore, old: Any, new: Any) -> None:
    record = store.add("likes tea", ALICE, {"topic": old})
    applied = store.apply(ChangeSet(ALICE, updates=(MemoryUpdate(record.id, metadata={"topic": new}),)))
    assert [after.metadata for _, after in applied.updated] == [{"topic": new}]
    assert repr(store.get(record.id).metadata) == repr({"topic": new})  # type: ignore[union-attr]  # types too
    assert [(e.event, repr(e.new_metadata)) for e in store.history(record.id)][1:] == [("UPDATE", repr({"topic": new}))]

    again = store.update(record.id, None, {"topic": old})  # the store's own update: always written
    assert repr(again.metadata) == repr(store.get(record.id).metadata) == repr({"topic": old})  # type: ignore[union-attr]


def test_store_add_keeps_duplicates_while_change_sets_skip_them(store: MemoryStore) -> None:
    first = store.add("likes tea", ALICE)
    second = store.add("likes tea", ALICE)
    assert first.id != second.id and first.hash == second.hash
    applied = store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea"),)))
    assert applied.added == [] and len(applied.skipped) == 1
    assert [m.id for m in store.list(ALICE)] == [first.id, second.id]


def test_change_sets_skip_only_duplicates_of_exactly_their_scope(store: MemoryStore) -> None:
    """A text a narrower scope (a run of the user) holds is no duplicate for the user, and the other way round."""
    run = Scope(user_id="alice", agent_id="a1", run_id="r1")
    store.add("likes tea", run)
    (mine,) = store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea"),))).added
    assert store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea"),))).added == []
    assert store.memories_with_hash(hash_text("likes tea"), ALICE) == [mine]
    store.add("lives in Porto", ALICE)
    assert len(store.apply(ChangeSet(run, adds=(NewMemory("lives in Porto"),))).added) == 1


def test_change_sets_are_validated_like_store_calls() -> None:
    one_turn: Any = "one turn"  # a str where a tuple of turns belongs
    with pytest.raises(InvalidInputError, match="context must be a list of str"):
        validate_changes(ChangeSet(ALICE, adds=(NewMemory("x", context=one_turn),)))
    scope_dict: Any = {"user_id": "alice"}
    with pytest.raises(InvalidInputError, match=r"scope must be an inferscale\.scope\.Scope"):
        validate_changes(ChangeSet(scope_dict, adds=(NewMemory("x"),)))
    with pytest.raises(InvalidInputError, match="nothing to update"):
        validate_changes(ChangeSet(None, updates=(MemoryUpdate("some-id"),)))


# ---- the async store runs the same session functions -----------------------------------------------------------


def _async_store(store: MemoryStore) -> Any:
    """An AsyncMemoryStore on the same database (and PostgreSQL schema) as ``store``."""
    from inferscale.storage.async_store import AsyncMemoryStore

    return AsyncMemoryStore(store.url)


def test_async_get_checks_the_scope_in_sql(store: MemoryStore) -> None:
    astore = _async_store(store)
    record = store.add("bob's secret", BOB)

    async def body() -> None:
        try:
            assert await astore.get(record.id) == record
            assert await astore.get(record.id, BOB) == record
            assert await astore.get(record.id, Scope(user_id="bob", run_id=None)) == record
            assert await astore.get(record.id, ALICE) is None
            assert await astore.get(record.id, Scope(user_id="bob", agent_id="other")) is None
            assert await astore.get(str(uuid.uuid4()), BOB) is None
            with pytest.raises(InvalidInputError):
                await astore.get(record.id, {"user_id": "bob"})
        finally:
            await astore.close()

    asyncio.run(body())


def test_async_store_matches_the_sync_store(store: MemoryStore) -> None:
    astore = _async_store(store)

    async def body() -> None:
        try:
            added = await astore.add("likes tea", ALICE, {"k": 1}, context=["turn"], actor="user")
            assert store.get(added.id) == added and added.context == ["turn"]
            twice = await astore.add("likes tea", ALICE)
            assert twice.id != added.id

            same = await astore.update(added.id, None, {"k": 1})
            assert same.metadata == {"k": 1}
            changed = await astore.update(added.id, "likes green tea", actor="reconciler")
            assert changed.hash == hash_text("likes green tea") and store.get(added.id) == changed
            with pytest.raises(MemoryNotFoundError):
                await astore.update(str(uuid.uuid4()), "x")
            with pytest.raises(InvalidInputError, match="nothing to update"):
                await astore.update(added.id, None)

            entry = await astore.put_kv_entry(added.id, changed.hash, "fp", "w0", 3, 64, "/kv/1")
            replaced = await astore.put_kv_entry(added.id, changed.hash, "fp", "w0", 4, 128, "/kv/2")
            assert replaced.id == entry.id and await astore.get_kv_entry(added.id, "fp", "w0") == replaced
            assert store.get_kv_entry(added.id, "fp", "w0") == replaced
            with pytest.raises(MemoryNotFoundError):
                await astore.put_kv_entry(str(uuid.uuid4()), "h", "fp", "w0", 1, 1, "loc")
            assert [e.location for e in await astore.delete_kv_entries(added.id)] == ["/kv/2"]
            assert await astore.delete_kv_entries(added.id) == []

            assert await astore.delete(added.id, actor="user") == changed
            with pytest.raises(MemoryNotFoundError):
                await astore.delete(added.id)
            events = await astore.history(added.id)
            assert events == store.history(added.id)
            assert [(e.event, e.actor) for e in events] == [
                ("ADD", "user"),
                ("UPDATE", None),
                ("UPDATE", "reconciler"),
                ("DELETE", "user"),
            ]
            assert [m.id for m in await astore.list(ALICE)] == [twice.id]
        finally:
            await astore.close()

    asyncio.run(body())


# ---- structure -------------------------------------------------------------------------------------------------

STORAGE = Path(__file__).resolve().parents[2] / "inferscale" / "storage"


def _storage_imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import of an ``inferscale.storage`` module in ``path``, lazy ones included."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("inferscale.storage"):
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names if a.name.startswith("inferscale.storage"))
    return found


def test_storage_modules_import_no_circle_and_no_privates() -> None:
    graph: dict[str, set[str]] = {}
    for path in sorted(STORAGE.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = f"inferscale.storage.{path.stem}"
        imports = _storage_imports(path)
        assert all(m != "inferscale.storage" for m, _ in imports), f"{module} imports the package __init__"
        private = [(m, n) for m, names in imports for n in names if n.startswith("_")]
        assert private == [], f"{module} imports private names {private}"
        graph[module] = {m for m, _ in imports}

    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in graph.get(module, set()):
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
    assert max(len(p.read_text().splitlines()) for p in STORAGE.glob("*.py")) <= 400


# ---- given ids and times (an import from another store) ---------------------------------------------------------

GIVEN_ID = "5c1f3c52-7e0e-4c55-9a43-7c1d1f6b2a01"


def test_an_add_keeps_a_given_id_and_times_and_dates_its_history_by_them(store: MemoryStore) -> None:
    created = datetime(2025, 5, 1, 8, 0, tzinfo=timezone(timedelta(hours=2)))
    updated = datetime(2025, 6, 1, tzinfo=UTC)
    new = NewMemory("likes tea", memory_id=GIVEN_ID, created_at=created, updated_at=updated)
    (added,) = store.apply(ChangeSet(ALICE, adds=(new,), skip_duplicates=False)).added
    assert (added.id, added.created_at, added.updated_at) == (GIVEN_ID, created.astimezone(UTC), updated)
    ((event, when),) = [(h.event, h.created_at) for h in store.history(GIVEN_ID)]
    assert (event, when) == ("ADD", created.astimezone(UTC))


def test_a_given_id_its_scope_holds_is_skipped_and_one_another_scope_holds_rolls_back(store: MemoryStore) -> None:
    store.apply(ChangeSet(BOB, adds=(NewMemory("plays cello", memory_id=GIVEN_ID),)))
    again = store.apply(ChangeSet(BOB, adds=(NewMemory("plays the cello", memory_id=GIVEN_ID),)))
    assert again.added == [] and "a memory of scope" in again.skipped[0] and "had that id already" in again.skipped[0]
    other = ChangeSet(ALICE, adds=(NewMemory("likes tea"), NewMemory("likes chess", memory_id=GIVEN_ID)))
    with pytest.raises(InvalidInputError, match="held by a memory of another scope") as raised:
        store.apply(other)
    assert "bob" not in str(raised.value)
    assert [r.text for r in store.all_memories()] == ["plays cello"]  # the set's first add rolled back too


@pytest.mark.parametrize(
    ("new", "says"),
    [
        (NewMemory("x", memory_id="mem-1"), "canonical form"),
        (NewMemory("x", memory_id=GIVEN_ID.upper()), "canonical form"),
        (NewMemory("x", created_at=datetime(2025, 1, 1)), "no time zone"),
        (NewMemory("x", updated_at="2025-01-01T00:00:00+00:00"), "must be a datetime"),  # type: ignore[arg-type]
    ],
)
def test_a_given_id_or_time_is_checked_before_anything_is_written(
    store: MemoryStore, new: NewMemory, says: str
) -> None:
    with pytest.raises(InvalidInputError, match=says):
        store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea"), new)))
    assert store.all_memories() == []


def test_one_id_given_to_two_adds_of_a_set_is_refused() -> None:
    twice = (NewMemory("a", memory_id=GIVEN_ID), NewMemory("b", memory_id=GIVEN_ID))
    with pytest.raises(InvalidInputError, match="more than one new memory"):
        validate_changes(ChangeSet(ALICE, adds=twice))


def test_a_given_id_a_deleted_memory_had_is_skipped(store: MemoryStore) -> None:
    """An import run again after a deletion must not bring the memory back (its history would run backwards)."""
    store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea", memory_id=GIVEN_ID),)))
    store.delete(GIVEN_ID)
    again = store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea", memory_id=GIVEN_ID),)))
    assert again.added == [] and "a deleted memory had that id already" in again.skipped[0]
    assert [h.event for h in store.history(GIVEN_ID)] == ["ADD", "DELETE"]


def test_an_update_time_alone_dates_the_new_memory(store: MemoryStore) -> None:
    updated = datetime(2025, 6, 1, tzinfo=UTC)
    (added,) = store.apply(ChangeSet(ALICE, adds=(NewMemory("likes tea", updated_at=updated),))).added
    assert added.created_at == added.updated_at == updated


def test_one_id_given_in_two_scopes_at_once_is_stored_once_and_refused_once(store: MemoryStore) -> None:
    """PostgreSQL's READ COMMITTED let both transactions find the id free; the second then failed on the unique key
    with a raw IntegrityError (a review's find). Each change set now locks its given ids first. Ten ids, each given
    to alice and bob by two threads that start together."""
    ids = [str(uuid.UUID(int=n, version=4)) for n in range(10)]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def give(scope: Scope) -> None:
        for memory_id in ids:
            start.wait()
            try:
                store.apply(ChangeSet(scope, adds=(NewMemory(f"fact {memory_id}", memory_id=memory_id),)))
            except BaseException as error:
                errors.append(error)

    threads = [threading.Thread(target=give, args=(scope,)) for scope in (ALICE, BOB)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == len(ids)
    assert all(isinstance(e, InvalidInputError) and "held by a memory of another scope" in str(e) for e in errors)
    assert sorted(r.id for r in store.all_memories()) == sorted(ids)


# ---- a history brought from another store (an import of Mem0's history) --------------------------------------

T0 = datetime(2025, 5, 1, tzinfo=UTC)


def _past(*steps: tuple[str, str | None, str, int]) -> tuple[PastChange, ...]:
    """Changes ``(event, old text, new text, days after T0)``."""
    return tuple(PastChange(event, old, new, T0 + timedelta(days=day), "maya") for event, old, new, day in steps)  # type: ignore[arg-type]


def test_a_given_history_is_stored_instead_of_one_add(store: MemoryStore) -> None:
    history = _past(("ADD", None, "likes tea", 0), ("UPDATE", "likes tea", "likes green tea", 3))
    new = NewMemory("likes green tea", {"topic": "drinks"}, memory_id=GIVEN_ID, created_at=T0, history=history)
    store.apply(ChangeSet(ALICE, adds=(new,)))
    rows = store.history(GIVEN_ID)
    assert [(h.event, h.old_text, h.new_text, h.created_at, h.actor, h.scope) for h in rows] == [
        ("ADD", None, "likes tea", T0, "maya", ALICE),
        ("UPDATE", "likes tea", "likes green tea", T0 + timedelta(days=3), "maya", ALICE),
    ]
    said = {"topic": "drinks", "actor_id": "maya"}  # the memory's metadata, with each change's role and actor
    assert [(h.old_metadata, h.new_metadata) for h in rows] == [(None, said), (said, {"topic": "drinks"})]
    assert store.get(GIVEN_ID).created_at == T0  # type: ignore[union-attr]


def test_a_given_history_keeps_each_changes_role_and_its_order_and_times_as_given(store: MemoryStore) -> None:
    """Another store's clock may date an ADD after the UPDATE that follows it (Mem0 dates an ADD by a created_at
    its caller may set): the changes are stored in the order given, with their times."""
    history = (
        PastChange("ADD", None, "likes tea", T0 + timedelta(days=5), "maya", "user"),
        PastChange("UPDATE", "likes tea", "likes green tea", T0, None, "assistant"),
    )
    new = NewMemory("likes green tea", {"role": "assistant", "k": 1}, memory_id=GIVEN_ID, history=history)
    store.apply(ChangeSet(ALICE, adds=(new,)))
    rows = store.history(GIVEN_ID)
    assert [(h.event, h.created_at, h.actor) for h in rows] == [
        ("ADD", T0 + timedelta(days=5), "maya"),
        ("UPDATE", T0, None),
    ]
    user, assistant = {"k": 1, "role": "user", "actor_id": "maya"}, {"k": 1, "role": "assistant"}
    assert [(h.old_metadata, h.new_metadata) for h in rows] == [(None, user), (user, assistant)]


@pytest.mark.parametrize(
    ("history", "says"),
    [
        (_past(("UPDATE", "likes tea", "likes green tea", 0)), "is UPDATE from 'likes tea'"),
        (_past(("ADD", None, "likes tea", 0), ("ADD", None, "likes green tea", 1)), "is ADD from None"),
        (_past(("ADD", None, "likes tea", 0), ("UPDATE", "likes coffee", "likes green tea", 1)), "from 'likes coffee'"),
        (_past(("ADD", None, "likes tea", 0)), "its last change leaves another one"),
        (_past(("ADD", None, " ", 0), ("UPDATE", " ", "likes green tea", 1)), "new text"),
        ((PastChange("ADD", None, "likes green tea", datetime(2025, 1, 1)),), "no time zone"),
        ((PastChange("ADD", None, "likes green tea", T0, role=" "),), "role must not be empty"),
        ([PastChange("ADD", None, "likes green tea", T0)], "a tuple of PastChange"),
    ],
)
def test_a_given_history_that_does_not_lead_to_the_memory_is_refused_before_anything_is_written(
    store: MemoryStore, history: Any, says: str
) -> None:
    new = NewMemory("likes green tea", memory_id=GIVEN_ID, history=history)
    with pytest.raises(InvalidInputError, match=says):
        store.apply(ChangeSet(ALICE, adds=(NewMemory("likes chess"), new)))
    assert store.all_memories() == []


def test_an_llms_update_to_a_text_another_memory_of_its_scope_holds_deletes_its_memory(store: MemoryStore) -> None:
    """The last stop's find: a reconcile's UPDATE of one memory to the text of another of the same scope left two
    memories with one text (an ADD of that text was skipped as a duplicate, an UPDATE was not). Skipping the update
    instead left the old text beside the new one it was to be replaced by (a review's find: "Lives in Oslo" beside
    "Lives in Bergen"): the memory is deleted, its text held already by the other."""
    oslo = store.add("lives in Oslo", ALICE, {"src": 1})
    bergen = store.add("lives in Bergen", ALICE)
    run = store.add("lives in Bergen", Scope(user_id="alice", run_id="r1"))  # another scope
    inferred = MemoryUpdate(oslo.id, bergen.text, {"src": 2}, instead=NewMemory(bergen.text))
    applied = store.apply(ChangeSet(ALICE, updates=(inferred,), seen=((oslo.id, oslo.hash),), actor="llm"))
    assert (applied.updated, applied.added) == ([], [])
    assert applied.skipped == [f"ADD of {bergen.text!r} skipped: already stored in scope {ALICE}"]  # its fact
    assert [d.id for d in applied.deleted] == [oslo.id] and store.get(oslo.id) is None
    assert [(h.event, h.old_text, h.actor) for h in store.history(oslo.id)][1:] == [("DELETE", oslo.text, "llm")]
    assert [r.id for r in store.memories_with_hash(bergen.hash, ALICE)] == [bergen.id]
    assert store.get(bergen.id).metadata == {}  # type: ignore[union-attr]  # the holder is left as it was
    # The run's memory of the same text is of another scope: an update in that scope is not a duplicate of it...
    other = store.add("likes pizza", Scope(user_id="alice", run_id="r2"))
    run_update = MemoryUpdate(other.id, run.text, instead=NewMemory(run.text))
    assert [after.text for _, after in store.apply(ChangeSet(ALICE, updates=(run_update,))).updated] == [run.text]
    # ...and an explicit update (no ``instead``) is the caller's choice, written as asked.
    tea = store.add("likes tea", ALICE)
    explicit = store.apply(ChangeSet(None, updates=(MemoryUpdate(tea.id, bergen.text),), strict=True))
    assert [after.text for _, after in explicit.updated] == [bergen.text]


def test_the_fact_of_an_update_turned_delete_survives_a_later_update_of_its_holder(store: MemoryStore) -> None:
    """A second review's find: A -> "lives in Bergen" (held by B) deleted A, and B -> "lives in Stavanger" later in
    the same set then took the text away: "Bergen" was stored nowhere. The fact is added once the updates are
    applied, unless still held; and a later update of the deleted memory is skipped, its fact added (it was applied
    to the detached row: A listed as deleted and as updated, its history ending in a phantom UPDATE)."""
    oslo, bergen = store.add("lives in Oslo", ALICE), store.add("lives in Bergen", ALICE)

    def llm(memory_id: str, text: str) -> MemoryUpdate:
        return MemoryUpdate(memory_id, text, instead=NewMemory(text))

    applied = store.apply(ChangeSet(ALICE, updates=(llm(oslo.id, bergen.text), llm(bergen.id, "lives in Stavanger"))))
    assert [d.id for d in applied.deleted] == [oslo.id] and [a.text for a in applied.added] == [bergen.text]
    assert sorted(r.text for r in store.list(ALICE)) == ["lives in Bergen", "lives in Stavanger"]
    tromso = store.add("lives in Tromso", ALICE)
    again = (llm(tromso.id, "lives in Stavanger"), llm(tromso.id, "lives in Narvik"))
    applied = store.apply(ChangeSet(ALICE, updates=again))
    assert ([d.id for d in applied.deleted], applied.updated) == ([tromso.id], [])
    assert [e.event for e in store.history(tromso.id)] == ["ADD", "DELETE"]
    assert sorted(r.text for r in store.list(ALICE)) == ["lives in Bergen", "lives in Narvik", "lives in Stavanger"]


def test_a_memory_stored_under_an_id_now_refused_stays_readable_and_deletable(store: MemoryStore) -> None:
    """A review's find: once ids of invisible characters only were refused (storable.is_blank), a memory a release
    before had stored under one could not be updated or deleted, even by its own id: the scope rebuilt from its row
    went through the check of a given id. Stored ids are taken as they are."""
    record = store.add("likes tea", ALICE)
    with store.engine.begin() as conn:
        conn.execute(sa_text("update memories set user_id = :invisible"), {"invisible": "\u200b"})
    kept = store.get(record.id)
    assert kept is not None and kept.scope().user_id == "\u200b"
    applied = store.apply(ChangeSet(None, updates=(MemoryUpdate(record.id, "likes green tea"),), strict=True))
    assert [after.text for _, after in applied.updated] == ["likes green tea"]
    assert [h.event for h in store.history(record.id)] == ["ADD", "UPDATE"]
    assert store.delete(record.id).id == record.id and store.get(record.id) is None
