"""Reconciliation of the derived stores with SQL, one known gap at a time, on both local clients and both
databases: a vector stale after a crash or another client's update, and what a crash between the SQL commit and
the derived stores' update leaves on disk (K/V of deleted or re-worded memories, rows without files, temporary
files, vectors of deleted memories). A crash is simulated by committing through the SQL store alone."""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from client_adapter import ClientAdapter, open_client
from mem0_fakes import HashEmbedder, fake_config
from sqlalchemy import text
from tiny_models import tiny_engine

import inferscale.derived
import inferscale.reconcile
from inferscale import MemoryClient
from inferscale.atomic import HOST_TAG, TEMP_MIN_AGE_S, left_over
from inferscale.kv.tiers import DiskTier
from inferscale.reconcile import ReconcileReport
from inferscale.steps import run_steps
from inferscale.storage import MemoryStore

FACTS = ["I have a beagle named Biscuit.", "My sister Ana lives in Lisbon.", "I play chess on Sundays.", "I love tea."]
NEW_TEXT = "My beagle is called Cookie now."


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def _open(kind: str, tmp_path: Path, db_url: str, engine: Any = None) -> ClientAdapter:
    return open_client(kind, fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())  # type: ignore[arg-type]


def _vector(adapter: ClientAdapter, memory_id: str) -> np.ndarray:
    """The vector the client's loaded index holds for ``memory_id``: float32 ``[dim]``."""
    client: Any = adapter.client  # a local client, sync or async: both have the sync store and the derived stores
    record = client.db.get(memory_id)
    assert record is not None
    index = run_steps(client.derived.index_steps(), client.db)
    return index.vectors(np.array([record.vector_id]))[0]


def _embedding(text: str) -> np.ndarray:
    return HashEmbedder().embed([text])[0]


def test_a_text_updated_after_the_last_index_save_is_embedded_again_on_reopen(
    kind: str, tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inferscale.derived, "INDEX_SAVE_INTERVAL_S", math.inf)  # the file is written when asked
    writer = _open(kind, tmp_path, db_url)
    ids = [writer.add(fact, user_id="maya", infer=False)["results"][0]["id"] for fact in FACTS]
    writer.client.derived.save_index(force=True)
    saved = {p: p.read_bytes() for p in tmp_path.rglob("*.faiss*")}  # the index file and its labels
    assert len(saved) == 1  # the index and its labels, in one file
    writer.update(ids[0], text=NEW_TEXT)
    writer.close()
    for path, data in saved.items():  # the index files as a crash right after the update leaves them
        path.write_bytes(data)

    reopened = _open(kind, tmp_path, db_url)
    assert reopened.reconcile() == ReconcileReport(vectors_refreshed=1)
    np.testing.assert_allclose(_vector(reopened, ids[0]), _embedding(NEW_TEXT), atol=1e-6)
    top = reopened.search(NEW_TEXT, user_id="maya", limit=1)["results"][0]
    assert (top["id"], top["score"]) == (ids[0], pytest.approx(1.0, abs=1e-5))
    assert reopened.reconcile() == ReconcileReport()
    reopened.close()


