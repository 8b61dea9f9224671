"""``prune_kv``: remove the stored K/V no chat of this client looks up (entries of another storage format, context
window or model fingerprint), from every tier and from ``kv_entries``, for a scope or the whole database; what this
client's chats look up stays, bit for bit, and another host's rows are left alone.

On a tiny float32 model with a byte-level tokenizer (fast, real encoding), sync and async clients, both databases.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import (
    AsyncMemoryClient,
    DatabaseUnavailableError,
    InvalidInputError,
    MemoryClient,
    MemoryConfig,
    ScopeError,
    kv_prepare,
    kv_prune,
)
from inferscale.config import KVConfig
from inferscale.kv.tiers import DiskTier, KVFormatError
from inferscale.kv_prune import KVPruneReport
from inferscale.storage import KVEntryRecord
from inferscale.storage.queries import kv_entries_of

MAYA = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara teaches in Madrid."]
BOB = ["I play the cello.", "My cat is called Miso."]


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def _config(data_dir: Path, db_url: str, **kv: Any) -> MemoryConfig:
    return MemoryConfig(data_dir=str(data_dir), db_url=db_url, kv=KVConfig(encode_on_add="lazy", **kv))


@contextmanager
def _client(kind: str, config: MemoryConfig, engine: Any) -> Iterator[Any]:
    """A sync client, or an async one whose coroutines are run to the end (``client.call``)."""
    runner = asyncio.Runner() if kind == "async" else None
    cls = AsyncMemoryClient if kind == "async" else MemoryClient
    client: Any = cls(config, engine=engine, embedder=HashEmbedder())
    client.call = (lambda result: result) if runner is None else runner.run
    try:
        yield client
    finally:
        client.call(client.close())
        if runner is not None:
            runner.close()


def _add(client: Any, texts: list[str], user_id: str) -> list[str]:
    added = client.call(client.add([{"role": "user", "content": t} for t in texts], user_id=user_id, infer=False))
    return [r["id"] for r in added["results"]]


def _rows(client: Any, memory_ids: list[str]) -> list[KVEntryRecord]:
    rows: list[KVEntryRecord] = client.db.run_read(kv_entries_of, memory_ids)
    return rows


def _int8(row: KVEntryRecord) -> bool:
    return ";kv=int8:" in row.encoding_key


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_after_a_switch_to_int8_prune_removes_the_model_dtype_entries_of_the_scope_then_of_the_rest(
    kind: str, tmp_path: Path, db_url: str, engine: Any
) -> None:
    with _client("sync", _config(tmp_path, db_url), engine) as client:
        maya, bob = _add(client, MAYA, "maya"), _add(client, BOB, "bob")
        client.prepare_kv()
        before = _rows(client, [*maya, *bob])
    assert before and not any(_int8(row) for row in before)

    with _client(kind, _config(tmp_path, db_url, storage_format="int8"), engine) as client:
        assert client.call(client.prepare_kv()).encoded == 5
        fact_kv = client.derived.fact_kv
        served = {key: fact_kv.store.get(key) for key in _served(client, maya)}
        old_maya = [row for row in before if row.memory_id in maya]

        report = client.call(client.prune_kv(user_id="maya"))
        assert report == KVPruneReport(
            memories=3,
            entries_removed=len(old_maya),  # a new client: the model-dtype entries are on disk alone
            rows_removed=len(old_maya),
            bytes_removed=sum(row.nbytes for row in old_maya),
        )
        assert all(_int8(row) for row in _rows(client, maya))
        assert {(row.memory_id, row.encoding_key) for row in _rows(client, maya)} == {
            (key.memory_id, key.encoding_key) for key in served
        }
        assert [row for row in _rows(client, bob) if not _int8(row)] == [r for r in before if r.memory_id in bob]
        _assert_files_match_rows(client, [*maya, *bob])
        assert client.derived.missing_kv([*maya, *bob]) == []  # nothing this client serves was removed
        for key, fact in served.items():  # and what it serves is what it served before the prune
            kept = fact_kv.store.get(key)
            assert fact is not None and kept is not None
            assert torch.equal(kept.keys, fact.keys) and torch.equal(kept.values, fact.values)

        assert client.call(client.prune_kv()).rows_removed == len(before) - len(old_maya)
        assert all(_int8(row) for row in _rows(client, [*maya, *bob]))
        _assert_files_match_rows(client, [*maya, *bob])
        assert client.call(client.prune_kv()) == KVPruneReport(5, 0, 0, 0)  # nothing left to remove


def _served(client: Any, memory_ids: list[str]) -> set[Any]:
    records = list(client.db.get_many(memory_ids).values())
    keys: set[Any] = client.derived.fact_kv.served_keys(records)
    return keys


def _assert_files_match_rows(client: Any, memory_ids: list[str]) -> None:
    """The K/V files of ``memory_ids`` on disk are those their ``kv_entries`` rows name, one for one."""
    on_disk = DiskTier(Path(client.derived.fact_kv.store.directory)).keys()
    rows = {(row.memory_id, row.encoding_key) for row in _rows(client, memory_ids)}
    assert {(key.memory_id, key.encoding_key) for key in on_disk if key.memory_id in memory_ids} == rows


def test_prune_on_a_store_under_its_own_settings_removes_nothing(tmp_path: Path, db_url: str, engine: Any) -> None:
    with _client("sync", _config(tmp_path, db_url), engine) as client:
        ids = _add(client, MAYA, "maya")
        client.prepare_kv()
        rows = _rows(client, ids)
        assert client.prune_kv() == KVPruneReport(memories=3, entries_removed=0, rows_removed=0, bytes_removed=0)
        assert _rows(client, ids) == rows and client.derived.missing_kv(ids) == []


def test_a_context_window_change_prunes_the_old_windows_entries_and_pages_give_the_same_result(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every w=2 entry is pruned under w=0: the in-context ones of the memories with turns, and the one entry of the
    first memory, which has none (its key names w=2 all the same); the context-free entries are w=0's own and stay.
    Checked two memories at a time."""
    monkeypatch.setattr(kv_prune, "PAGE_SIZE", 2)
    with _client("sync", _config(tmp_path, db_url, context_window=2), engine) as client:
        ids = _add(client, MAYA, "maya")
        client.prepare_kv()
        with_w2 = [row for row in _rows(client, ids) if ";w=2;" in row.encoding_key]
        context_free = [row for row in _rows(client, ids) if ";w=0;" in row.encoding_key]
    assert [row.memory_id for row in with_w2] == ids and [row.memory_id for row in context_free] == ids[1:]
    with _client("sync", _config(tmp_path, db_url, context_window=0), engine) as client:
        assert client.derived.missing_kv(ids) == ids[:1]
        assert client.prepare_kv().encoded == 1
        assert client.prune_kv() == KVPruneReport(
            memories=3, entries_removed=3, rows_removed=3, bytes_removed=sum(row.nbytes for row in with_w2)
        )
        assert [row for row in _rows(client, ids) if ";w=2;" in row.encoding_key] == []
        assert [row for row in _rows(client, ids) if row in context_free] == context_free
        assert client.derived.missing_kv(ids) == []
        _assert_files_match_rows(client, ids)


