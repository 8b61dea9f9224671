"""The stores derived from SQL (the FAISS index and the facts' K/V) and the steps that read them.

SQL is the source of truth; the vector index and the K/V store are rebuilt or re-encoded from it. This module
owns them for both clients:

- :meth:`DerivedStores.after_write` brings them in step with committed changes;
- :meth:`DerivedStores.search_steps` is the scoped top-k search, and :meth:`DerivedStores.similar_steps` the
  similar-memory step of ``add`` (the stored memories the reconcile LLM is shown).

The two read steps need SQL between their computations (the scope's vector ids, the records of the hits). They
are written once, as generators that yield a :class:`StoreRead` and receive its result: :func:`run_steps` drives
them over the sync :class:`~inferscale.storage.MemoryStore`, and :func:`arun_steps` over the async store, with
SQL awaited on the event loop and every computation (embedding, FAISS) run in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np

from inferscale.config import MemoryConfig
from inferscale.engines.base import Engine
from inferscale.fact_kv import FactKVManager
from inferscale.filters import Filter
from inferscale.kv.fact import FactKV
from inferscale.kv.store import KVStore, KVStoreStats
from inferscale.retrieval import Embedder, VectorIndex
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord, MemoryStore
from inferscale.storage.changes import AppliedChanges

if TYPE_CHECKING:
    from inferscale.storage.async_store import AsyncMemoryStore

log = logging.getLogger(__name__)

R = TypeVar("R")
T_co = TypeVar("T_co", covariant=True)

INDEX_SAVE_INTERVAL_S = 5.0
"""The index file is rewritten at most this often while writing (and always on ``close``); SQL stays the truth."""


# ---------------------------------------------------------------------------------------------------- SQL reads


class StoreRead(Protocol[T_co]):
    """One SQL read a step needs, runnable on either store."""

    def run(self, store: MemoryStore) -> T_co:
        """The result, read through the sync store."""
        ...

    async def arun(self, store: AsyncMemoryStore) -> T_co:
        """The same result, read through the async store."""
        ...


@dataclass(frozen=True, slots=True)
class VectorIdsInScope:
    """The vector ids of the memories of ``scope`` matching ``node``: int64 ``[n]``, ascending."""

    scope: Scope
    node: Filter | None = None

    def run(self, store: MemoryStore) -> np.ndarray:
        return store.vector_ids_in_scope(self.scope, self.node)

    async def arun(self, store: AsyncMemoryStore) -> np.ndarray:
        return await store.vector_ids_in_scope(self.scope, self.node)


@dataclass(frozen=True, slots=True)
class RecordsByVectorId:
    """The memories whose vector id is in ``ids``, keyed by vector id (unknown ids left out)."""

    ids: tuple[int, ...]

    def run(self, store: MemoryStore) -> dict[int, MemoryRecord]:
        return store.by_vector_ids(self.ids)

    async def arun(self, store: AsyncMemoryStore) -> dict[int, MemoryRecord]:
        return await store.by_vector_ids(self.ids)


@dataclass(frozen=True, slots=True)
class StoredText:
    """The oldest memory of exactly ``scope`` whose text hashes to ``text_hash``, or ``None``
    (:meth:`MemoryStore.find_by_hash`)."""

    scope: Scope
    text_hash: str

    def run(self, store: MemoryStore) -> MemoryRecord | None:
        return store.find_by_hash(self.text_hash, self.scope)

    async def arun(self, store: AsyncMemoryStore) -> MemoryRecord | None:
        return await store.find_by_hash(self.text_hash, self.scope)


@dataclass(frozen=True, slots=True)
class LatestMemories:
    """The ``limit`` memories of exactly ``scope`` stored last, oldest first (:meth:`MemoryStore.latest`)."""

    scope: Scope
    limit: int

    def run(self, store: MemoryStore) -> list[MemoryRecord]:
        return store.latest(self.scope, self.limit)

    async def arun(self, store: AsyncMemoryStore) -> list[MemoryRecord]:
        return await store.latest(self.scope, self.limit)


@dataclass(frozen=True, slots=True)
class AllMemories:
    """Every stored memory, in vector-id order (to rebuild the index)."""

    def run(self, store: MemoryStore) -> list[MemoryRecord]:
        return store.all_memories()

    async def arun(self, store: AsyncMemoryStore) -> list[MemoryRecord]:
        return await store.all_memories()


Steps = Generator[StoreRead[Any], Any, R]
"""A step that yields the SQL reads it needs and returns ``R``."""


def run_steps(steps: Steps[R], store: MemoryStore) -> R:
    """Drive ``steps`` over the sync store (in the caller's thread)."""
    try:
        read = next(steps)
        while True:
            read = steps.send(read.run(store))
    except StopIteration as done:
        result: R = done.value
        return result


@dataclass(frozen=True, slots=True)
class _Done(Generic[R]):
    """A finished step's result."""

    value: R


def _advance(steps: Steps[R], value: Any) -> StoreRead[Any] | _Done[R]:
    """One step forward: the next read, or the result when the step is done."""
    try:
        return steps.send(value)
    except StopIteration as done:
        return _Done(done.value)


async def arun_steps(steps: Steps[R], store: AsyncMemoryStore) -> R:
    """Drive ``steps`` over the async store: SQL awaited on the event loop, computations in a worker thread."""
    state = await asyncio.to_thread(_advance, steps, None)
    while not isinstance(state, _Done):
        value = await state.arun(store)
        state = await asyncio.to_thread(_advance, steps, value)
    return state.value


# ---------------------------------------------------------------------------------------------------- the stores


class DerivedStores:
    """The vector index and the facts' K/V of one client, kept in step with SQL.

    Built without I/O: the index is loaded on the first step that needs it, the embedder and the engine are asked
    for only when a step needs them (a search never loads the chat model). Thread-safe.

    Args:
        config: the client's configuration (index path, KV directory and budgets, reconcile top-k).
        db: the sync SQL store, for the ``kv_entries`` rows written while encoding.
        embedder: returns the sentence embedder (built lazily by the client).
        engine: returns the chat engine (built lazily by the client).
        index_path: the index file.
        kv_dir: the directory of the disk K/V tier.
        lock: the client's lock (reentrant). One lock for the client and its derived stores: the steps call back
            into the client's lazy parts (embedder, engine), which take it too.
    """

    def __init__(
        self,
        config: MemoryConfig,
        db: Callable[[], MemoryStore],
        embedder: Callable[[], Embedder],
        engine: Callable[[], Engine],
        index_path: Path,
        kv_dir: Path,
        lock: threading.RLock,
    ) -> None:
        self._config = config
        self._db = db
        self._embedder = embedder
        self._engine = engine
        self._index_path = index_path
        self._kv_dir = kv_dir
        self._lock = lock
        self._index: VectorIndex | None = None
        self._index_dirty = False
        self._index_saved_at = 0.0
        self._fact_kv: FactKVManager | None = None

    # ---- the index --------------------------------------------------------------------------------------------
    def index_steps(self) -> Steps[VectorIndex]:
        """The index: loaded from its file on first use, and rebuilt from SQL when its ids disagree with it."""
        if self._index is not None:
            return self._index
        records: list[MemoryRecord] = yield AllMemories()
        with self._lock:
            if self._index is None:
                self._index = self._load_index(records)
            return self._index

    def _load_index(self, records: Sequence[MemoryRecord]) -> VectorIndex:
        embedder = self._embedder()
        index = VectorIndex.open(self._index_path, embedder.dim)
        if sorted(int(i) for i in index.ids()) != sorted(r.vector_id for r in records):
            log.info("rebuilding the vector index from %d stored memories", len(records))
            index = VectorIndex(embedder.dim, self._index_path)
            self._embed_into(index, records)
            index.save()
            self._index_dirty = False
        return index

    def _embed_into(self, index: VectorIndex, records: Sequence[MemoryRecord]) -> None:
        """Embed ``records`` and put them in ``index`` (replacing the vectors of ids already there)."""
        if records:
            ids = np.array([r.vector_id for r in records], dtype=np.int64)
            index.add(ids, self._embedder().embed([r.text for r in records]))
            self._index_dirty = True

    def _catch_up_steps(self, index: VectorIndex, allowed: np.ndarray) -> Steps[None]:
        """Embed memories that another client (thread or process) stored after this index was loaded."""
        with self._lock:
            missing = np.setdiff1d(allowed, index.ids(), assume_unique=True)
        if missing.size:
            records: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(int(i) for i in missing))
            with self._lock:
                self._embed_into(index, list(records.values()))

    def save_index(self, force: bool = False) -> None:
        """Write the index file when it changed, at most every :data:`INDEX_SAVE_INTERVAL_S` unless ``force``."""
        with self._lock:
            now = time.monotonic()
            due = force or now - self._index_saved_at >= INDEX_SAVE_INTERVAL_S
            if self._index is not None and self._index_dirty and due:
                self._index.save()
                self._index_dirty = False
                self._index_saved_at = now

    # ---- the read steps ---------------------------------------------------------------------------------------
    def search_steps(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None = None
    ) -> Steps[list[tuple[MemoryRecord, float]]]:
        """The top-``limit`` memories of ``scope`` matching ``node`` by cosine similarity to ``query``, best first,
        with their scores; those scoring below ``threshold`` are left out. The filter restricts the FAISS search
        itself, so the top-k is taken within the matching set."""
        if limit == 0:
            return []
        allowed: np.ndarray = yield VectorIdsInScope(scope, node)
        if allowed.size == 0:
            return []
        index = yield from self.index_steps()
        yield from self._catch_up_steps(index, allowed)
        with self._lock:
            hits = index.search(self._embedder().embed([query])[0], limit, allowed_ids=allowed)
        if threshold is not None:
            hits = [(vid, score) for vid, score in hits if score >= threshold]
        records: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(vid for vid, _ in hits))
        return [(records[vid], float(score)) for vid, score in hits if vid in records]

    def similar_steps(self, scope: Scope, facts: Sequence[str]) -> Steps[list[tuple[str, str]]]:
        """``(memory_id, text)`` of the memories of ``scope`` most similar to any of ``facts`` (the top
        ``llm.reconcile_top_k`` of each), oldest first: what the reconcile LLM is shown."""
        allowed: np.ndarray = yield VectorIdsInScope(scope)
        if allowed.size == 0:
            return []
        index = yield from self.index_steps()
        yield from self._catch_up_steps(index, allowed)
        found: set[int] = set()
        with self._lock:
            for vector in self._embedder().embed(list(facts)):
                found.update(i for i, _ in index.search(vector, self._config.llm.reconcile_top_k, allowed))
        records: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(sorted(found)))
        return [(r.id, r.text) for r in sorted(records.values(), key=lambda r: (r.created_at, r.vector_id))]

    # ---- after a write ----------------------------------------------------------------------------------------
    def after_write(self, index: VectorIndex, applied: AppliedChanges, encode_kv: bool) -> None:
        """Bring the index and the K/V in step with committed changes.

        Deleted memories lose their vector and K/V. A memory whose text changed is embedded again and loses its
        K/V (encoded again from the new text on next use, or now with ``encode_kv``); a metadata-only update
        changes neither. New memories are embedded, and encoded now with ``encode_kv``. A memory whose stored
        context lost a deleted or re-worded text (``applied.recontexted``) keeps its vector and loses its K/V, files
        of every key included (those of the old context's key could never be looked up again): they are encoded
        again under the new context's key on next use, or now with ``encode_kv``.

        Args:
            index: the loaded index (from :meth:`index_steps`).
            applied: what the transaction did.
            encode_kv: encode the new, re-worded and re-contexted memories' K/V now (eager) rather than on first
                ``chat``.
        """
        retexted = [after for before, after in applied.updated if before.hash != after.hash]
        with self._lock:
            gone = [r.vector_id for r in applied.deleted]
            if gone:
                index.remove(np.array(gone, dtype=np.int64))
                self._index_dirty = True
            self._embed_into(index, [*retexted, *applied.added])
            self._forget_kv(list(dict.fromkeys(r.id for r in [*applied.deleted, *retexted, *applied.recontexted])))
        fresh = {r.id: r for r in [*retexted, *applied.recontexted, *applied.added]}  # the latest record of each
        if encode_kv and fresh:
            self.fact_kv.prepare(list(fresh.values()))
        self.save_index()

    def _forget_kv(self, memory_ids: Sequence[str]) -> None:
        """Drop the K/V tensors of deleted, re-worded or re-contexted memories from every tier (every key of each:
        memory, host and disk; files other processes wrote included). Their ``kv_entries`` rows were
        deleted by the transaction that made the change (:func:`inferscale.storage.changes.apply_in_session`), so
        no SQL runs here."""
        if not memory_ids:
            return
        # Without a K/V manager the engine is not loaded and only the disk tier can hold them.
        store = self._fact_kv.store if self._fact_kv is not None else KVStore(self._kv_dir)
        for memory_id in memory_ids:
            store.delete_memory(memory_id)

    def release_kv(self) -> None:
        """Drop the K/V manager (and with it the engine it holds and the memory tiers' tensors); the disk tier and
        the index stay. The next K/V use builds it again."""
        with self._lock:
            self._fact_kv = None

    def reset(self) -> None:
        """An empty index (saved) and no stored K/V; the caller has already emptied SQL."""
        with self._lock:
            index = VectorIndex(self._embedder().dim, self._index_path)
            index.save()
            self._index = index
            self._index_dirty = False
            KVStore(self._kv_dir).clear()
            if self._fact_kv is not None:
                self._fact_kv.clear()

    # ---- K/V --------------------------------------------------------------------------------------------------
    @property
    def fact_kv(self) -> FactKVManager:
        """The facts' K/V: tiered store plus encoder (builds the engine on first use)."""
        with self._lock:
            if self._fact_kv is None:
                engine = self._engine()
                kv = self._config.kv
                store = KVStore(
                    self._kv_dir,
                    host_budget_bytes=kv.host_budget_bytes,
                    device=engine.device,
                    device_budget_bytes=kv.device_budget_bytes,
                )
                self._fact_kv = FactKVManager(engine, store, self._db(), kv)
            return self._fact_kv

    def kv_stats(self) -> KVStoreStats | None:
        """The K/V store's counters (hits per tier, misses, sizes) since it was built, or ``None`` while no K/V has
        been used (nothing is built or loaded to answer). The counters start again when the store is rebuilt
        (:meth:`release_kv`)."""
        with self._lock:
            fact_kv = self._fact_kv
        return fact_kv.store.stats() if fact_kv is not None else None

    def memory_kv(self, records: Sequence[MemoryRecord]) -> list[FactKV]:
        """The K/V of ``records`` as served in this order (stored ones loaded, missing ones encoded and stored)."""
        return self.fact_kv.ensure(list(records))
