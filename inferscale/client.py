"""The public API: :class:`MemoryClient` (alias :class:`Memory`), shaped like Mem0's.

Writes go to SQL first (the source of truth); the FAISS index and the fact K/V are derived from it. A call that
fails validation raises before anything is written, so nothing stored is lost.
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

from inferscale.config import MemoryConfig
from inferscale.engines.base import Engine
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.fact_kv import FactKVManager
from inferscale.kv.store import KVStore
from inferscale.memory import FactExtractor, JSONGenerator, Message, normalize_messages
from inferscale.retrieval import Embedder, SentenceTransformerEmbedder, VectorIndex
from inferscale.scope import SCOPE_KEYS, Scope
from inferscale.storage import MemoryRecord, MemoryStore
from inferscale.types import ChatMode, ChatResult, Timings

log = logging.getLogger(__name__)


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def memory_to_dict(record: MemoryRecord, score: float | None = None) -> dict[str, Any]:
    """The Mem0-shaped dict of one memory: id, memory, hash, metadata, scope ids, timestamps (ISO 8601)."""
    out: dict[str, Any] = {
        "id": record.id,
        "memory": record.text,
        "hash": record.hash,
        "metadata": dict(record.metadata),
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
    }
    out.update(record.scope_dict())
    if score is not None:
        out["score"] = score
    return out


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    clash = sorted(set(metadata) & set(SCOPE_KEYS))
    if clash:
        raise InvalidInputError(
            f"metadata may not set scope ids {clash}; pass them as keyword arguments (user_id=..., ...)"
        )
    return dict(metadata)


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidInputError(f"limit must be a non-negative int, got {limit!r}")
    return limit


class MemoryClient:
    """Long-term memory for agents, with KV-injected recall in :meth:`chat`.

    Construction does no I/O: the database, index and models are opened on first use.

    Args:
        config: a :class:`MemoryConfig` or a dict of its fields; ``None`` runs on the embedded defaults.
        engine: an engine to use instead of building one from ``config.engine`` (tests, shared models).
        embedder: an embedder to use instead of ``config.embedder``.
        generator: a JSON generator for fact extraction instead of ``config.llm``.

    Raises:
        ConfigError: for a config that does not validate.
    """

    def __init__(
        self,
        config: MemoryConfig | Mapping[str, Any] | None = None,
        *,
        engine: Engine | None = None,
        embedder: Embedder | None = None,
        generator: JSONGenerator | None = None,
    ) -> None:
        try:
            self.config = config if isinstance(config, MemoryConfig) else MemoryConfig(**dict(config or {}))
        except Exception as exc:  # pydantic.ValidationError, TypeError for non-mapping input
            raise ConfigError(f"invalid InferScale config: {exc}") from exc
        self._engine = engine
        self._embedder = embedder
        self._generator = generator
        self._lock = threading.RLock()
        self._db: MemoryStore | None = None
        self._index: VectorIndex | None = None
        self._fact_kv: FactKVManager | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MemoryClient:
        """Build a client from a config dict (see :class:`MemoryConfig`)."""
        return cls(config)

    # ------------------------------------------------------------------ lazy parts
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

    @property
    def db(self) -> MemoryStore:
        """The SQL store (opened lazily)."""
        with self._lock:
            if self._db is None:
                self._db = MemoryStore(self._db_url())
            return self._db

    @property
    def embedder(self) -> Embedder:
        """The sentence embedder (loaded lazily)."""
        with self._lock:
            if self._embedder is None:
                self._embedder = SentenceTransformerEmbedder(self.config.embedder.model, self.config.embedder.device)
            return self._embedder

    @property
    def index(self) -> VectorIndex:
        """The FAISS index, loaded from disk and rebuilt from SQL when it is out of step."""
        with self._lock:
            if self._index is None:
                index = VectorIndex.open(self._index_path(), self.embedder.dim)
                records = self.db.all_memories()
                if sorted(int(i) for i in index.ids()) != sorted(r.vector_id for r in records):
                    log.info("rebuilding the vector index from %d stored memories", len(records))
                    index = VectorIndex(self.embedder.dim, self._index_path())
                    if records:
                        index.add(
                            np.array([r.vector_id for r in records], dtype=np.int64),
                            self.embedder.embed([r.text for r in records]),
                        )
                    index.save()
                self._index = index
            return self._index

    @property
    def engine(self) -> Engine:
        """The chat engine (built lazily from ``config.engine``)."""
        with self._lock:
            if self._engine is None:
                if self.config.engine.provider != "transformers":
                    raise ConfigError(
                        f"engine provider {self.config.engine.provider!r} is not available in this build; "
                        "use 'transformers'"
                    )
                from inferscale.engines.transformers import TransformersEngine

                self._engine = TransformersEngine(
                    self.config.engine,
                    self.config.system_prompt,
                    home=self.config.home_dir(),
                    encode_batch_size=self.config.kv.encode_batch_size,
                )
            return self._engine

    @property
    def fact_kv(self) -> FactKVManager:
        """The fact K/V manager (store + encoder)."""
        with self._lock:
            if self._fact_kv is None:
                engine = self.engine
                directory = (
                    Path(self.config.kv.store_dir).expanduser()
                    if self.config.kv.store_dir
                    else self.config.data_path() / "kv"
                )
                device = getattr(engine, "device", "cpu")
                self._fact_kv = FactKVManager(engine, KVStore(directory, device=device), self.db, self.config.kv)
            return self._fact_kv

    def _extractor(self) -> FactExtractor:
        with self._lock:
            if self._generator is None:
                llm = self.config.llm
                if llm.provider == "openai":
                    from inferscale.memory import OpenAIJSONGenerator

                    if not llm.base_url or not llm.model:
                        raise ConfigError("llm provider 'openai' needs base_url and model")
                    self._generator = OpenAIJSONGenerator(llm.base_url, llm.api_key, llm.model)
                else:
                    from inferscale.memory import TransformersJSONGenerator

                    engine = self.engine
                    self._generator = TransformersJSONGenerator(engine.model, engine.tokenizer)  # type: ignore[attr-defined]
            return FactExtractor(self._generator, max_new_tokens=self.config.llm.max_new_tokens)

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
        encode_kv: bool = True,
    ) -> dict[str, list[dict[str, Any]]]:
        """Remember a conversation.

        With ``infer=True`` the LLM extracts facts (JSON-constrained) and each fact keeps its source messages as
        encoding context; with ``infer=False`` every user/assistant message is stored as it is, with the messages
        before it as context. A fact whose text is already stored in the scope is skipped (no event). New facts
        are embedded into the index and, with ``encode_kv``, their K/V are encoded right away (batched).

        Returns:
            ``{"results": [{"id", "memory", "event": "ADD"}, ...]}``.

        Raises:
            ScopeError: when no user_id, agent_id or run_id is given.
            InvalidInputError: for malformed messages or metadata (nothing is written).
            ExtractionError: when the LLM output cannot be parsed (nothing is written).
        """
        scope = Scope(user_id, agent_id, run_id)
        meta = _check_metadata(metadata)
        msgs = normalize_messages(messages)  # type: ignore[arg-type]
        candidates = self._facts_from(msgs, infer)
        with self._lock:
            results: list[dict[str, Any]] = []
            added: list[MemoryRecord] = []
            seen: set[str] = set()
            for text, context, role in candidates:
                record = self._add_one(text, context, role, scope, meta, seen)
                if record is not None:
                    added.append(record)
                    results.append({"id": record.id, "memory": record.text, "event": "ADD"})
            if added:
                self.index.add(
                    np.array([r.vector_id for r in added], dtype=np.int64),
                    self.embedder.embed([r.text for r in added]),
                )
                self.index.save()
                if encode_kv:
                    self.fact_kv.ensure(added)
        return {"results": results}

    def _facts_from(self, msgs: list[Message], infer: bool) -> list[tuple[str, list[str], str]]:
        turns = [m for m in msgs if m.role != "system"]
        rendered = [f"{m.role}: {m.content}" for m in turns]
        if infer:
            facts = self._extractor().extract(msgs, today=date.today())
            return [(fact, rendered, "fact") for fact in facts]
        return [(m.content, rendered[:i], m.role) for i, m in enumerate(turns)]

    def _add_one(
        self, text: str, context: list[str], role: str, scope: Scope, meta: dict[str, Any], seen: set[str]
    ) -> MemoryRecord | None:
        from inferscale.storage import hash_text

        digest = hash_text(text)
        if digest in seen or self.db.find_by_hash(digest, scope) is not None:
            return None
        seen.add(digest)
        return self.db.add(text, scope, metadata={**meta, "role": role} if role != "fact" else meta, context=context)

    # ------------------------------------------------------------------ read path
    def _search_records(self, query: str, scope: Scope, limit: int) -> list[tuple[MemoryRecord, float]]:
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError(f"query must be a non-empty string, got {query!r}")
        limit = _check_limit(limit)
        if limit == 0:
            return []
        allowed = self.db.vector_ids_in_scope(scope)
        if allowed.size == 0:
            return []
        vector = self.embedder.embed([query])[0]
        hits = self.index.search(vector, limit, allowed_ids=allowed)
        records = self.db.by_vector_ids([vid for vid, _ in hits])
        return [(records[vid], float(score)) for vid, score in hits if vid in records]

    def search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 5,
    ) -> dict[str, list[dict[str, Any]]]:
        """Top-``limit`` memories of the scope by cosine similarity to ``query``, best first.

        Returns:
            ``{"results": [{"id", "memory", "score", "metadata", "created_at", ...}, ...]}``.

        Raises:
            ScopeError: when no id is given. InvalidInputError: for an empty query or a negative limit.
        """
        scope = Scope(user_id, agent_id, run_id)
        with self._lock:
            hits = self._search_records(query, scope, limit)
        return {"results": [memory_to_dict(r, s) for r, s in hits]}

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """One memory by id, or ``None`` when it does not exist."""
        record = self.db.get(memory_id)
        return memory_to_dict(record) if record else None

    def get_all(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> dict[str, list[dict[str, Any]]]:
        """Every memory of the scope, oldest first, at most ``limit``.

        Raises:
            ScopeError: when no id is given.
        """
        scope = Scope(user_id, agent_id, run_id)
        return {"results": [memory_to_dict(r) for r in self.db.list(scope, limit=_check_limit(limit))]}

    def delete(self, memory_id: str) -> dict[str, str]:
        """Delete one memory, its vector and its K/V from every tier.

        Raises:
            MemoryNotFoundError: when no memory has that id.
        """
        with self._lock:
            record = self.db.delete(memory_id)
            self.index.remove(np.array([record.vector_id], dtype=np.int64))
            self.index.save()
            if self._fact_kv is not None or self._engine is not None:
                self.fact_kv.forget(memory_id)
            else:
                KVStore(self._kv_dir()).delete_memory(memory_id)
        return {"message": f"memory {memory_id} deleted"}

    def _kv_dir(self) -> Path:
        return (
            Path(self.config.kv.store_dir).expanduser() if self.config.kv.store_dir else self.config.data_path() / "kv"
        )

    def reset(self) -> None:
        """Delete every memory, history row, vector and stored K/V of this client's database."""
        with self._lock:
            self.db.reset()
            index = VectorIndex(self.embedder.dim, self._index_path())
            index.save()
            self._index = index
            KVStore(self._kv_dir()).clear()
            if self._fact_kv is not None:
                self._fact_kv.clear()

    # ------------------------------------------------------------------ chat
    def chat(
        self,
        query: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 5,
        mode: ChatMode = "kv",
        max_new_tokens: int | None = None,
    ) -> ChatResult:
        """Answer ``query`` with the scope's top-``limit`` memories.

        ``mode="kv"`` writes the memories' K/V into the engine's KV cache after the system prefix, rotated to
        their positions, and prefills only the query. ``mode="prompt"`` pastes the same memories, as the same
        tokens, into the prompt (the Mem0-style baseline). Both modes retrieve the same memories.

        Returns:
            :class:`ChatResult` with the answer, the memory ids used and timings in ms.

        Raises:
            ScopeError: when no id is given. InvalidInputError: for an empty query, a bad limit or mode.
        """
        if mode not in ("kv", "prompt"):
            raise InvalidInputError(f"mode must be 'kv' or 'prompt', got {mode!r}")
        scope = Scope(user_id, agent_id, run_id)
        budget = max_new_tokens or self.config.engine.max_new_tokens
        with self._lock:
            engine = self.engine
            if hasattr(engine, "load"):
                engine.load()  # model load is not part of the request's latency
            t0 = time.perf_counter()
            hits = self._search_records(query, scope, limit)
            records = [r for r, _ in hits]
            retrieval_ms = _ms_since(t0)
            if mode == "kv":
                t1 = time.perf_counter()
                facts = self.fact_kv.ensure(records)
                load_ms = _ms_since(t1)
                gen = engine.generate_kv(query, facts, budget)
            else:
                load_ms = 0.0
                gen = engine.generate_prompt(query, [engine.fact_token_ids(r.text) for r in records], budget)
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

    def close(self) -> None:
        """Release the database connections."""
        with self._lock:
            if self._db is not None:
                self._db.close()


Memory = MemoryClient