def test_a_row_of_another_hosts_kv_folder_is_left_to_it(tmp_path: Path, db_url: str, engine: Any) -> None:
    """Two hosts share the database, each with its own K/V folder: one host's prune deletes neither the other's
    files (it cannot see them) nor their rows."""
    with _client("sync", _config(tmp_path / "host-a", db_url), engine) as client:
        ids = _add(client, MAYA[:1], "maya")
        client.prepare_kv()
        theirs = _rows(client, ids)
    with _client("sync", _config(tmp_path / "host-b", db_url, storage_format="int8"), engine) as client:
        client.prepare_kv()
        report = client.prune_kv()
        assert (report.entries_removed, report.rows_removed) == (0, 0)
        assert [row for row in _rows(client, ids) if not _int8(row)] == theirs
    assert len(DiskTier(tmp_path / "host-a" / "kv").keys()) == len(theirs)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_dry_run_removes_nothing_and_reports_what_the_prune_then_removes(
    kind: str, tmp_path: Path, db_url: str, engine: Any
) -> None:
    with _client("sync", _config(tmp_path, db_url), engine) as client:
        ids = _add(client, MAYA, "maya")
        client.prepare_kv()
    with _client(kind, _config(tmp_path, db_url, storage_format="int8"), engine) as client:
        client.call(client.prepare_kv())
        rows = _rows(client, ids)
        kv_dir = Path(client.derived.fact_kv.store.directory)
        files = {path: path.read_bytes() for path in kv_dir.rglob("*") if path.is_file()}

        dry = client.call(client.prune_kv(user_id="maya", dry_run=True))
        assert _rows(client, ids) == rows
        assert {path: path.read_bytes() for path in kv_dir.rglob("*") if path.is_file()} == files
        done = client.call(client.prune_kv(user_id="maya"))
        assert not done.dry_run and done.rows_removed == len([row for row in rows if not _int8(row)]) > 0
        assert dry == dataclasses.replace(done, dry_run=True)
        assert client.call(client.prune_kv(dry_run=True)) == KVPruneReport(3, 0, 0, 0, dry_run=True)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("dry_run", [1, "yes", None])
