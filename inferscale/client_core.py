"""What the sync and async clients share: configuration, the lazily built parts, and the pure steps.

:class:`ClientCore` resolves where things live (database URL, index file, K/V directory), builds the embedder,
the engine, the JSON generator and the :class:`~inferscale.derived.DerivedStores` on first use, and holds the
steps that do no SQL: fact extraction, reconcile planning and answer generation.
:class:`~inferscale.client.MemoryClient` and :class:`~inferscale.async_client.AsyncMemoryClient` add the SQL
I/O around them, each in its own call shape.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from inferscale.arguments import check_flag, check_query, check_threshold, check_update, resolve_limit, resolve_scope
from inferscale.chains import ChainLink
from inferscale.chat_request import ChatRequest
from inferscale.config import MemoryConfig, MemoryLayout
from inferscale.derived import DerivedStores
from inferscale.encoding_layout import EncodingLayout, span_steps
from inferscale.engines.availability import VLLM_INSTALL
from inferscale.engines.base import Engine, Generation, StreamEvent
from inferscale.errors import ConfigError, EngineClosedError, InvalidInputError
from inferscale.fact_kv import FactKVManager
from inferscale.filters import Filter
from inferscale.kv.store import KVStore
from inferscale.mem0_config import config_from_dict
from inferscale.mem0_history import with_history
from inferscale.mem0_import import ImportedMemory, ReadMemories, mem0_memories
from inferscale.memory import FactExtractor, JSONGenerator, Message
from inferscale.memory.chunking import chunk_messages
from inferscale.memory.grounding import ungrounded_reason
from inferscale.memory.messages import TOOL_ROLES, user_turns
from inferscale.memory.reconcile import Reconciler
from inferscale.models.defaults import SMOLLM2_FOLDER
from inferscale.new_memories import MAX_CONTEXT_TURNS, in_chains, in_turn_order, one_by_one
from inferscale.retrieval import Embedder, SentenceTransformerEmbedder
from inferscale.scope import Scope, ScopeId
from inferscale.steps import IdsHeld, LatestMemories, Steps, StoredText
from inferscale.storage import MemoryRecord, MemoryStore, hash_text
from inferscale.storage.change_sets import ChangeSet, MemoryUpdate, NewMemory, held_elsewhere
from inferscale.storage.records import HeldId
from inferscale.types import ChatChunk, ChatResult, Timings

if TYPE_CHECKING:
    from inferscale.memory import OpenAIJSONGenerator

log = logging.getLogger(__name__)


class ChatAbandonedError(Exception):
    """Raised on the worker thread of a chat whose caller stopped waiting (nobody receives it)."""


@dataclass(frozen=True, slots=True)
class ChunkFacts:
    """What ``add(infer=True)`` takes from one chunk of the conversation.

    Attributes:
        facts: the extracted facts that passed the grounding check (the chunk's user turns when none did), less
            those an earlier chunk gave (compared case-insensitively).
        fallback: the chunk's user turns when the grounding check dropped some of its facts but not all, else
            empty: stored verbatim beside ``facts`` (those not stored yet), so that what the dropped facts were
            about is kept whatever becomes of the others (stored already, or judged NONE by reconcile).
    """

    facts: list[str]
    fallback: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ImportPlan:
    """What an import writes and leaves out (:meth:`ClientCore._import_steps`).

    Attributes:
        changes: one change set per scope, in the order the scopes first appear.
        left_out: ``{"id", "reason"}`` of each memory not to be stored (imported before, or deleted here).
        imported_before: the ids of those stored here already (an import run again, after an interruption say).
    """

    changes: list[ChangeSet]
    left_out: list[dict[str, str]]
    imported_before: list[str]


def _stored_time(new: NewMemory) -> tuple[bool, datetime]:
    """The sort key of an imported memory: the time it is stored with (``created_at``, else ``updated_at``), those
    without either last."""
    at = new.created_at or new.updated_at
    return at is None, at or datetime.min.replace(tzinfo=UTC)


def ms_since(t0: float) -> float:
    """Milliseconds elapsed since ``t0`` (a ``time.perf_counter()`` reading)."""
    return (time.perf_counter() - t0) * 1000.0


def actor_of(messages: Sequence[Message]) -> str | None:
    """The ``name`` of the user turns when they all share one, recorded as the changes' actor; else ``None``."""
    names = {m.name for m in messages if m.role == "user" and m.name}
    return names.pop() if len(names) == 1 else None


def laid_out(records: Sequence[MemoryRecord], layout: MemoryLayout) -> list[MemoryRecord]:
    """Retrieved memories in the order a chat lays them out (:attr:`~inferscale.config.MemoryConfig.memory_layout`):
    as given (best first) for ``"score"``; for ``"added"``, in the order they were first added: by increasing
    ``vector_id``, the SQL key a memory gets when it is inserted (increasing on SQLite and PostgreSQL alike) and
    keeps through updates."""
    if layout == "added":
        return sorted(records, key=lambda r: r.vector_id)
    return list(records)


def rendered_turns(messages: Sequence[Message]) -> list[str]:
    """The conversation turns as ``"role: content"`` lines (the context of extracted facts): neither system messages
    nor tool results, which extraction never sees either."""
    return [f"{m.role}: {m.content}" for m in messages if m.role != "system" and m.role not in TOOL_ROLES]


def attributed(message: Message, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata a verbatim memory of ``message`` is stored with: the call's ``metadata``, then the message's
    ``role`` and, when it has one, its speaker ``name`` as ``actor_id`` (Mem0's keys, which take precedence over the
    same keys in ``metadata``: :data:`~inferscale.storage.records.ATTRIBUTION_KEYS`)."""
    return {**metadata, "role": message.role, **({"actor_id": message.name} if message.name else {})}


def refuse_platform_arguments(org_id: object, project_id: object) -> None:
    """Refuse Mem0's platform ``org_id`` and ``project_id``, which have no InferScale counterpart (memories are scoped
    by ``user_id``, ``agent_id`` and ``run_id``; a server's API keys bind scopes); ``None`` passes.

    Raises:
        ConfigError: naming the argument given.
    """
    given = [name for name, value in (("org_id", org_id), ("project_id", project_id)) if value is not None]
    if given:
        names, one = " and ".join(given), len(given) == 1
        raise ConfigError(
            f"{names} {'is a Mem0 platform argument' if one else 'are Mem0 platform arguments'} with no InferScale "
            "counterpart: memories are scoped by user_id, agent_id and run_id, and a server's API keys bind those "
            f"scopes (docs/server.md); leave {'it' if one else 'them'} out"
        )


def remote_arguments(
    host: str | None,
    api_key: str | None,
    timeout: float | None,
    retries: int | None,
    local: Mapping[str, object],
) -> dict[str, Any] | None:
    """Which client a ``MemoryClient(...)`` or ``AsyncMemoryClient(...)`` call asks for: ``None`` for the local one,
    or, when ``host`` is given, the keyword arguments of the remote one (``timeout`` and ``retries`` left out when
    ``None``: the remote client's defaults).

    Args:
        host, api_key, timeout, retries: the remote client's arguments as given.
        local: the local client's arguments by name (``config``, ``engine``, ``embedder``, ``generator``).

    Raises:
        ConfigError: when ``host`` comes with a local argument (a remote client uses the server's config and
            models), or ``api_key``, ``timeout`` or ``retries`` come without ``host``.
    """
    if host is None:
        stray = [
            name
            for name, value in (("api_key", api_key), ("timeout", timeout), ("retries", retries))
            if value is not None
        ]
        if stray:
            raise ConfigError(
                f"{', '.join(stray)} is for a remote client: pass host='http://...' too (the server's URL), or leave "
                f"{'it' if len(stray) == 1 else 'them'} out for the local client"
            )
        return None
    clash = [name for name, value in local.items() if value is not None]
    if clash:
        raise ConfigError(
            f"host={host!r} makes a remote client, which uses the server's config and models, so {', '.join(clash)} "
            "would be ignored; pass host (remote) or the local arguments (local), not both"
        )
    options = {"timeout": timeout, "retries": retries}
    return {"host": host, "api_key": api_key, **{k: v for k, v in options.items() if v is not None}}


def string_config_message(config: str) -> str:
    """The :class:`ConfigError` message for a string passed as a client's ``config`` (first positional argument):
    a server URL or an API key (Mem0's platform client takes ``api_key`` first) is told to pass ``host=`` /
    ``api_key=``; a key's text is not repeated."""
    if config.startswith(("http://", "https://")):
        return (
            f"a client's first argument is its config (a MemoryConfig or a dict), not a server URL: pass it as "
            f"host={config[:200]!r} (and the key as api_key=...)"
        )
    if config.startswith("isk_") or config.startswith("m0-"):
        return (
            "a client's first argument is its config (a MemoryConfig or a dict), not an API key: pass the key as "
            "api_key=... together with host='http://...' (the server's URL)"
        )
    return (
        f"a client's config is a MemoryConfig or a dict, not a string ({config[:80]!r}); for a server pass "
        f"host='http://...' and api_key=..."
    )


def refuse_in_spawn_bootstrap() -> None:
    """Refuse to build a vLLM client while a spawned child process re-runs the main script.

    vLLM starts its engine in child processes, spawned on CPU: each imports the main module again, so a script whose
    top-level code builds a client and adds memories did it once more in every child (duplicate memories in the
    user's database) before vLLM failed with multiprocessing's own bootstrapping error.

    Raises:
        ConfigError: inside such a re-import (multiprocessing's ``_inheriting`` flag, which its own check reads),
            naming the fix.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigError(
            "a MemoryClient with engine provider 'vllm' was built while a child process re-ran the main script: "
            "vLLM starts its engine in spawned processes, which import the main module again; put the code that "
            'builds the client and uses it under `if __name__ == "__main__":`'
        )


class ClientCore:
    """Configuration, lazily built models and the pure steps shared by the sync and async clients.

    ``host``, ``api_key``, ``timeout`` and ``retries`` are the remote client's arguments: :meth:`__new__` hands a
    call with a host to the remote client (see :func:`remote_arguments`), so here they are always ``None``.
    """

    _remote_class: ClassVar[str]
    """The name, in :mod:`inferscale.remote`, of the client :meth:`__new__` returns for a ``host``
    (``"RemoteMemoryClient"``, ``"AsyncRemoteMemoryClient"``); each client class sets it."""

    def __new__(
        cls,
        config: MemoryConfig | Mapping[str, Any] | None = None,
        *,
        engine: Engine | None = None,
        embedder: Embedder | None = None,
        generator: JSONGenerator | None = None,
        host: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        org_id: str | None = None,
        project_id: str | None = None,
    ) -> Any:
        """A local client of class ``cls``, or with ``host`` the remote client :attr:`_remote_class` names, built
        here (Python then skips ``__init__``, as the object is not a ``cls``), so that a Mem0 platform user changes
        only the import and the host. :mod:`inferscale.remote` (httpx) is imported only then.

        Typing: the client classes declare two overloads each, so that ``MemoryClient(...)`` is a ``MemoryClient``
        and ``MemoryClient(host=...)`` a ``RemoteMemoryClient`` (a ``host: str | None`` the union of the two). mypy
        requires ``__new__`` to return an instance of its class; the remote overload breaks that rule on purpose,
        so it alone carries an ignore for that one check (``misc``). The remote client is no subclass: it has none
        of the local one's internals (``db``, ``engine``, ``config``), and a subclass would claim it has. This
        implementation returns ``Any``, as it returns one of two unrelated types.

        Raises:
            ConfigError: for ``host`` together with ``config``, ``engine``, ``embedder`` or ``generator``, or
                ``api_key``, ``timeout`` or ``retries`` without ``host`` (see :func:`remote_arguments`); for a string
                as ``config`` (Mem0's platform client takes its API key first: ``host=`` and ``api_key=`` are
                keyword-only here); for Mem0's platform ``org_id`` or ``project_id`` (accepted as ``None`` only, as
                Mem0 code may pass them).
        """
        if isinstance(config, str):
            raise ConfigError(string_config_message(config))
        refuse_platform_arguments(org_id, project_id)
        local = {"config": config, "engine": engine, "embedder": embedder, "generator": generator}
        remote = remote_arguments(host, api_key, timeout, retries, local)
        if remote is None:
            return super().__new__(cls)
        import inferscale.remote

        return getattr(inferscale.remote, cls._remote_class)(**remote)

    def __init__(
        self,
        config: MemoryConfig | Mapping[str, Any] | None = None,
        *,
        engine: Engine | None = None,
        embedder: Embedder | None = None,
        generator: JSONGenerator | None = None,
        host: None = None,
        api_key: None = None,
        timeout: None = None,
        retries: None = None,
        org_id: None = None,
        project_id: None = None,
    ) -> None:
        self.config = config if isinstance(config, MemoryConfig) else config_from_dict(config or {})
        if engine is None and self.config.engine.provider == "vllm":
            refuse_in_spawn_bootstrap()
        self._engine = engine
        self._owns_engine = engine is None
        self._embedder = embedder
        self._generator = generator
        self._owned_generator: OpenAIJSONGenerator | None = None  # an HTTP client built here, so closed here
        self._generator_built_here = False  # built from config.llm (not passed in): released by close()
        self._lock = threading.RLock()
        # set by close(), and replaced by a new one when close() ends: a non-streamed chat keeps the one current when
        # it began, and ends within a token once that is set (also when close() has returned meanwhile)
        self._closing = threading.Event()
        self._db: MemoryStore | None = None
        self._derived = DerivedStores(
            self.config,
            db=lambda: self.db,
            embedder=lambda: self.embedder,
            engine=lambda: self.engine,
            index_path=self._index_path(),
            kv_dir=self._kv_dir(),
            lock=self._lock,
        )

    # ---- locations -------------------------------------------------------------------------------------------
    def _db_url(self) -> str:
        return self.config.database_url()

    def _index_path(self) -> Path:
        if self.config.index_path:
            return Path(self.config.index_path).expanduser()
        url = self._db_url()
        try:
            parsed: URL | None = make_url(url)
        except (ArgumentError, ValueError):  # not a URL (or a port that is not a number): opening it raises ConfigError
            parsed = None
        if (
            parsed is not None
            and parsed.get_backend_name() == "sqlite"
            and parsed.database not in (None, "", ":memory:")
        ):
            return Path(parsed.database).with_suffix(".faiss")  # the file's path, its URL quoting undone
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
    def model_name(self) -> str:
        """The chat model's name, for reports and framework adapters (LangChain's ``model_name``, OpenAI's
        ``model``): the last path component of ``config.engine.model``, a hub id as given, or
        ``"SmolLM2-135M-Instruct"`` for the embedded default. Loads nothing."""
        model = self.config.engine.model
        if model is None:
            return SMOLLM2_FOLDER
        return Path(model).expanduser().name if model.startswith(("/", ".", "~")) else model

    @property
    def context_window(self) -> int:
        """The chat model's context window (tokens): system prefix, memories, conversation and answer together must
        fit in it. Loads the model's config (and tokenizer) alone when the model is not loaded."""
        return self.engine.max_context_tokens

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
            raise ConfigError(f"engine provider 'vllm' needs vLLM: install {VLLM_INSTALL} ({exc})") from exc
        engine = self.config.engine
        limits: dict[str, Any] = {"max_model_len": engine.max_model_len, "kv_cache_bytes": engine.kv_cache_bytes}
        return VLLMEngine(
            engine,
            self.config.system_prompt,
            home=self.config.home_dir(),
            encode_batch_size=self.config.kv.encode_batch_size,
            serving=self.config.kv.serving(),
            **{name: value for name, value in limits.items() if value is not None},
        )

    @property
    def derived(self) -> DerivedStores:
        """The vector index and the facts' K/V, kept in step with SQL (built with the client; no I/O)."""
        return self._derived

    @property
    def kv_store(self) -> KVStore:
        """The tiered store of the facts' K/V (device, host, disk): its tiers and hit counters, for benchmarks and
        operators. Builds the engine on first use (the store lives on its device)."""
        return self.derived.fact_kv.store

    @property
    def fact_kv(self) -> FactKVManager:
        """The facts' K/V manager (store and encoder; builds the engine on first use)."""
        return self.derived.fact_kv

    def _json_generator(self) -> JSONGenerator:
        with self._lock:
            if self._generator is None:
                llm = self.config.llm
                if llm.provider == "openai":
                    from inferscale.memory import OpenAIJSONGenerator

                    if not llm.base_url or not llm.model:
                        raise ConfigError("llm provider 'openai' needs base_url and model")
                    self._owned_generator = OpenAIJSONGenerator(llm.base_url, llm.api_key, llm.model, llm.timeout_s)
                    self._generator = self._owned_generator
                    self._generator_built_here = True
                else:
                    from inferscale.memory import TransformersJSONGenerator

                    engine = self.engine
                    self._generator = TransformersJSONGenerator(engine.model, engine.tokenizer, lock=engine.model_lock)
                    self._generator_built_here = True
            return self._generator

    # ---- add: extraction and reconcile (pure or CPU-bound steps) ---------------------------------------------
    def _extract_facts(self, messages: Sequence[Message], instructions: str | None) -> list[ChunkFacts]:
        """Facts of a conversation, extracted chunk by chunk when it is longer than ``llm.max_input_tokens`` (a fact
        already extracted from an earlier chunk, compared case-insensitively, is left out), each extraction
        following the app's custom ``instructions`` when given (:func:`~inferscale.arguments.check_add_prompt`).

        With ``llm.check_grounding``, a fact that invents a name or number, leaves the conversation's CJK
        script or copies a worked example of the prompt is dropped with a warning, and the chunk keeps its user
        turns as a fallback (:attr:`ChunkFacts.fallback`); a chunk whose every fact is dropped contributes its user
        turns verbatim instead, as does a chunk whose LLM answer is unusable even after a repair and
        ``llm.answer_retries`` more calls (:meth:`~inferscale.memory.FactExtractor.extract`).

        Returns:
            One :class:`ChunkFacts` per chunk, in order.

        Raises:
            ExtractionError: when the generator fails to answer (connection, HTTP status, no text content).
        """
        extractor = FactExtractor(
            self._json_generator(),
            max_new_tokens=self.config.llm.max_new_tokens,
            retries=self.config.llm.answer_retries,
            max_memory_chars=self.config.max_memory_chars,
            include_assistant=self.config.llm.include_assistant,
            instructions=instructions,
        )
        turns = [m for m in messages if m.role != "system" and m.role not in TOOL_ROLES]  # what extraction is shown
        chunks: list[ChunkFacts] = []
        seen: set[str] = set()
        today = date.today()
        for chunk in chunk_messages(turns, self.config.llm.max_input_tokens) if turns else []:
            extraction = extractor.extract(chunk, today=today)
            found = ChunkFacts(extraction.facts)
            if self.config.llm.check_grounding and extraction.facts and not extraction.verbatim:
                found = self._grounded(extraction.facts, chunk, self.config.max_memory_chars)
            facts = [fact for fact in found.facts if fact.casefold() not in seen]
            seen.update(fact.casefold() for fact in facts)
            chunks.append(ChunkFacts(facts, found.fallback))
        return chunks

    @staticmethod
    def _grounded(found: list[str], chunk: Sequence[Message], max_memory_chars: int) -> ChunkFacts:
        source = "\n".join(m.content for m in chunk)
        kept: list[str] = []
        for fact in found:
            reason = ungrounded_reason(fact, source)
            if reason is None:
                kept.append(fact)
            else:
                log.warning("dropped the extracted fact %r: %s", fact, reason)
        if len(kept) == len(found):
            return ChunkFacts(kept)
        verbatim = user_turns(chunk, max_memory_chars)  # only when a fact was dropped
        if kept:
            return ChunkFacts(kept, verbatim)
        log.warning("no extracted fact was grounded; storing %d user turns verbatim", len(verbatim))
        return ChunkFacts(verbatim)

    def _reconciler(self) -> Reconciler:
        return Reconciler(
            self._json_generator(),
            max_new_tokens=self.config.llm.reconcile_max_new_tokens,
            retries=self.config.llm.answer_retries,
        )

    @staticmethod
    def _search_args(
        query: object,
        user_id: ScopeId | None,
        agent_id: ScopeId | None,
        run_id: ScopeId | None,
        filters: Mapping[str, Any] | None,
        limit: int | None,
        top_k: int | None,
        threshold: float | None,
    ) -> tuple[Scope, Filter | None, int, float | None]:
        """``(scope, filter, limit, threshold)`` of a ``search`` or ``recall`` call, in Mem0's v1 or v2 shape, once
        its ``query`` is checked (:func:`~inferscale.arguments.check_query`; a chat's search text is checked as
        its messages are, and may hold NUL).

        Raises:
            ScopeError: when no id is given. InvalidInputError: for a bad query, limit, filter or threshold.
        """
        scope, node = resolve_scope(user_id, agent_id, run_id, filters)
        args = scope, node, resolve_limit(limit, top_k), check_threshold(threshold)
        check_query(query)
        return args

    def _plan_add_steps(
        self, msgs: Sequence[Message], scope: Scope, meta: dict[str, Any], infer: bool, instructions: str | None
    ) -> Steps[ChangeSet | None]:
        """The change set of an ``add`` (:meth:`_changes_steps`), or ``None`` when nothing is new, once every memory
        it adds or re-words is known to fit the model's context when encoded (:meth:`_span_steps`: a new memory
        may keep fewer context turns).

        Raises:
            ExtractionError: when the LLM backend fails to answer (connection, HTTP status, no text content).
            InvalidInputError: when a fact it would add is too long for the model's context after the system prefix
                alone, or a text it would give a stored memory is too long after that memory's context turns
                (nothing is written).
        """
        changes = yield from self._changes_steps(msgs, scope, meta, infer, instructions)
        if changes is None:
            return None
        fitted: ChangeSet = yield from self._span_steps(changes)
        return fitted

    def _span_steps(self, changes: ChangeSet) -> Steps[ChangeSet]:
        """``changes`` with every memory they add or re-word known to fit the model's context once encoded
        (:func:`inferscale.encoding_layout.span_steps`), in every ``kv.encode_on_add`` mode: a new memory keeps the
        last of its context turns that fit; a fact that fits after none, or a new text that does not fit after its
        memory's turns, is refused with the encoder's own message. Needs the engine's tokenizer and config alone:
        loads them (once) when the model is not loaded, and no weights.

        Raises:
            InvalidInputError: naming the first memory that does not fit.
            ModelNotAvailableError: when the configured model's files cannot be found.
        """
        fitted: ChangeSet = yield from span_steps(lambda: EncodingLayout(self.engine, self.config.kv), changes)
        return fitted

    def _changes_steps(
        self, msgs: Sequence[Message], scope: Scope, meta: dict[str, Any], infer: bool, instructions: str | None
    ) -> Steps[ChangeSet | None]:
        """The change set of an ``add``, or ``None`` when nothing is new.

        Each new memory's context (context-window encoding) starts with the texts of the ``kv.context_window``
        memories stored last in exactly the scope (an id the scope leaves unset is unset in them too: an agent's
        memory never follows one of its users'), so a message added on its own is encoded after its neighbours.
        ``infer=False``: every message becomes a memory. ``infer=True``: the LLM extracts facts (following the
        custom ``instructions`` when given); those stored verbatim in the scope are dropped; the rest are added, or,
        when similar memories are stored and reconcile is on, the LLM decides ADD/UPDATE/DELETE/NONE against them
        (:mod:`inferscale.memory.reconcile`).

        A malformed LLM answer never fails the call: it is repaired, asked for again, or replaced by the user's
        turns verbatim (extraction) or the facts as extracted (reconcile).

        Raises:
            ExtractionError: when the LLM backend fails to answer (connection, HTTP status, no text content).
        """
        actor = actor_of(msgs)
        kv = self.config.kv
        neighbours, last = yield from self._scope_tail_steps(scope)
        if not infer:
            if kv.chains:
                return self._chained_changes(
                    msgs, scope, meta, actor, neighbours, last, kv.chain_block, kv.context_window
                )
            return self._verbatim_changes(msgs, scope, meta, actor, neighbours)
        facts: list[str] = []
        for chunk in self._extract_facts(msgs, instructions):
            texts = list(chunk.facts)
            if chunk.fallback:
                log.warning("grounding dropped facts; keeping %d user turns verbatim too", len(chunk.fallback))
                seen = {text.casefold() for text in (*facts, *texts)}
                texts += [turn for turn in chunk.fallback if turn.casefold() not in seen]
            facts += yield from self._unstored_steps(scope, texts)
        if not facts:
            return None
        shown = (yield from self.derived.similar_steps(scope, facts)) if self.config.llm.reconcile else []
        reconciler = self._reconciler() if shown else None
        return self._plan_changes(scope, facts, shown, reconciler, meta, neighbours, rendered_turns(msgs), actor)

    def _scope_tail_steps(self, scope: Scope) -> Steps[tuple[list[str], ChainLink | None]]:
        """The texts of the ``kv.context_window`` memories stored last in exactly ``scope``, oldest first (a new
        memory's neighbours; frozen now: the K/V stay valid whatever later happens to them), and, with chains on,
        the chain link of the scope's last memory (a chain continues from it; ``None`` without chains or
        memories)."""
        kv = self.config.kv
        window = kv.context_window
        wanted = max(window, 1) if kv.chains else window
        earlier: list[MemoryRecord] = (yield LatestMemories(scope, wanted)) if wanted else []
        neighbours = [r.text for r in earlier[max(0, len(earlier) - window) :]] if window else []
        last = ChainLink.of(earlier[-1]) if kv.chains and earlier else None
        return neighbours, last

    def _read_imports(self, memories: object, only: Scope | None, assume_utc: object, history: object) -> ReadMemories:
        """``import_memories``' records, every one checked (:func:`~inferscale.mem0_import.mem0_memories`), those of
        ``only`` kept, each with its Mem0 ``history`` rows (:func:`~inferscale.mem0_history.with_history`) unless
        that is ``None``.

        Raises:
            InvalidInputError: for a bad record or history row (named), or an ``assume_utc`` that is not a bool.
            ScopeError: for a record without a scope id.
        """
        checked = check_flag(assume_utc, "assume_utc")
        read = mem0_memories(memories, self.config.max_memory_chars, only=only, assume_utc=checked)
        if history is None:
            return read
        return replace(read, memories=with_history(read.memories, history, assume_utc=checked))

    def _import_steps(self, memories: Sequence[ImportedMemory]) -> Steps[ImportPlan]:
        """The change sets that store ``memories``: one per exact scope, each memory known to fit the model's context
        once encoded (:meth:`_span_steps`), and the memories left out.

        A memory whose id its scope holds already is left out (imported before), and so is one whose id a deleted
        memory had (a re-run never brings back what was deleted since). A scope's other memories are ordered by the
        time they are stored with (``created_at``, else ``updated_at``; those without either last, in the order
        given), and each gets the context and chain ``add(infer=False)`` of its text would give it, one call after
        another (:func:`~inferscale.new_memories.one_by_one`): after the scope's last memories, so an imported
        memory's K/V are those of the same memory added here. A text stored twice in a scope is stored twice, as it
        was (each id stays).

        Raises:
            InvalidInputError: naming the first memory that does not fit, or an id a memory of another scope holds
                (nothing is written; the write checks the ids again, in its transaction).
        """
        held: dict[str, HeldId] = yield IdsHeld(tuple(m.memory_id for m in memories))
        fresh: dict[Scope, list[NewMemory]] = {}
        left_out: list[dict[str, str]] = []
        imported_before: list[str] = []
        for imported in memories:
            memory_id, holder = imported.memory_id, held.get(imported.memory_id)
            if holder is None:
                fresh.setdefault(imported.scope, []).append(imported.memory)
            elif holder.scope is None:
                left_out.append({"id": memory_id, "reason": "a memory with this id was deleted here"})
            elif holder.scope != imported.scope:
                raise InvalidInputError(held_elsewhere(memory_id))
            else:
                changed = "" if holder.text_hash == hash_text(imported.memory.text) else "; its text here differs, kept"
                left_out.append({"id": memory_id, "reason": f"imported before{changed}"})
                imported_before.append(memory_id)
        planned: list[ChangeSet] = []
        for scope, group in fresh.items():
            ordered = sorted(group, key=_stored_time)
            neighbours, last = yield from self._scope_tail_steps(scope)
            adds = one_by_one(ordered, neighbours, last, self.config.kv)
            fitted: ChangeSet = yield from self._span_steps(ChangeSet(scope, adds=adds, skip_duplicates=False))
            planned.append(fitted)
        return ImportPlan(planned, left_out, imported_before)

    @staticmethod
    def _unstored_steps(scope: Scope, texts: Sequence[str]) -> Steps[list[str]]:
        """The ``texts`` that no memory of ``scope`` holds word for word."""
        unstored: list[str] = []
        for text in texts:
            stored: MemoryRecord | None = yield StoredText(scope, hash_text(text))
            if stored is None:
                unstored.append(text)
        return unstored

    @staticmethod
    def _verbatim_changes(
        messages: Sequence[Message],
        scope: Scope,
        meta: dict[str, Any],
        actor: str | None,
        stored: Sequence[str] = (),
    ) -> ChangeSet:
        """``infer=False``: every non-system message becomes a memory; its context is the turns before it,
        after the texts of the scope's ``stored`` memories (the last ones stored, oldest first).

        The context turns are kept as the memories they become (their text), so that a fact encoded after them
        (context-window encoding) sees lines laid out exactly like the memories it is served among. A message
        added on its own thus follows the memories stored before it in its scope, never another scope's. Every
        context entry is a memory's text, so each is a neighbour (:attr:`NewMemory.neighbours`): one whose memory
        is deleted before the add commits is dropped, as it is later from the stored context."""
        said = [NewMemory(m.content, attributed(m, meta)) for m in messages if m.role != "system"]
        return ChangeSet(scope, adds=in_turn_order(said, stored, MAX_CONTEXT_TURNS), actor=actor)

    @staticmethod
    def _chained_changes(
        messages: Sequence[Message],
        scope: Scope,
        meta: dict[str, Any],
        actor: str | None,
        stored: Sequence[str],
        last: ChainLink | None,
        block: int,
        window: int,
    ) -> ChangeSet:
        """``infer=False`` with chains on (``kv.chain_block`` = ``block``): every non-system message becomes a
        memory, in a bounded chain (:mod:`inferscale.chains`). The first continues the block of the scope's ``last``
        memory, each later one the block of the message before it; one that starts a new block (an anchor) is stored
        with the last ``window`` turns its context would have without chains (the scope's ``stored`` texts, then the
        call's earlier messages). Every context entry is a memory's text, so each is a neighbour."""
        said = [NewMemory(m.content, attributed(m, meta)) for m in messages if m.role != "system"]
        return ChangeSet(scope, adds=in_chains(said, stored, last, block, window), actor=actor)

    @staticmethod
    def _plan_changes(
        scope: Scope,
        facts: Sequence[str],
        shown: Sequence[tuple[str, str]],
        reconciler: Reconciler | None,
        meta: dict[str, Any],
        neighbours: Sequence[str],
        turns: Sequence[str],
        actor: str | None,
    ) -> ChangeSet:
        """The change set for new ``facts``: all ADDs when nothing similar is stored (or reconcile is off),
        otherwise the LLM's decisions on the ``shown`` memories. Each new memory's context is the scope's
        ``neighbours`` (memory texts), then the call's own rendered ``turns``, the last :data:`MAX_CONTEXT_TURNS`."""
        context = (*neighbours, *turns)[-MAX_CONTEXT_TURNS:]
        kept = max(0, len(context) - len(turns))  # the neighbours the cut leaves

        def new(text: str) -> NewMemory:
            return NewMemory(text, meta, context, neighbours=kept)

        if not shown or reconciler is None:
            return ChangeSet(scope, adds=tuple(new(f) for f in facts), actor=actor)
        decided = reconciler.decide(shown, facts)
        # Applied only to memories still holding the text the LLM was shown; an update skipped adds its fact instead.
        # An updated memory takes the call's metadata over its own, key by key (as update() merges; Mem0 gives it
        # the call's metadata too), so a tag of the call (its source, its session) is on every memory it wrote.
        seen = tuple((memory_id, hash_text(text)) for memory_id, text in shown)
        updates = (MemoryUpdate(i, text, dict(meta) or None, instead=new(text)) for i, text in decided.updates)
        return ChangeSet(
            scope,
            adds=tuple(new(text) for text in decided.adds),
            updates=tuple(updates),
            deletes=tuple(decided.deletes),
            actor=actor,
            seen=seen,
        )

    def _update_change(
        self, memory_id: str, text: str | None, metadata: Mapping[str, Any] | None, data: str | None
    ) -> ChangeSet:
        new_text, meta = check_update(memory_id, text, metadata, data, self.config.max_memory_chars)
        return ChangeSet(None, updates=(MemoryUpdate(memory_id, new_text, meta),), strict=True)

    def _open_stream(
        self, request: ChatRequest, records: Sequence[MemoryRecord]
    ) -> tuple[Generator[StreamEvent, None, None], float]:
        """Start generating the answer to ``request`` over ``records`` (K/V load or encode in KV mode): the engine's
        event stream and the K/V load time (ms). Context and template errors are raised here, before any event.
        """
        engine = self.engine
        budget = self._answer_budget(request)
        cache_scope = request.scope.key()
        if request.mode == "kv":
            t1 = time.perf_counter()
            facts = self.derived.memory_kv(records)
            load_ms = ms_since(t1)
            events = engine.stream_kv(
                request.conversation, facts, budget, cache_scope=cache_scope, sampling=request.sampling
            )
            return events, load_ms
        fact_ids = [engine.fact_token_ids(r.text) for r in records]
        events = engine.stream_prompt(
            request.conversation, fact_ids, budget, cache_scope=cache_scope, sampling=request.sampling
        )
        return events, 0.0

    @staticmethod
    def _result(
        request: ChatRequest,
        records: Sequence[MemoryRecord],
        gen: Generation,
        retrieval_ms: float,
        load_ms: float,
        ttft_ms: float,
        total_ms: float,
    ) -> ChatResult:
        return ChatResult(
            answer=gen.text,
            memory_ids=[r.id for r in records],
            memories=[r.text for r in records],
            mode=request.mode,
            timings=Timings(
                retrieval_ms=retrieval_ms,
                kv_assembly_ms=load_ms + gen.kv_assembly_ms,
                prefill_ms=gen.prefill_ms,
                ttft_ms=ttft_ms,
                total_ms=total_ms,
            ),
            prompt_tokens=gen.prompt_tokens,
            memory_tokens=gen.memory_tokens,
            generated_tokens=len(gen.token_ids),
            finish_reason=gen.finish_reason,
            recomputed_tokens=gen.recomputed_tokens,
        )

    def _generate(
        self,
        request: ChatRequest,
        records: Sequence[MemoryRecord],
        t0: float,
        retrieval_ms: float,
        abandoned: threading.Event | None = None,
        closing: threading.Event | None = None,
    ) -> ChatResult:
        """Answer ``request`` over ``records`` (CPU/GPU-bound: K/V load or encode, prefill, decode).

        Args:
            t0: ``time.perf_counter()`` at the start of the call; ``retrieval_ms`` the time choosing the memories
                took.
            abandoned: set by a caller that stopped waiting (an async chat cancelled): decoding stops within one
                token and the engine request ends, its cache freed.
            closing: the client's close event when the chat began (``None``: the current one); the client's
                ``close()`` sets it, which stops decoding the same way.

        ``ttft_ms`` is wall-clock time from ``t0`` until the engine produced the first token (retrieval, K/V
        load, assembly, prefill and the first token's choice, with everything between them).

        Raises:
            ChatAbandonedError: when ``abandoned`` was set before the answer was complete.
            EngineClosedError: when the client was closed before the answer was complete (as a stream raises).
        """
        closing = self._closing if closing is None else closing
        self._refuse_if_closed(closing)
        with self.derived.foreground():  # opening the answer too
            return self._answer(self._chunks(request, records, t0, retrieval_ms, closing), closing, abandoned)

    @staticmethod
    def _refuse_if_closed(closing: threading.Event) -> None:
        """Refuse to go on with a chat whose client was closed since it began (``closing``: the close event current
        then): opening its answer would load the model again for a closed client.

        Raises:
            EngineClosedError: when ``closing`` is set.
        """
        if closing.is_set():
            raise EngineClosedError("the client was closed while this chat waited to begin its answer")

    def _answer(
        self,
        chunks: Generator[ChatChunk, None, None],
        closing: threading.Event,
        abandoned: threading.Event | None = None,
    ) -> ChatResult:
        """The :class:`ChatResult` of an answer opened by :meth:`_chunks`, read to its end (closed if it fails).
        ``closing`` is the client's close event when the chat began, ``abandoned`` as in :meth:`_generate`.

        Raises:
            ChatAbandonedError: when ``abandoned`` was set before the answer was complete.
            EngineClosedError: when the client was closed before the answer was complete (as a stream raises).
        """
        last: ChatChunk | None = None
        # the whole answer is one use of the model: no background chunk between two tokens
        with self.derived.foreground(), contextlib.closing(chunks):
            for chunk in chunks:
                if abandoned is not None and abandoned.is_set():
                    raise ChatAbandonedError("the caller stopped waiting for this chat")
                if closing.is_set():
                    raise EngineClosedError("the client was closed while this chat was answered")
                last = chunk
        if last is None or last.result is None:
            raise RuntimeError("a chat stream ended without its result")
        return last.result

    def _chunks(
        self,
        request: ChatRequest,
        records: Sequence[MemoryRecord],
        t0: float,
        retrieval_ms: float,
        closing: threading.Event,
    ) -> Generator[ChatChunk, None, None]:
        """Start answering ``request`` and return its chunks: one per piece of new text, then the final chunk with
        the :class:`ChatResult`. Errors before the first token are raised by this call, not by the iterator.
        ``ttft_ms`` is taken when the engine hands over the first token (for both call shapes); its text is
        yielded at once unless it must wait (half a character, whitespace, a possible stop string).

        Opening the stream (K/V load or encode, cache assembly) and each of its steps are foreground uses of the
        model (:meth:`~inferscale.derived.DerivedStores.foreground`): the background K/V encoder starts no chunk
        during one. Between two steps it may: a stream is read at its reader's pace, which must not hold the
        encoder up (:meth:`_generate` marks the whole answer instead). ``closing`` is the client's close event when
        the chat began: once ``close()`` sets it, the next read raises
        :class:`~inferscale.errors.EngineClosedError`, the first one included, whether or not the client owns the
        engine.

        A memory too long for the model's context only with its context turns is served from its context-free
        encoding; a retrieved one too long even without them, or with this request's conversation and answer
        budget, is left out with a warning (both modes), and one named in ``memory_ids`` is refused
        (:class:`~inferscale.errors.InvalidInputError`); :meth:`~inferscale.fact_kv.FactKVManager.fit`,
        :meth:`_fitting_request`."""
        records = self._servable(request, records)
        with self.derived.foreground():
            events, load_ms = self._open_stream(request, records)

        def steps() -> Iterator[StreamEvent]:
            while True:
                if closing.is_set():
                    raise EngineClosedError("the client was closed while this answer was streaming; ask again")
                with self.derived.foreground():
                    event = next(events, None)
                if event is None:
                    return
                yield event

        def chunks() -> Generator[ChatChunk, None, None]:
            ttft_ms: float | None = None
            with contextlib.closing(events):
                for event in steps():
                    if isinstance(event, Generation):
                        first = ttft_ms if ttft_ms is not None else ms_since(t0)
                        result = self._result(request, records, event, retrieval_ms, load_ms, first, ms_since(t0))
                        yield ChatChunk("", result)
                        return
                    ttft_ms = ms_since(t0) if ttft_ms is None else ttft_ms
                    if event.text:
                        yield ChatChunk(event.text)

        return chunks()

    def _servable(self, request: ChatRequest, records: Sequence[MemoryRecord]) -> list[MemoryRecord]:
        """The memories ``request`` is answered with, in the order the chat lays them out: ``records`` (retrieved
        ones best first), less those whose encoding cannot fit the model's context or that do not fit the prompt
        beside the memories ranked above them (retrieved ones are left out with a warning, so no chat fails on them;
        see :meth:`~inferscale.fact_kv.FactKVManager.servable` and :meth:`~inferscale.fact_kv.FactKVManager.fitting`),
        laid out as ``memory_layout`` says.

        Raises:
            InvalidInputError: when a memory named in ``memory_ids`` does not fit (the caller chose it).
        """
        fact_kv = self.derived.fact_kv
        if request.memory_ids is not None:
            fact_kv.check(records)
            return self._fitting_request(request, records)
        kept = self._fitting_request(request, fact_kv.servable(records))
        return laid_out(kept, self.config.memory_layout)

    def _answer_budget(self, request: ChatRequest) -> int:
        """The most tokens ``request``'s answer may take: its own ``max_new_tokens``, else the engine config's."""
        return request.max_new_tokens or self.config.engine.max_new_tokens

    def _fitting_request(self, request: ChatRequest, records: Sequence[MemoryRecord]) -> list[MemoryRecord]:
        """``records`` when the prompt they make with ``request`` (system prefix, memory lines, conversation and
        answer budget) fits the model's context; checked from token counts before any K/V is loaded or encoded, so a
        request bound to fail costs no forward pass in either mode. A retrieved memory that would not fit even as
        the only one is left out with a warning: one long memory must not fail every chat of its scope.

        Raises:
            ContextLengthError: when the prompt does not fit (:func:`~inferscale.engines.base.check_prompt_fits`).
            InvalidInputError: when the conversation is refused by the chat template.
        """
        engine = self.engine
        rest = len(engine.conversation_token_ids(request.conversation)) + self._answer_budget(request)
        return self.derived.fact_kv.fitting(
            records,
            prefix_tokens=len(engine.system_prefix_ids()),
            rest_tokens=rest,
            context_tokens=engine.max_context_tokens,
            chosen=request.memory_ids is not None,
        )

    def _release(self) -> None:
        """Write the index file if it changed, and release what this client built: the JSON generator (an HTTP
        client is closed) and the engine (its model, or the vLLM engine and its processes). The SQL stores are
        closed by the caller."""
        with self._lock:
            self._derived.save_index(force=True)
            if self._generator_built_here:
                owned, self._owned_generator = self._owned_generator, None
                self._generator, self._generator_built_here = None, False
                if owned is not None:
                    owned.close()
            if self._owns_engine and self._engine is not None:
                engine, self._engine = self._engine, None
                self._derived.release_kv()  # its K/V manager holds the engine
                engine.close()
