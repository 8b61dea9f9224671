"""A deletion stays deleted in the K/V too: a memory's context (context-window encoding) holds the texts of the
memories stored before it in its scope, and used to keep a deleted or re-worded one's text, so the K/V injected for
the memories after it were still encoded after that text. Now the text leaves their stored context in the deleting
transaction, and their K/V (rows, tensors, files) go with it and are encoded again.

On the sync and async clients, each on SQLite and PostgreSQL, with a tiny real model: the K/V a chat injects are
compared with a fresh encoding after the expected context (:mod:`inferscale.storage.contexts` gives the rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from client_adapter import ClientAdapter, ClientKind, open_client
from mem0_fakes import HashEmbedder, fake_config
from served_kv import context_free_request, fresh_as_served
from sqlalchemy import create_engine, select
from tiny_models import tiny_engine

from inferscale.engines.base import Generation
from inferscale.fact_kv import CONTEXT_FREE, IN_CONTEXT
from inferscale.kv.fact import FactKV
from inferscale.storage.models import KVEntryRow


@pytest.fixture(scope="module")
def engine() -> Any:
    """A tiny float32 Llama with a byte-level tokenizer: real K/V, no model download."""
    return tiny_engine("llama")


def kv_rows(url: str, memory_ids: Sequence[str]) -> dict[str, list[str]]:
    """The encoding keys of the ``kv_entries`` rows of each of ``memory_ids`` (sorted; ``[]`` for none), read
    straight from the database."""
    sql = create_engine(url)
    try:
        with sql.connect() as conn:
            query = select(KVEntryRow.memory_id, KVEntryRow.encoding_key).where(KVEntryRow.memory_id.in_(memory_ids))
            rows = conn.execute(query).all()
    finally:
        sql.dispose()
    return {i: sorted(key for memory_id, key in rows if memory_id == i) for i in memory_ids}


def kv_files(store_dir: Path, memory_id: str) -> dict[str, bytes]:
    """The K/V files of ``memory_id`` on disk, by name, with their bytes."""
    folder = store_dir / memory_id
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.safetensors"))} if folder.is_dir() else {}


def injected(c: ClientAdapter, memory_ids: list[str], user_id: str, monkeypatch: pytest.MonkeyPatch) -> list[FactKV]:
    """The K/V a kv-mode chat over ``memory_ids`` hands the engine (generation replaced by an empty answer)."""
    handed: list[FactKV] = []

    def stream_kv(conversation: Any, facts: Sequence[FactKV], *args: Any, **kwargs: Any) -> Any:
        handed.extend(facts)
        yield Generation("", [], 0.0, 0.0, 0.0, prompt_tokens=0, memory_tokens=0)

    with monkeypatch.context() as patch:
        patch.setattr(c.engine, "stream_kv", stream_kv)
        c.chat("Which notes do I have?", user_id=user_id, memory_ids=memory_ids, max_new_tokens=1)
    return handed


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("change", ["delete", "update"])
def test_a_deleted_or_reworded_text_leaves_the_later_memories_context_and_kv(
    tmp_path: Path, db_url: str, kind: ClientKind, change: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X, A, B, C stored in that order in one scope (K/V encoded at once): B is encoded after X and A, C after X, A
    and B. Deleting A, or re-wording it, takes A's text out of B's and C's stored context (the new wording is not
    put in: it is no text they were encoded after) and drops their K/V entries and files, so a chat injects for
    each the K/V a fresh encoding after its remaining context gives. X, stored before A, is untouched. Their
    context-free K/V (``kv.first_memory_context_free``: encoded after no turn) never depended on A and stay, rows
    and files, unencoded again."""
    c = open_client(kind, fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    try:
        texts = ["X: the desk opens at 8", 'A: door code "12%_34" is secret, café 😀', "B: likes tea", "C: owns a cat"]
        x, a, b, later = (c.add(t, user_id="u1", infer=False, encode_kv=True)["results"][0]["id"] for t in texts)
        before = {i: c.db.get(i) for i in (x, b, later)}
        assert [before[i].context for i in (b, later)] == [texts[:2], texts[:3]]  # type: ignore[union-attr]
        store_dir = c.fact_kv.store.directory
        assert store_dir is not None and (store_dir / b).is_dir()  # encoded after A, on disk
        free_key = c.fact_kv.encoding_key(before[b], CONTEXT_FREE)
        free_files = {i: kv_files(store_dir, i) for i in (b, later)}
        assert all(len(files) == 2 for files in free_files.values())  # in context and context-free
        if change == "delete":
            c.delete(a)
        else:
            c.update(a, "A: the door code was changed")

        expected = {x: [], b: [texts[0]], later: [texts[0], texts[2]]}
        assert {i: c.db.get(i).context for i in expected} == expected  # type: ignore[union-attr]
        # the old context's entries went with the change; the context-free ones stay, files untouched
        assert kv_rows(db_url, [b, later]) == {b: [free_key], later: [free_key]}
        for i in (b, later):
            kept = kv_files(store_dir, i)
            assert len(kept) == 1 and kept.items() <= free_files[i].items()
        assert (store_dir / x).is_dir()  # its context never held A: kept

        served = injected(c, [x, b, later], "u1", monkeypatch)
        want = [dataclasses.replace(before[i], context=expected[i]) for i in (x, b, later)]  # type: ignore[type-var]
        fresh = fresh_as_served(c.engine, c.fact_kv, want)
        assert len(served) == 3
        for got, ref in zip(served, fresh, strict=True):
            assert torch.allclose(got.keys.cpu(), ref.keys, atol=1e-5, rtol=1e-4)
            assert torch.allclose(got.values.cpu(), ref.values, atol=1e-5, rtol=1e-4)
        rows = kv_rows(db_url, [b, later])  # the new context's entries beside the kept context-free ones
        assert all(len(keys) == 2 and free_key in keys for keys in rows.values()), rows
    finally:
        c.close()


def test_a_memory_whose_context_empties_loses_its_context_free_entry_and_only_in_context_kv_are_encoded_again(
    tmp_path: Path, db_url: str, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """X, A, B, C stored in one scope, every encoding stored. Deleting X and A empties B's context: B is then served
    after no turn under its in-context key, so its context-free entry (a second copy) goes with the rest; C keeps
    B's text, so its context-free entry stays. Encoding every memory's encodings again then encodes B once and C's
    in-context K/V alone (2 facts, not the 3 a drop of every entry would cost), each equal to a fresh encoding."""
    c = open_client("sync", fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    try:
        texts = ["X: the desk opens at 8", "A: the door code is 1234", "B: likes tea", "C: owns a cat"]
        x, a, b, later = (c.add(t, user_id="u1", infer=False, encode_kv=True)["results"][0]["id"] for t in texts)
        free_key = c.fact_kv.encoding_key(c.db.get(later), CONTEXT_FREE)  # type: ignore[arg-type]
        c.delete(x)
        c.delete(a)
        records = [c.db.get(i) for i in (b, later)]
        assert [r.context for r in records] == [[], [texts[2]]]  # type: ignore[union-attr]
        assert kv_rows(db_url, [b, later]) == {b: [], later: [free_key]}
        store_dir = c.fact_kv.store.directory
        assert store_dir is not None and kv_files(store_dir, b) == {} and len(kv_files(store_dir, later)) == 1

        encoded: list[int] = []
        encode_facts = c.engine.encode_facts
        monkeypatch.setattr(c.engine, "encode_facts", lambda reqs: encoded.append(len(reqs)) or encode_facts(reqs))
        c.fact_kv.prepare(records)
        assert sum(encoded) == 2
        for record in records:
            for encoding in (IN_CONTEXT, CONTEXT_FREE):
                stored = c.fact_kv.store.get(c.fact_kv.key(record, encoding))  # type: ignore[arg-type]
                assert stored is not None
                if encoding.context_free and record.context:  # type: ignore[union-attr]
                    request = context_free_request(c.engine, record.text)  # type: ignore[union-attr]
                else:
                    request = c.fact_kv.encode_request(record)
                (fresh,) = encode_facts([request])
                assert torch.equal(stored.keys, fresh.keys) and torch.equal(stored.values, fresh.values)
    finally:
        c.close()


def test_a_crash_between_the_scrub_and_the_file_cleanup_is_repaired_by_reconcile(
    tmp_path: Path, db_url: str, engine: Any
) -> None:
    """The scrub commits first and the client removes the files after it: a process that dies in between leaves
    the re-contexted memories' old in-context files without rows. Reconciliation removes them (and the deleted
    memory's folder) and keeps each context-free file, whose row the scrub kept."""
    c = open_client("sync", fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    try:
        texts = ["X: the desk opens at 8", "A: the door code is 1234", "B: likes tea", "C: owns a cat"]
        x, a, b, later = (c.add(t, user_id="u1", infer=False, encode_kv=True)["results"][0]["id"] for t in texts)
        store_dir = c.fact_kv.store.directory
        assert store_dir is not None
        free_key = c.fact_kv.encoding_key(c.db.get(b), CONTEXT_FREE)  # type: ignore[arg-type]
        c.db.delete(a)  # the transaction alone: what a crash right after the commit leaves
        assert all(len(kv_files(store_dir, i)) == 2 for i in (b, later))  # old in-context files still there
        report = c.reconcile()
        assert (report.kv_memories_removed, report.kv_files_removed, report.kv_rows_removed) == (1, 2, 0)
        assert not (store_dir / a).exists()
        assert kv_rows(db_url, [b, later]) == {b: [free_key], later: [free_key]}
        assert all(len(kv_files(store_dir, i)) == 1 for i in (b, later))
        assert (store_dir / x).is_dir()
    finally:
        c.close()