def test_a_dry_run_flag_that_is_not_a_bool_is_refused(
    kind: str, dry_run: Any, tmp_path: Path, db_url: str, engine: Any
) -> None:
    """``dry_run="no"`` would be truthy: refused, not taken for a prune or a dry run."""
    with _client(kind, _config(tmp_path, db_url), engine) as client:
        _add(client, MAYA[:1], "maya")
        with pytest.raises(InvalidInputError, match="dry_run must be True or False"):
            client.call(client.prune_kv(dry_run=dry_run))


def test_a_bad_scope_id_is_refused_before_anything_is_removed(tmp_path: Path, db_url: str, engine: Any) -> None:
    with _client("sync", _config(tmp_path, db_url), engine) as client, pytest.raises(ScopeError, match="user_id"):
        client.prune_kv(user_id="")


def test_a_damaged_store_id_file_is_refused_before_any_file_or_row_goes(
    tmp_path: Path, db_url: str, engine: Any
) -> None:
    """A review's find: the files went first and the folder's id was read after, so a damaged id file left rows
    without their files (files 0, rows 1)."""
    with _client("sync", _config(tmp_path, db_url), engine) as client:
        ids = _add(client, MAYA[:1], "maya")
        client.prepare_kv()
    with _client("sync", _config(tmp_path, db_url, storage_format="int8"), engine) as client:
        client.prepare_kv()
        rows = _rows(client, ids)
        kv_dir = Path(client.derived.fact_kv.store.directory)
        (kv_dir / "store-id").write_text("not an id")
        with pytest.raises(KVFormatError, match="store-id"):
            client.prune_kv()
        assert _rows(client, ids) == rows and len(DiskTier(kv_dir).keys()) == len(rows)


def test_a_failed_cleanup_of_older_entries_leaves_what_was_just_stored_stored(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's find: the cleanup of older-format entries after a store reads files' headers and SQL now, and an
    error of it other than an OSError (a database gone away is one) escaped the store, failing a chat whose K/V were
    stored. Each is logged; what was stored stays."""
    with _client("sync", _config(tmp_path, db_url), engine) as client:
        ids = _add(client, MAYA, "maya")
        fact_kv = client.derived.fact_kv

        def a_copy_went(*args: Any, **kwargs: Any) -> int:
            return 1  # an older entry's file removed: its rows are read next

        def database_gone(*args: Any, **kwargs: Any) -> Any:
            raise DatabaseUnavailableError("the database went away")

        def header_unreadable(*args: Any, **kwargs: Any) -> Any:
            raise KVFormatError("a header from elsewhere")

        monkeypatch.setattr(fact_kv.store, "prune", a_copy_went)
        monkeypatch.setattr(fact_kv, "_prune_rows", database_gone)
        assert client.prepare_kv(user_id="maya") == kv_prepare.KVPrepareReport(memories=3, encoded=3, left=())
        monkeypatch.setattr(fact_kv.store, "prune", header_unreadable)
        more = _add(client, BOB[:1], "bob")
        assert client.prepare_kv(user_id="bob").encoded == 1
        assert client.derived.missing_kv([*ids, *more]) == []


def test_a_store_with_no_older_entry_to_remove_reads_no_rows_for_it(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each store (a chat's encode on a miss among them) cleans up its memories' older-format entries; their rows are
    read only where a copy went, so the common store adds no SQL read to the chat's path."""
    with _client("sync", _config(tmp_path, db_url), engine) as client:
        ids = _add(client, MAYA, "maya")
        fact_kv = client.derived.fact_kv
        calls: list[Any] = []
        monkeypatch.setattr(fact_kv, "_prune_rows", lambda *args: calls.append(args) or [])
        assert client.prepare_kv().encoded == 3 and calls == []
        assert client.derived.missing_kv(ids) == []
