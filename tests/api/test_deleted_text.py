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
from served_kv import fresh_as_served
from sqlalchemy import create_engine, select
from tiny_models import tiny_engine

from inferscale.engines.base import Generation
from inferscale.kv.fact import FactKV
from inferscale.storage.models import KVEntryRow


@pytest.fixture(scope="module")
def engine() -> Any:
    """A tiny float32 Llama with a byte-level tokenizer: real K/V, no model download."""
    return tiny_engine("llama")


def kv_rows(url: str, memory_ids: Sequence[str]) -> list[str]:
    """The memory ids of the ``kv_entries`` rows of ``memory_ids``, read straight from the database."""
    sql = create_engine(url)
    try:
        with sql.connect() as conn:
            return list(conn.scalars(select(KVEntryRow.memory_id).where(KVEntryRow.memory_id.in_(memory_ids))))
    finally:
        sql.dispose()


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
    each the K/V a fresh encoding after its remaining context gives. X, stored before A, is untouched."""
    if kind == "async":
        pytest.importorskip("aiosqlite", reason="the async client needs aiosqlite (pip install aiosqlite)")
    c = open_client(kind, fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    try:
        texts = ["X: the desk opens at 8", 'A: door code "12%_34" is secret, café 😀', "B: likes tea", "C: owns a cat"]
        x, a, b, later = (c.add(t, user_id="u1", infer=False, encode_kv=True)["results"][0]["id"] for t in texts)
        before = {i: c.db.get(i) for i in (x, b, later)}
        assert [before[i].context for i in (b, later)] == [texts[:2], texts[:3]]  # type: ignore[union-attr]
        store_dir = c.fact_kv.store.directory
        assert store_dir is not None and (store_dir / b).is_dir()  # encoded after A, on disk
        if change == "delete":
            c.delete(a)
        else:
            c.update(a, "A: the door code was changed")

        expected = {x: [], b: [texts[0]], later: [texts[0], texts[2]]}
        assert {i: c.db.get(i).context for i in expected} == expected  # type: ignore[union-attr]
        assert kv_rows(db_url, [b, later]) == []  # the old context's entries went with the change
        assert not (store_dir / b).exists() and not (store_dir / later).exists()
        assert (store_dir / x).is_dir()  # its context never held A: kept

        served = injected(c, [x, b, later], "u1", monkeypatch)
        want = [dataclasses.replace(before[i], context=expected[i]) for i in (x, b, later)]  # type: ignore[type-var]
        fresh = fresh_as_served(c.engine, c.fact_kv, want)
        assert len(served) == 3
        for got, ref in zip(served, fresh, strict=True):
            assert torch.allclose(got.keys.cpu(), ref.keys, atol=1e-5, rtol=1e-4)
            assert torch.allclose(got.values.cpu(), ref.values, atol=1e-5, rtol=1e-4)
        assert sorted(kv_rows(db_url, [b, later])) == sorted([b, later])  # encoded anew
    finally:
        c.close()