def test_a_text_another_client_updated_is_searched_by_its_new_vector(kind: str, tmp_path: Path, db_url: str) -> None:
    reader, writer = _open(kind, tmp_path, db_url), _open(kind, tmp_path, db_url)  # two processes, in effect
    ids = [reader.add(fact, user_id="maya", infer=False)["results"][0]["id"] for fact in FACTS]
    assert reader.search(FACTS[0], user_id="maya", limit=1)["results"][0]["id"] == ids[0]  # the index is loaded
    writer.update(ids[0], text=NEW_TEXT)
    top = reader.search(NEW_TEXT, user_id="maya", limit=1)["results"][0]
    assert (top["id"], top["memory"], top["score"]) == (ids[0], NEW_TEXT, pytest.approx(1.0, abs=1e-5))
    np.testing.assert_allclose(_vector(reader, ids[0]), _embedding(NEW_TEXT), atol=1e-6)
    reader.close()
    writer.close()


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("trigger", ["reconcile", "first search"])
def test_a_crash_between_sql_and_the_derived_stores_is_repaired(
    kind: str,
    tmp_path: Path,
    db_url: str,
    engine: Any,
    trigger: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inferscale.reconcile, "KV_ROW_GRACE_S", 0.0)  # the crash was long ago
    writer = _open(kind, tmp_path, db_url, engine)
    # One user per fact: no fact is in another's context, so a delete or re-wording changes only its own entries
    # (a text leaving a scope also leaves the scope's other contexts: tests/api/test_deleted_text.py).
    users = [f"maya{i}" for i in range(len(FACTS))]
    ids = [
        writer.add(fact, user_id=user, infer=False, encode_kv=True)["results"][0]["id"]
        for fact, user in zip(FACTS, users, strict=True)
    ]
    writer.close()
    kv = tmp_path / "kv"
    store = MemoryStore(db_url)
    rows = {memory_id: [r for r in store.all_kv_entries() if r.memory_id == memory_id] for memory_id in ids}
    assert all(len(rows[i]) == 1 and Path(rows[i][0].location).parent == kv / i for i in ids)

    # Committed in SQL, but the client "crashed" before its derived stores followed:
    store.delete(ids[0])  # its K/V folder and its vector stay
    store.update(ids[1], NEW_TEXT)  # its row went with the old text; the file and the old vector stay
    store.close()
    Path(rows[ids[2]][0].location).unlink()  # a row whose file is gone
    dead_pid = _dead_pid()
    dead = kv / ids[3] / f".{'a' * 32}.safetensors.{HOST_TAG}-{dead_pid}.{'b' * 32}.tmp"  # died before the rename
    index_file = next(tmp_path.rglob("*.faiss"))
    dead_save = index_file.with_name(f".{index_file.name}.{HOST_TAG}-{dead_pid}.{'b' * 32}.tmp")
    old = kv / ids[3] / f".{'c' * 32}.{'d' * 32}.tmp"  # an older name, written two hours ago
    live = kv / ids[3] / f".{'e' * 32}.safetensors.{HOST_TAG}-{os.getpid()}.{'f' * 32}.tmp"  # a live writer's
    for path in (dead, old, live, dead_save):
        path.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    for path in (dead, dead_save):  # a dead writer's file is swept once it is older than the minimum age
        os.utime(path, (time.time() - 2 * TEMP_MIN_AGE_S, time.time() - 2 * TEMP_MIN_AGE_S))
    foreign = kv / "0f0f0f0f-0000-4000-8000-000000000000"  # another database's memory, sharing the K/V folder
    foreign.mkdir()
    shutil.copy(rows[ids[3]][0].location, foreign / Path(rows[ids[3]][0].location).name)

    reopened = _open(kind, tmp_path, db_url)  # no engine: repairing needs none
    expected = ReconcileReport(
        vectors_refreshed=1,
        vectors_removed=1,
        kv_memories_removed=1,
        kv_files_removed=1,
        kv_rows_removed=1,
        temp_files_removed=3,
        kv_folders_kept=1,
    )
    with caplog.at_level(logging.INFO, logger="inferscale.reconcile"):
        if trigger == "reconcile":
            assert reopened.reconcile() == expected
        else:  # the first use of the index reconciles on its own, and logs what it repaired
            reopened.search(NEW_TEXT, user_id=users[1], limit=1)
            counts = {name: count for name, count in expected.as_dict().items() if count}
            assert f"reconciled the derived stores with SQL: {counts}" in caplog.messages
    assert not (kv / ids[0]).exists()
    assert list((kv / ids[1]).glob("*.safetensors")) == []
    assert sorted((kv / ids[3]).glob(".*.tmp")) == [live]
    assert not dead_save.exists()
    assert (foreign / Path(rows[ids[3]][0].location).name).exists()
    store = MemoryStore(db_url)
    assert [(r.memory_id, r.location) for r in store.all_kv_entries()] == [(ids[3], rows[ids[3]][0].location)]
    assert {memory_id for memory_id, files in DiskTier(kv).entry_files().items() if files} == {ids[3], foreign.name}
    vector_ids = sorted(r.vector_id for r in store.all_memories())
    store.close()
    index = run_steps(reopened.client.derived.index_steps(), reopened.client.db)
    assert sorted(index.ids().tolist()) == vector_ids
    np.testing.assert_allclose(_vector(reopened, ids[1]), _embedding(NEW_TEXT), atol=1e-6)
    assert reopened.reconcile() == ReconcileReport(kv_folders_kept=1)
    reopened.close()


