"""The stores derived from SQL (the FAISS index and the facts' K/V) and the steps that read them.

SQL is the source of truth; the vector index and the K/V store are rebuilt or re-encoded from it. This module
owns them for both clients:

- :meth:`DerivedStores.after_write` brings them in step with committed changes, and
  :meth:`DerivedStores.queue_encoding` hands new memories to the background K/V encoder
  (:mod:`inferscale.encode_queue`; :meth:`DerivedStores.encode_queued` is its batch);
- :meth:`DerivedStores.reconcile_steps` repairs what a crash or another process left behind (run on first use, and
  by the clients' ``reconcile``; :mod:`inferscale.reconcile`): each vector is labelled with the text hash it was
  embedded from, so a stale one is found by comparing labels with SQL, and the index file records the embedder:
  an index that records another one, or none, is checked on a sample (:meth:`DerivedStores.settle_embedder`), and
  one of another model starts empty, so that every memory is embedded again;
- :meth:`DerivedStores.search_steps` is the scoped top-k search, and :meth:`DerivedStores.similar_steps` the
  similar-memory step of ``add`` (the stored memories the reconcile LLM is shown).

The steps need SQL between their computations; they are written once for both clients (:mod:`inferscale.steps`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path

import numpy as np

from inferscale.config import EncodeMode, MemoryConfig
from inferscale.encode_queue import EncodeQueue, StopCheck, interpreter_exiting
from inferscale.engines.base import Engine
from inferscale.fact_kv import FactKVManager, Pruned, Wanted
from inferscale.filters import Filter
from inferscale.kv.fact import FactKV
from inferscale.kv.fingerprint import survives_recontext
from inferscale.kv.store import KVStore, KVStoreStats
from inferscale.kv.tiers import DiskTier
from inferscale.reconcile import ReconcileReport, reconcile_steps
from inferscale.retrieval import Embedder, VectorIndex
from inferscale.retrieval.embedder import embed_checked, embedder_identity
from inferscale.scope import Scope
from inferscale.steps import RecordsByVectorId, Steps, Versions
from inferscale.storage import MemoryRecord, MemoryStore
from inferscale.storage.change_sets import AppliedChanges
from inferscale.storage.records import MemoryVersions

log = logging.getLogger(__name__)

PRUNE_CHUNK = 32
"""Memories whose unserved K/V entries :meth:`DerivedStores.prune_unserved` removes at a time."""

INDEX_SAVE_INTERVAL_S = 5.0
"""The index file is rewritten at most this often while writing (and always on ``close``); SQL stays the truth."""

INDEX_SAVE_TIMER_MAX_S = 86_400.0
"""The longest a put-off index save waits on its timer (a longer interval is waited out in several); threading's
timers cannot wait an unbounded time."""

SAME_EMBEDDER_COSINE = 0.999
"""A stored vector and a fresh embedding of its text with at least this cosine similarity come from one model (the
same model gives the same vector up to float rounding across batch shapes; another model of the same dimension
gives an unrelated one)."""

INDEX_SAVE_SHARE = 0.05
"""While writing, saves take at most about this share of the time: the interval between two stretches to the last
save's duration divided by it (a million 384-d vectors are a 1.5 GB file, ~10 s to write here: one save every few
minutes, not one per add). Vectors added since the last save are embedded again from SQL after a crash."""


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
        self._index_save_s = 0.0  # how long the last save took (seconds)
        self._index_save_timer: threading.Timer | None = None  # the save due when the interval is up
        self._fact_kv: FactKVManager | None = None
        self._encoder = EncodeQueue(self.encode_queued, config.kv.encode_batch_size, config.kv.encode_queue_size)
        self._foreground: set[int] = set()  # the tickets of the foreground uses running now (:meth:`foreground`)
        self._foreground_tickets = itertools.count()
        self._foreground_idle = threading.Condition()

    @property
    def lock(self) -> threading.RLock:
        """The client's lock, which guards the index and the K/V manager."""
        return self._lock

    @property
    def kv_dir(self) -> Path:
        """The directory of the disk K/V tier."""
        return self._kv_dir

    @property
    def index_path(self) -> Path:
        """The index file."""
        return self._index_path

    @property
    def index_in_use(self) -> bool:
        """Whether the index is loaded and in use: until it is, the first :meth:`index_steps` loads it, and the
        embedder, and embeds every memory it lacks (seconds of model work)."""
        return self._index is not None

    # ---- the index --------------------------------------------------------------------------------------------
    def index_steps(self) -> Steps[VectorIndex]:
        """The index: on first use, loaded from its file and reconciled with SQL, the K/V store with it
        (:meth:`reconcile_steps`)."""
        if self._index is None:
            yield from self.reconcile_steps()
        index = self._index
        if index is None:
            raise AssertionError("reconcile_steps loads the index")
        return index

    def open_index(self) -> VectorIndex:
        """The index in use, or, while none is, the one loaded from its file (or empty), not yet in use: no search
        sees it before :meth:`publish_index` (after its embedder is checked, :meth:`settle_embedder`).

        Raises:
            ConfigError: when the index file is not a readable FAISS index (delete it: it is rebuilt).
        """
        with self._lock:
            if self._index is not None:
                return self._index
            embedder = self._embedder()
            return VectorIndex.open(self._index_path, embedder.dim, self._config.search, embedder_identity(embedder))

    def publish_index(self, index: VectorIndex) -> VectorIndex:
        """Put ``index`` in use, unless one already is (another first use got there first); returns the one in
        use."""
        with self._lock:
            if self._index is None:
                self._index = index
            return self._index

    def embedder_identity(self) -> str:
        """The identity of this client's embedder (:func:`~inferscale.retrieval.embedder.embedder_identity`)."""
        return embedder_identity(self._embedder())

    def settle_embedder(self, index: VectorIndex, sample: Sequence[MemoryRecord]) -> VectorIndex:
        """The index to search, once ``index`` (loaded, recording another embedder's identity or none: an earlier
        version's) is checked against this client's embedder on ``sample``, some of its memories.

        The sample's texts are embedded again; when every vector labelled with its memory's current text matches
        (cosine >= :data:`SAME_EMBEDDER_COSINE`), the vectors are this embedder's (the same model, named another
        way) and the index records this identity. Otherwise, or when no sample vector can be compared, the
        vectors are another model's: the index starts empty, with a warning, and reconciliation embeds every
        memory again.
        """
        identity = self.embedder_identity()
        with self._lock:
            if len(index) and not self._same_vectors(index, sample):
                log.warning(
                    "the index %s holds vectors of another embedder (%s), not of %s: every memory is embedded again",
                    self._index_path,
                    index.embedder or "recorded by an earlier version",
                    identity,
                )
                index = VectorIndex(index.dim, self._index_path, self._config.search, identity)
            index.set_embedder(identity)
            self._index_dirty = True
            return index

    def _same_vectors(self, index: VectorIndex, sample: Sequence[MemoryRecord]) -> bool:
        """Whether ``index``'s vectors of ``sample`` (those labelled with their memory's current text) are what this
        client's embedder gives; ``False`` when there is none to compare."""
        ids = np.array([r.vector_id for r in sample], dtype=np.int64)
        current = [r for r, label in zip(sample, index.labels(ids), strict=True) if label == r.hash]
        if not current:
            return False
        stored = index.vectors(np.array([r.vector_id for r in current], dtype=np.int64))
        fresh = embed_checked(self._embedder(), [r.text for r in current])
        return bool(np.all(np.sum(stored * fresh, axis=1) >= SAME_EMBEDDER_COSINE))

    def remove_vectors(self, index: VectorIndex, ids: np.ndarray) -> int:
        """Remove the vectors of ``ids`` (int64 ``[n]``) from ``index``; returns how many were there."""
        with self._lock:
            removed = index.remove(ids)
            self._index_dirty = self._index_dirty or removed > 0
            return removed

    def embed_into(self, index: VectorIndex, records: Sequence[MemoryRecord]) -> None:
        """Embed ``records`` and put them in ``index``, each labelled with its text hash (replacing the vectors of
        ids already there)."""
        if records:
            ids = np.array([r.vector_id for r in records], dtype=np.int64)
            index.add(ids, embed_checked(self._embedder(), [r.text for r in records]), labels=[r.hash for r in records])
            self._index_dirty = True

    def _catch_up_steps(self, index: VectorIndex, versions: MemoryVersions) -> Steps[None]:
        """Embed the memories of ``versions`` whose vector is missing or was embedded from another text: stored or
        re-worded by another client (thread or process) after this index was loaded, or racing this one."""
        with self._lock:
            differ = index.stale_ids(versions.vector_ids, versions.hashes)
        if differ.size:
            records: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(int(i) for i in differ))
            with self._lock:
                self.embed_into(index, list(records.values()))

    # ---- reconciliation ---------------------------------------------------------------------------------------
    def reconcile_steps(self) -> Steps[ReconcileReport]:
        """Repair the index and the K/V store against SQL (:func:`inferscale.reconcile.reconcile_steps`)."""
        report: ReconcileReport = yield from reconcile_steps(self)
        return report

    def save_index(self, force: bool = False) -> None:
        """Write the index file when it changed, unless ``force`` at most every :data:`INDEX_SAVE_INTERVAL_S`, or
        every last save's duration over :data:`INDEX_SAVE_SHARE` when that is longer (a large index). A change that
        is not written now is written when that interval is up, on a timer thread, even if nothing is written
        meanwhile: a deleted memory's vector (labelled with its text's hash) leaves the file within the interval,
        not at the next write or ``close``, which may be hours away on an idle server.

        The index is derived from SQL: a file that cannot be written (a full or read-only disk) is logged, and the
        index stays marked changed, so a later save tries again; the write that called this (committed already) and
        ``close`` go on. The next process rebuilds what the file lacks from SQL (reconciliation)."""
        with self._lock:
            now = time.monotonic()
            interval = max(INDEX_SAVE_INTERVAL_S, self._index_save_s / INDEX_SAVE_SHARE)
            due = force or now - self._index_saved_at >= interval
            if force and self._index_save_timer is not None:
                self._index_save_timer.cancel()
                self._index_save_timer = None
            if self._index is not None and self._index_dirty and not due and self._index_save_timer is None:
                delay_s = min(max(self._index_saved_at + interval - now, 0.0), INDEX_SAVE_TIMER_MAX_S)
                timer = threading.Timer(delay_s, self._deferred_index_save)
                timer.name, timer.daemon = "inferscale-index-save", True
                self._index_save_timer = timer
                timer.start()
            if self._index is not None and self._index_dirty and due:
                try:
                    self._index.save()
                except OSError as exc:
                    log.warning(
                        "the index file %s could not be written (%s); it is tried again on a later write or close, and "
                        "rebuilt from SQL when opened",
                        self._index_path,
                        exc,
                    )
                    self._index_saved_at = time.monotonic()  # not again on every write meanwhile
                    return
                self._index_dirty = False
                self._index_saved_at = time.monotonic()
                self._index_save_s = self._index_saved_at - now

    def _deferred_index_save(self) -> None:
        """The save :meth:`save_index` put off (on its timer thread)."""
        with self._lock:
            if self._index_save_timer is threading.current_thread():  # not replaced meanwhile
                self._index_save_timer = None
            self.save_index()

    # ---- the read steps ---------------------------------------------------------------------------------------
    def _search(self, index: VectorIndex, query: np.ndarray, k: int, allowed: np.ndarray) -> list[tuple[int, float]]:
        """``index.search(query, k, allowed)`` (``query``: float32 ``[dim]``; ``allowed``: int64 ``[m]``). A search
        that built or re-trained the approximate index marks the index changed, so the next write's save or
        ``close`` writes it and the next process loads it rather than building it again (96 s at a million
        vectors). The search itself never writes the file: it would hold the client's lock for the whole file
        (gigabytes at that size) and turn a read into a disk write that can fail. Call with the lock held."""
        builds = index.approximate_builds
        hits = index.search(query, k, allowed_ids=allowed)
        if index.approximate_builds != builds:
            self._index_dirty = True
        return hits

    def search_steps(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None = None
    ) -> Steps[list[tuple[MemoryRecord, float]]]:
        """The top-``limit`` memories of ``scope`` matching ``node`` by cosine similarity to ``query``, best first,
        with their scores; those scoring below ``threshold`` are left out. The filter restricts the FAISS search
        itself, so the top-k is taken within the matching set."""
        if limit == 0:
            return []
        versions: MemoryVersions = yield Versions(scope, node)
        if not len(versions):
            return []
        allowed = versions.vector_ids
        index = yield from self.index_steps()
        yield from self._catch_up_steps(index, versions)
        with self._lock:
            hits = self._search(index, embed_checked(self._embedder(), [query])[0], limit, allowed)
        if threshold is not None:
            hits = [(vid, score) for vid, score in hits if score >= threshold]
        records: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(vid for vid, _ in hits))
        return [(records[vid], float(score)) for vid, score in hits if vid in records]

    def similar_steps(self, scope: Scope, facts: Sequence[str]) -> Steps[list[tuple[str, str]]]:
        """``(memory_id, text)`` of the memories of ``scope`` most similar to any of ``facts`` (the top
        ``llm.reconcile_top_k`` of each), oldest first: what the reconcile LLM is shown."""
        versions: MemoryVersions = yield Versions(scope)
        if not len(versions):
            return []
        allowed = versions.vector_ids
        index = yield from self.index_steps()
        yield from self._catch_up_steps(index, versions)
        found: set[int] = set()
        with self._lock:
            for vector in embed_checked(self._embedder(), list(facts)):
                found.update(i for i, _ in self._search(index, vector, self._config.llm.reconcile_top_k, allowed))
        records: dict[int, MemoryRecord] = yield RecordsByVectorId(tuple(sorted(found)))
        return [(r.id, r.text) for r in sorted(records.values(), key=lambda r: (r.created_at, r.vector_id))]

    # ---- after a write ----------------------------------------------------------------------------------------
    def after_write(self, index: VectorIndex, applied: AppliedChanges, encode: EncodeMode) -> list[str]:
        """Bring the index and the K/V in step with committed changes.

        Deleted memories lose their vector and K/V. A memory whose text changed is embedded again and loses its
        K/V; a metadata-only update changes neither. New memories are embedded. A memory whose stored context lost
        a deleted or re-worded text (``applied.recontexted``) keeps its vector and loses the K/V that depended on
        that context, files included (those of the old context's key could never be looked up again); its
        context-free K/V stay while its context keeps an entry (:meth:`forget_context_kv`). The new, re-worded and
        re-contexted memories' K/V are then encoded as ``encode`` says: now (``"eager"``), by the background encoder
        (``"background"``: their ids are returned, for :meth:`queue_encoding`), or on first use (``"lazy"``).

        Args:
            index: the loaded index (from :meth:`index_steps`).
            applied: what the transaction did.
            encode: when the K/V of the memories it created or changed are encoded
                (:attr:`inferscale.config.KVConfig.encode_on_add`).

        Returns:
            With ``"background"``, the ids to pass to :meth:`queue_encoding` once the caller has released the
            client's lock; otherwise ``[]``.

        Raises:
            InvalidInputError: with ``"eager"``, when a fact with its context does not fit the model's context.
        """
        retexted = [after for before, after in applied.updated if before.hash != after.hash]
        with self._lock:
            gone = [r.vector_id for r in applied.deleted]
            if gone:
                index.remove(np.array(gone, dtype=np.int64))
                self._index_dirty = True
            self.embed_into(index, [*retexted, *applied.added])
            self.forget_kv(list(dict.fromkeys(r.id for r in [*applied.deleted, *retexted])))
            self.forget_context_kv(applied.recontexted)
        fresh = {r.id: r for r in [*retexted, *applied.recontexted, *applied.added]}  # the latest record of each
        try:
            if encode == "eager" and fresh:
                self.fact_kv.prepare(list(fresh.values()))
        finally:
            self.save_index()  # the vectors above are committed rows' whether or not their encoding ran
        return list(fresh) if encode == "background" else []

    # ---- the background encoder ---------------------------------------------------------------------------------
    def queue_encoding(self, memory_ids: Sequence[str]) -> None:
        """Queue memories for the background K/V encoder; blocks while ``kv.encode_queue_size`` memories wait.

        Call it without holding the client's lock: the encoder takes that lock to store what it encoded, so a full
        queue would never drain.
        """
        if memory_ids:
            self._encoder.submit(memory_ids)

    def pending_encoding(self) -> list[str]:
        """The ids of the memories the background encoder has not finished yet, oldest first (a snapshot); the
        server's ``inferscale_kv_encode_pending`` gauge counts them (:mod:`inferscale.server.metrics`)."""
        return self._encoder.pending()

    def wait_for_encoding(self, timeout: float | None = None) -> bool:
        """Block until the background encoder has finished every queued memory (encoded, found encoded, gone, or
        failed and logged); ``timeout`` in seconds, ``None`` for no limit. Returns ``False`` when it ran out first.
        Call it without holding the client's lock."""
        return self._encoder.wait(timeout)

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Mark a foreground use of the model (a ``chat``'s K/V encoding, prefill or decoding step) for the duration
        of the block: the background encoder starts no chunk while a use that began before it looked runs
        (:meth:`_yield_to_foreground`), so the use waits for at most the chunk running when it began. Mark only
        code that runs the model on this thread, never a wait (for a worker thread, a lock, a load): a mark held
        while waiting keeps the encoder from the model it waits for. Nestable; holds no lock while the block runs."""
        with self._foreground_idle:
            ticket = next(self._foreground_tickets)
            self._foreground.add(ticket)
        try:
            yield
        finally:
            with self._foreground_idle:
                self._foreground.discard(ticket)
                self._foreground_idle.notify_all()

    def _yield_to_foreground(self) -> None:
        """Block until the foreground uses of the model running now (:meth:`foreground`) have ended; the caller
        holds no lock. Uses that begin meanwhile do not extend the wait: however densely chats overlap, the
        encoder runs its next chunk once those it found have ended (a use waits for one chunk at most, the
        encoder for the uses that were running when it looked)."""
        with self._foreground_idle:
            running = set(self._foreground)
            self._foreground_idle.wait_for(lambda: running.isdisjoint(self._foreground))

    def close_encoding(self, timeout: float | None = None) -> list[str]:
        """Close the background encoder for good and wait for what it was given (the client's ``close``): memories
        queued later, or waiting for room in the queue now, are left to the first ``chat`` that retrieves them, so
        no encoder thread reopens the engine or the database after ``close`` released them. Call it without holding
        the client's lock.

        Args:
            timeout: the most seconds to wait for the queue to drain (``None``: as long as it takes); then the
                encoder starts no further chunk, the chunk running finishes (:meth:`EncodeQueue.close
                <inferscale.encode_queue.EncodeQueue.close>`), and the memories not encoded are logged and left to
                the first ``chat`` that retrieves them, or to ``prepare_kv``.

        Returns:
            the ids of the memories left unencoded, oldest first (``[]`` when the queue drained).
        """
        return self._encoder.close(timeout)

    def encode_queued(self, memory_ids: list[str], stop: StopCheck | None = None) -> list[str]:
        """Encode and store every encoding of queued memories (each position bucket; the context-free one with
        ``kv.first_memory_context_free``), as eager ``add`` does: the
        background encoder's batch (:class:`~inferscale.encode_queue.EncodeQueue`).

        The batch's memories are read from SQL in one query when its turn comes (one deleted meanwhile is skipped;
        one re-worded or re-contexted is encoded as it is now; one too long only with its context turns gets its
        context-free encoding, and one too long even without them is skipped with a warning, as ``chat`` leaves
        it out: :meth:`~inferscale.fact_kv.FactKVManager.fit`), and only the K/V no tier holds are encoded (a ``chat``
        that needed one first encoded it itself). They are encoded in chunks of at most ``kv.encode_chunk_size``
        (a chunk ends before memories that share context turns with the next one rather than among them, so their
        turns are prefilled once: :meth:`~inferscale.fact_kv.FactKVManager.next_chunk`; a chained memory goes alone,
        after the stored memories of its chain that no tier holds: :meth:`~inferscale.fact_kv.FactKVManager.
        chain_first`), each under the engine's
        lock alone, so ``add``, ``search`` and ``chat`` go on meanwhile; before each chunk
        the encoder waits for the ``chat`` uses of the model running then (:meth:`foreground`), so a chat waits
        for one chunk at most (a streamed chat: each of its steps, since a chunk may run between two tokens), and
        drops what a chat stored meanwhile. Each chunk's results are stored under the client's lock, and
        only for a memory whose text and context are still those it was encoded from (SQL read again, one query
        per chunk): a change that landed during the pass leaves nothing stale behind. At interpreter exit
        (:func:`~inferscale.encode_queue.interpreter_exiting`), or once ``stop`` says so (the queue's, when a bounded
        ``close`` ran out of time), it starts no chunk: the one running is the last.

        Args:
            memory_ids: the memories, oldest first.
            stop: asked before each chunk (and again after waiting for the chats' uses of the model); ``True`` ends
                the pass there. ``None``: only the interpreter's exit does.

        Returns:
            the ids of ``memory_ids`` with an encoding still missing because the pass stopped early (``[]`` when it
            ran to the end), oldest first.

        Raises:
            OSError, DatabaseUnavailableError, ModelNotAvailableError: from the disk, the database or the engine's
                first load. The queue logs every one of them; nothing is lost (the memories are in SQL).
        """

        def halted() -> bool:
            return interpreter_exiting() or (stop is not None and stop())

        if halted():  # no model load at exit: its loader's threads may be shut down already
            return list(memory_ids)
        self.load_encoder()
        with self._lock:
            fact_kv = self.fact_kv
            found = self._db().get_many(memory_ids)
            records = fact_kv.servable([found[memory_id] for memory_id in memory_ids if memory_id in found])
            left = fact_kv.every_encoding(records)
        stored = 0
        chunk_size = self._config.kv.encode_chunk_size
        while left and not halted():  # at exit, or once stopped, the chunk running is the last
            self._yield_to_foreground()
            if halted():  # stopped while a chat used the model
                break
            with self._lock:
                left = fact_kv.chain_first(fact_kv.missing(left))  # those a chat stored meanwhile are done
                n = fact_kv.next_chunk(left, chunk_size)  # memories sharing context turns kept together
                chunk, left = left[:n], left[n:]
                requests = fact_kv.requests(chunk)
            if chunk:
                stored += self._store_unchanged(fact_kv, chunk, fact_kv.encode(requests))
        log.debug("background-encoded and stored %d facts of %d memories", stored, len(memory_ids))
        if not left:
            return []
        with self._lock:
            unencoded = {record.id for record, _ in fact_kv.missing(left)}  # a chat may have stored some meanwhile
        return [memory_id for memory_id in memory_ids if memory_id in unencoded]

    def load_encoder(self) -> FactKVManager:
        """Load what encoding facts needs now, outside the client's lock (a first load takes seconds): the chat
        engine's model, or with vLLM its transformers copy alone, so an encoder that runs behind ``add`` never
        starts vLLM's engine processes (:meth:`~inferscale.engines.base.Engine.load_encoder`); then build the K/V
        store on it (:attr:`fact_kv`), so an ``add`` that encodes eagerly meets every error of either before it
        writes.

        Returns:
            The K/V manager (:attr:`fact_kv`).

        Raises:
            ModelNotAvailableError: when the configured model's files cannot be found.
            ConfigError: when they hold no model that can be loaded, or one that cannot run the configured attention.
            UnsupportedModelError: for a model whose keys InferScale cannot rotate (no shared rotary module, fused
                QKV, a RoPE that is not static): an ``add`` that encodes eagerly loads it first, before it writes.
        """
        self._engine().load_encoder()
        return self.fact_kv

    def existing(self, memory_ids: Sequence[str]) -> set[str]:
        """Those of ``memory_ids`` SQL holds now (one query per :data:`~inferscale.storage.queries.IN_CHUNK` ids)."""
        return set(self._db().get_many(memory_ids))

    def missing_kv(self, memory_ids: Sequence[str]) -> list[str]:
        """The ids of ``memory_ids`` with an encoding (:meth:`~inferscale.fact_kv.FactKVManager.every_encoding`)
        that no tier holds under the current model and settings, in order; unknown ids are left out. Reads SQL (one
        query per :data:`~inferscale.storage.queries.IN_CHUNK` ids) and the store's index; loads the encoder
        (:meth:`load_encoder`), encodes nothing."""
        self.load_encoder()
        with self._lock:
            fact_kv = self.fact_kv
            found = self._db().get_many(memory_ids)
            records = [found[memory_id] for memory_id in memory_ids if memory_id in found]
            lacking = {record.id for record, _ in fact_kv.missing(fact_kv.every_encoding(records))}
        return [record.id for record in records if record.id in lacking]

    def prune_unserved(self, memory_ids: Sequence[str], *, dry_run: bool = False) -> tuple[int, Pruned]:
        """Remove every stored K/V entry of ``memory_ids`` that this client's chats would not look up under the
        current model and settings (:meth:`~inferscale.fact_kv.FactKVManager.served_keys`), from every tier and from
        ``kv_entries``; unknown ids are left out. The keys served are read under the client's lock, the entries
        removed after it, :data:`PRUNE_CHUNK` memories at a time (each holding the K/V store's lock while their
        files' headers are read), so chats and the encoder go on meanwhile. A memory re-worded while its page is
        pruned may lose the K/V of its new text, which are not among the keys read: they are encoded again when next
        used (a row left without its file, or a file without its row, is what reconciliation repairs); nothing stale
        is served. Loads the encoder (:meth:`load_encoder`), encodes nothing. ``dry_run``: the same counts, nothing
        removed.

        Returns:
            ``(memories found, what was removed)``.

        Raises:
            OSError: when a K/V file cannot be removed (no row of that memory is deleted then).
            KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id.
        """
        self.load_encoder()
        with self._lock:
            fact_kv = self.fact_kv
            found = self._db().get_many(memory_ids)
            records = [found[memory_id] for memory_id in memory_ids if memory_id in found]
            served = fact_kv.served_keys(records)
        ids = [record.id for record in records]
        chunks = [ids[i : i + PRUNE_CHUNK] for i in range(0, len(ids), PRUNE_CHUNK)]
        parts = [fact_kv.prune(chunk, served.__contains__, dry_run=dry_run) for chunk in chunks]
        total = Pruned(
            copies=sum(part.copies for part in parts),
            rows=sum(part.rows for part in parts),
            nbytes=sum(part.nbytes for part in parts),
        )
        return len(records), total

    def _store_unchanged(self, fact_kv: FactKVManager, encoded_for: Sequence[Wanted], encoded: Sequence[FactKV]) -> int:
        """Store ``encoded[i]`` as the K/V of ``encoded_for[i]`` (a ``(record, encoding)``) where SQL still holds that
        record's text and the context its encoding depends on, and no tier holds the key yet (a chat stored it
        meanwhile); returns how many were stored. Each is stored as the K/V of the record SQL holds now (a
        context-free encoding survives a context scrub). A memory another process changes or deletes between this
        read and its row is skipped (:class:`~inferscale.storage.kv_entries.MemoryChangedError`, a
        ``MemoryNotFoundError``): it is encoded again when next used. Takes the client's lock."""
        with self._lock:
            now = self._db().get_many([record.id for record, _ in encoded_for])
            kept: list[tuple[Wanted, FactKV]] = []
            for (record, encoding), fact in zip(encoded_for, encoded, strict=True):
                current = now.get(record.id)
                key = fact_kv.key(record, encoding)
                if current is None or fact_kv.key(current, encoding) != key:
                    continue  # deleted, re-worded or re-contexted during the pass: a stale encoding
                if not fact_kv.store.contains(key):  # not stored meanwhile by a chat that needed it
                    kept.append(((current, encoding), fact))
            return fact_kv.put_unless_changed([pair for pair, _ in kept], [fact for _, fact in kept])

    def forget_kv(self, memory_ids: Sequence[str]) -> int:
        """Drop the K/V tensors of deleted or re-worded memories from every tier (every key of each:
        memory, host and disk; files other processes wrote included). Their ``kv_entries`` rows were
        deleted by the transaction that made the change (:func:`inferscale.storage.changes.apply_in_session`), so
        no SQL runs here.

        A file that cannot be removed (a read-only folder) is logged and left for reconciliation: the change is
        committed, and the file can never be read again (its key names a text or context that no memory has).

        Returns:
            How many of ``memory_ids`` had K/V (a folder, empty or not, or cached entries) removed here: those whose
            removal failed, and those with nothing left (removed meanwhile by another process on the same folder),
            are not counted.
        """
        if not memory_ids:
            return 0
        # Without a K/V manager the engine is not loaded and only the disk tier can hold them.
        store = self._fact_kv.store if self._fact_kv is not None else KVStore(self._kv_dir)
        removed = 0
        for memory_id in memory_ids:
            found = self._kv_dir is not None and (self._kv_dir / memory_id).is_dir()
            try:
                entries = store.delete_memory(memory_id)
            except OSError as exc:
                _log_left_behind(memory_id, exc)
            else:
                if found or entries > 0:
                    removed += 1
        return removed

    def forget_context_kv(self, records: Sequence[MemoryRecord]) -> None:
        """Drop from every tier the K/V of re-contexted memories (``records``, as they are now) that depended on
        their old context (:func:`~inferscale.kv.fingerprint.survives_recontext`), as the transaction did with their
        ``kv_entries`` rows (:func:`inferscale.storage.changes.apply_in_session`)."""
        if not records:
            return
        store = self._fact_kv.store if self._fact_kv is not None else KVStore(self._kv_dir)
        with_context = {r.id for r in records if r.context}
        try:
            store.prune(
                [r.id for r in records], lambda key: survives_recontext(key.encoding_key, key.memory_id in with_context)
            )
        except OSError as exc:  # as forget_kv: the change is committed, and reconciliation removes the files later
            _log_left_behind(", ".join(r.id for r in records), exc)

    def release_kv(self) -> None:
        """Drop the K/V manager (and with it the engine it holds and the memory tiers' tensors); the disk tier and
        the index stay. The next K/V use builds it again."""
        with self._lock:
            self._fact_kv = None

    def reset(self, memory_ids: Collection[str]) -> None:
        """An empty index (saved) and none of the K/V of ``memory_ids``, the memories the caller has just deleted
        from SQL (:meth:`inferscale.storage.MemoryStore.reset`). Other databases' K/V in a shared K/V folder stay."""
        with self._lock:
            embedder = self._embedder()
            self._index = VectorIndex(embedder.dim, self._index_path, self._config.search, embedder_identity(embedder))
            self._index_dirty = True
            self.save_index(force=True)  # a file that cannot be written is logged: reset's commit is done
            self.release_kv()  # its memory tiers held this client's K/V only
            on_disk = set(DiskTier(self._kv_dir).entry_files())
            self.forget_kv(sorted(on_disk.intersection(memory_ids)))

    # ---- K/V --------------------------------------------------------------------------------------------------
    @property
    def fact_kv(self) -> FactKVManager:
        """The facts' K/V: tiered store plus encoder (builds the engine on first use)."""
        with self._lock:
            if self._fact_kv is None:
                engine = self._engine()
                kv = self._config.kv
                device_budget = kv.device_budget_bytes
                if device_budget and engine.device.type != "cuda":  # "auto" without CUDA ("cpu" fails the config)
                    log.warning(
                        "kv.device_budget_bytes=%d is ignored: the engine runs on %s, and the GPU K/V tier needs CUDA",
                        device_budget,
                        engine.device,
                    )
                    device_budget = 0
                store = KVStore(
                    self._kv_dir,
                    host_budget_bytes=kv.host_budget_bytes,
                    device=engine.device,
                    device_budget_bytes=device_budget,
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
        """The K/V of ``records`` as served in this order (stored ones loaded, missing ones encoded and stored): a
        foreground use of the model (:meth:`foreground`).

        Raises:
            InvalidInputError: naming the first memory too long for the model's context even without its context
                turns (:meth:`inferscale.fact_kv.FactKVManager.check`), before anything is encoded.
        """
        with self.foreground():
            self.fact_kv.check(records)
            return self.fact_kv.ensure(list(records))


def _log_left_behind(memory_ids: str, error: OSError) -> None:
    log.warning(
        "could not remove the K/V files of memory %s (%s); the change is committed, and reconciliation removes them "
        "once their folder is writable (they can never be read again)",
        memory_ids,
        error,
    )