def test_a_kv_row_is_committed_before_its_file_is_written(
    tmp_path: Path, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So a K/V file on disk always has its row (unless its memory was deleted or re-worded since), which is what
    lets reconciliation remove a file without a row safely while other processes write."""
    client = MemoryClient(fake_config(tmp_path), engine=engine, embedder=HashEmbedder())
    row_first: list[bool] = []
    write_file = DiskTier.put

    def put(tier: DiskTier, key: Any, fact: Any) -> Any:
        row_first.append(client.db.get_kv_entry(key.memory_id, key.fingerprint, key.encoding_key) is not None)
        return write_file(tier, key, fact)

    monkeypatch.setattr(DiskTier, "put", put)
    client.add([{"role": "user", "content": fact} for fact in FACTS[:2]], user_id="maya", infer=False, encode_kv=True)
    client.close()
    assert row_first == [True] * 3  # the first memory's one encoding, the second's two (it has a turn before it)


def test_a_clients_own_writes_are_never_counted_as_repairs(
    kind: str, tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The index is reconciled before a client's first write, not after it (which would find the write's memory
    without a vector and report it as a repair)."""
    client = _open(kind, tmp_path, db_url)
    with caplog.at_level(logging.INFO, logger="inferscale.reconcile"):
        ids = [client.add(fact, user_id="maya", infer=False)["results"][0]["id"] for fact in FACTS]
        client.update(ids[0], text=NEW_TEXT)
        client.delete(ids[1])
        client.delete_all(user_id="maya")
        assert client.reconcile() == ReconcileReport()
    assert not [m for m in caplog.messages if m.startswith("reconciled")]
    client.close()


def test_a_row_whose_file_is_being_renamed_into_place_is_kept(tmp_path: Path, db_url: str, engine: Any) -> None:
    """A writer commits a K/V row, then renames its file into place: a reconcile (another process) in between
    finds the row without its file, and must leave it while it is younger than the grace period."""
    writer = _open("sync", tmp_path, db_url, engine)
    memory_id = writer.add(FACTS[0], user_id="maya", infer=False, encode_kv=True)["results"][0]["id"]
    writer.close()
    store = MemoryStore(db_url)
    (row,) = store.all_kv_entries()
    Path(row.location).unlink()  # as just before the writer's rename
    reconciler = _open("sync", tmp_path, db_url)
    assert reconciler.reconcile() == ReconcileReport()
    assert [(r.memory_id, r.id) for r in store.all_kv_entries()] == [(memory_id, row.id)]
    store.close()
    reconciler.close()


def test_a_dead_looking_writers_temp_file_is_kept_until_the_minimum_age(tmp_path: Path) -> None:
    """Containers sharing a host name but not a pid namespace see each other's live writers as dead pids."""
    path = tmp_path / f".{'a' * 32}.safetensors.{HOST_TAG}-{_dead_pid()}.{'b' * 32}.tmp"
    path.write_bytes(b"partial")
    now = path.stat().st_mtime
    assert not left_over(path, now + 1.0)
    assert left_over(path, now + 2 * TEMP_MIN_AGE_S)


def test_rows_of_another_hosts_k_v_folder_are_left_alone(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hosts on one database, each with its own K/V folder: host B's reconcile deleted host A's rows (their files
    are not on B's disk), and on A's next reconcile every file of A had no row, so A removed them all."""
    monkeypatch.setattr(inferscale.reconcile, "KV_ROW_GRACE_S", 0.0)
    host_a = _open("sync", tmp_path / "a", db_url, engine)
    for fact in FACTS[:2]:
        host_a.add(fact, user_id="maya", infer=False, encode_kv=True)
    host_a.close()
    store = MemoryStore(db_url)
    rows = sorted((r.memory_id, r.location) for r in store.all_kv_entries())
    assert rows and all(Path(location).is_relative_to(tmp_path / "a" / "kv") for _, location in rows)
    (tmp_path / "a" / "kv").rename(tmp_path / "a" / "kv-elsewhere")  # what host B sees: none of A's files
    host_b = _open("sync", tmp_path / "b", db_url)
    report = host_b.reconcile()  # (on PostgreSQL, B builds its own index: vectors_added)
    assert (report.kv_rows_removed, report.kv_files_removed, report.kv_rows_kept) == (0, 0, len(rows))
    host_b.close()
    (tmp_path / "a" / "kv-elsewhere").rename(tmp_path / "a" / "kv")
    host_a = _open("sync", tmp_path / "a", db_url)
    assert host_a.reconcile() == ReconcileReport()  # before the fix: kv_files_removed=3, every file of A
    host_a.close()
    assert sorted((r.memory_id, r.location) for r in store.all_kv_entries()) == rows
    assert all(Path(location).exists() for _, location in rows)
    store.close()


def test_rows_of_another_hosts_k_v_folder_at_the_same_path_are_left_alone(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hosts on one database, each with its K/V folder at the same path on its own disk (the default data folder).
    A row's location could not tell them apart: B's reconcile deleted A's rows, whose files it cannot see, and then
    A removed every file as unaccounted for. Each folder now has its own id, which the rows record."""
    monkeypatch.setattr(inferscale.reconcile, "KV_ROW_GRACE_S", 0.0)
    kv = tmp_path / "kv"
    host_a = _open("sync", tmp_path, db_url, engine)
    for fact in FACTS[:2]:
        host_a.add(fact, user_id="maya", infer=False, encode_kv=True)
    host_a.close()
    store = MemoryStore(db_url)
    a_rows = sorted((r.memory_id, r.location, r.store_id) for r in store.all_kv_entries())
    a_id = DiskTier(kv).existing_store_id()
    assert a_id is not None and {row[2] for row in a_rows} == {a_id}
    kv.rename(tmp_path / "kv-of-a")  # host B's disk: the same path, none of A's files

    host_b = _open("sync", tmp_path, db_url, engine)
    report = host_b.reconcile()
    assert (report.kv_rows_removed, report.kv_files_removed, report.kv_rows_kept) == (0, 0, len(a_rows))
    b_memory = host_b.add(FACTS[2], user_id="maya", infer=False, encode_kv=True)["results"][0]["id"]
    host_b.close()
    b_id = DiskTier(kv).existing_store_id()
    assert b_id is not None and b_id != a_id
    b_rows = [(r.memory_id, r.location, r.store_id) for r in store.all_kv_entries() if r.memory_id == b_memory]
    assert b_rows and {row[2] for row in b_rows} == {b_id}
    kv.rename(tmp_path / "kv-of-b")
    (tmp_path / "kv-of-a").rename(kv)

    host_a = _open("sync", tmp_path, db_url)
    report = host_a.reconcile()
    assert (report.kv_rows_removed, report.kv_files_removed, report.kv_rows_kept) == (0, 0, len(b_rows))  # kept
    host_a.close()
    rows = sorted((r.memory_id, r.location, r.store_id) for r in store.all_kv_entries())
    assert rows == sorted([*a_rows, *b_rows])
    assert all(Path(location).exists() for _, location, _ in a_rows)
    store.close()


def test_a_copied_data_folder_is_judged_by_its_own_k_v_files(
    tmp_path: Path, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data folder copied (a backup, `cp -r`): its rows still name the original's files by absolute path, and its
    reconcile kept the row of a file gone from the copy because the original still held it, so the answer depended on
    whether another copy existed at the old path (portability tester). A row of this folder is judged by this folder's
    files alone."""
    monkeypatch.setattr(inferscale.reconcile, "KV_ROW_GRACE_S", 0.0)
    original = tmp_path / "original"
    host = open_client("sync", fake_config(original), engine=engine, embedder=HashEmbedder())
    for fact in FACTS[:2]:
        host.add(fact, user_id="maya", infer=False, encode_kv=True)
    host.close()
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    store = MemoryStore(f"sqlite:///{copy / 'memory.db'}")
    rows = store.all_kv_entries()
    assert rows and all(Path(r.location).is_relative_to(original) for r in rows)  # the original's paths
    gone = rows[0]
    (copy / Path(gone.location).relative_to(original)).unlink()
    copied = open_client("sync", fake_config(copy), engine=engine, embedder=HashEmbedder())
    report = copied.reconcile()
    copied.close()
    assert (report.kv_rows_removed, report.kv_rows_kept) == (1, 0)  # before the fix: (0, 0), the row kept
    assert sorted(r.id for r in store.all_kv_entries()) == sorted(r.id for r in rows if r.id != gone.id)
    assert Path(gone.location).exists()  # the original's file is not the copy's to touch
    store.close()


def test_a_row_without_a_folder_id_is_judged_by_its_location(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows written before folders had ids (store_id NULL): a row in this folder's path whose file is gone is
    deleted, a row under another path is kept."""
    monkeypatch.setattr(inferscale.reconcile, "KV_ROW_GRACE_S", 0.0)
    host = _open("sync", tmp_path, db_url, engine)
    ids = [host.add(fact, user_id="maya", infer=False, encode_kv=True)["results"][0]["id"] for fact in FACTS[:2]]
    host.close()
    store = MemoryStore(db_url)
    with store.engine.begin() as conn:
        conn.execute(text("update kv_entries set store_id = null"))
    rows = store.all_kv_entries()
    here = [r for r in rows if r.memory_id == ids[0]]
    elsewhere = [r for r in rows if r.memory_id == ids[1]]
    moved = {r.id: str(tmp_path / "other-host" / Path(r.location).relative_to(tmp_path)) for r in elsewhere}
    with store.engine.begin() as conn:
        for row_id, location in moved.items():
            conn.execute(text("update kv_entries set location = :to where id = :id"), {"to": location, "id": row_id})
    for row in rows:
        Path(row.location).unlink()
    host = _open("sync", tmp_path, db_url)
    report = host.reconcile()
    host.close()
    assert (report.kv_rows_removed, report.kv_rows_kept) == (len(here), len(elsewhere))
    kept = sorted((r.id, r.memory_id, r.location, r.store_id) for r in store.all_kv_entries())
    assert kept == sorted((r.id, ids[1], moved[r.id], None) for r in elsewhere)
    store.close()
