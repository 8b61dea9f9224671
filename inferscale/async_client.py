"""The asynchronous API: :class:`AsyncMemoryClient` (alias :class:`AsyncMemory`), the same methods as
:class:`~inferscale.client.MemoryClient` as coroutines, like Mem0's ``AsyncMemory``.

Where the time goes, and where it runs:

- SQL on PostgreSQL is awaited on the event loop through async SQLAlchemy (psycopg's async mode); SQLite, which
  has no async I/O, runs each session on a worker thread, which a cancellation does not cut short (see
  :mod:`~inferscale.storage.async_sessions`).
- Model work, which holds a thread for seconds, runs on the process's model threads
  (:data:`~inferscale.worker_threads.MODEL_WORK`): ``chat`` generation and the model's load, LLM fact extraction
  and the reconcile decision (local model decoding, or the blocking HTTP call of an OpenAI-compatible endpoint), K/V
  encoding (``prepare_kv``, ``memory_kv``, eager adds), queueing for the background encoder (a full queue waits),
  and ``reconcile``'s embedding of every memory the index lacks.
  So does the first use of the index, which loads it and the embedder and embeds every memory it lacks.
- The rest, milliseconds each, runs on the event loop's default executor: a search's embedding and FAISS scan,
  index updates and the index file, K/V removal. So a search never waits for a thread behind generating chats
  (``benchmarks/search_beside_chats.py``).
- K/V bookkeeping (``kv_entries`` rows written while encoding) goes through the sync store inside those worker
  threads, never on the loop.

Every public coroutine that answers in Mem0's shapes delegates to a protected one of the same name (``search`` →
``_asearch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, overload

from inferscale.arguments import (
    check_add_messages,
    check_add_prompt,
    check_flag,
    check_memories,
    check_metadata,
    check_output_format,
    check_timeout,
    check_version,
    encode_mode,
    optional_scope,
    refuse_unsupported_mem0,
    resolve_limit,
    resolve_scope,
)
from inferscale.chat_request import ChatRequest, SentTexts, resolve_chat
from inferscale.client_core import ClientCore, ms_since
from inferscale.config import EncodeMode, MemoryConfig
from inferscale.conversation import ChatMessage
from inferscale.engines.base import Engine
from inferscale.errors import MemoryNotFoundError
from inferscale.filters import Filter
from inferscale.kv.fact import FactKV
from inferscale.kv_prepare import KVPrepareReport, prepare_kv
from inferscale.kv_prune import KVPruneReport, prune_kv
from inferscale.memory import JSONGenerator
from inferscale.reconcile import ReconcileReport
from inferscale.results import changes_to_results, history_to_dict, imports_to_results, memory_to_dict
from inferscale.retrieval import Embedder, VectorIndex
from inferscale.scope import Scope, ScopeId
from inferscale.steps import arun_steps
from inferscale.storage import MemoryRecord
from inferscale.storage.async_store import AsyncMemoryStore
from inferscale.storage.change_sets import AppliedChanges, ChangeSet
from inferscale.types import ChatChunk, ChatMode, ChatResult, RecalledMemory
from inferscale.worker_threads import MODEL_WORK, ProcessThreads, on_threads

if TYPE_CHECKING:
    from inferscale.remote import AsyncRemoteMemoryClient

ENCODING_POLL_S = 0.05
"""How often :meth:`AsyncMemoryClient.wait_for_encoding` looks at the background encoder's queue (seconds): it
waits on the event loop, not in a worker thread, so it may return up to this much after the queue drained."""


class AsyncMemoryClient(ClientCore):
    """Long-term memory for agents, with ``async`` methods. Construction does no I/O.

    Args: see :class:`~inferscale.client.MemoryClient` (same config, engine, embedder and generator); with ``host``
    (and ``api_key``, ``timeout``, ``retries``) the call returns an
    :class:`~inferscale.remote.AsyncRemoteMemoryClient` on that server instead.

    Raises:
        ConfigError: for a config that does not validate; for ``host`` together with a local argument, or a remote
            argument without ``host``; for ``engine.provider="vllm"`` while a spawned child process re-runs the main
            script (:func:`~inferscale.client_core.refuse_in_spawn_bootstrap`).
    """

    _adb: AsyncMemoryStore | None = None

    _remote_class = "AsyncRemoteMemoryClient"

    @overload
    def __new__(
        cls,
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
    ) -> Self: ...

    @overload
    def __new__(  # type: ignore[misc]  # returns another class on purpose: see ClientCore.__new__'s docstring
        cls,
        config: None = None,
        *,
        engine: None = None,
        embedder: None = None,
        generator: None = None,
        host: str,
        api_key: str | None = None,
        timeout: float | None = None,
        retries: int | None = None,
        org_id: None = None,
        project_id: None = None,
    ) -> AsyncRemoteMemoryClient: ...

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """The overloads' implementation (mypy needs one here): :meth:`ClientCore.__new__
        <inferscale.client_core.ClientCore.__new__>` builds the local or the remote client.

        Raises:
            ConfigError: see the class.
        """
        return super().__new__(cls, *args, **kwargs)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> AsyncMemoryClient:
        """Build a client from a config dict: :class:`MemoryConfig` fields, Mem0's shape, or both side by side
        (see :func:`~inferscale.mem0_config.config_from_dict`).

        Raises:
            ConfigError: for a config that does not validate, a section that fits neither shape, or an unsupported
                provider.
        """
        return cls(config)

    @property
    def adb(self) -> AsyncMemoryStore:
        """The async SQL store (opened on first use)."""
        if self._adb is None:
            self._adb = AsyncMemoryStore(self._db_url(), sqlite_store=self.db)  # SQLite: one engine for both
        return self._adb

    async def _aindex(self) -> VectorIndex:
        return await arun_steps(self.derived.index_steps(), self.adb, self._index_threads())

    def _index_threads(self) -> ProcessThreads | None:
        """Where steps that use the index compute: on a model thread until the index is in use (its first use loads
        it and the embedder, and embeds every memory it lacks), then on the default executor (milliseconds)."""
        return None if self.derived.index_in_use else MODEL_WORK

    # ------------------------------------------------------------------ write path
    async def add(
        self,
        messages: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        prompt: str | None = None,
        encode_kv: bool | None = None,
        timestamp: int | float | str | None = None,
        expiration_date: str | None = None,
        output_format: str | None = None,
        version: str | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """Remember a conversation; see :meth:`MemoryClient.add` (same arguments, result and errors)."""
        refuse_unsupported_mem0("add", timestamp=timestamp, expiration_date=expiration_date)
        check_output_format(output_format)
        check_version(version)
        encode = encode_mode(encode_kv, self.config.kv.encode_on_add)
        return await self._aadd(messages, Scope.of(user_id, agent_id, run_id), metadata, infer, prompt, encode)

    async def _aadd(
        self,
        messages: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        scope: Scope,
        metadata: Mapping[str, Any] | None,
        infer: bool,
        prompt: str | None,
        encode: EncodeMode,
    ) -> dict[str, list[dict[str, Any]]]:
        meta = check_metadata(metadata)
        msgs = check_add_messages(messages, infer, self.config.max_memory_chars)
        instructions = check_add_prompt(prompt, infer, self.config.llm.custom_instructions)
        extracting = MODEL_WORK if infer else None  # the LLM decodes in the add's steps
        changes = await arun_steps(self._plan_add_steps(msgs, scope, meta, infer, instructions), self.adb, extracting)
        if changes is None:
            return {"results": []}
        if encode == "eager":  # a model that cannot be loaded or encoded with is refused before the write
            await on_threads(MODEL_WORK, self.derived.load_encoder)
        index = await self._aindex()
        applied = await self.adb.apply(changes)
        await self._aafter_write(index, applied, encode)
        return {"results": changes_to_results(applied)}

    async def _aafter_write(self, index: VectorIndex, applied: AppliedChanges, encode: EncodeMode) -> None:
        """Bring the derived stores in step with committed changes, in a worker thread (a model thread when it
        encodes, ``"eager"``); memories for the background encoder are queued on a model thread (a full queue blocks
        that thread, never the event loop nor a search's thread). ``index`` is loaded (and reconciled) before the
        SQL write, so that reconciliation never counts the write itself as a repair."""
        encoding = MODEL_WORK if encode == "eager" else None
        queued = await on_threads(encoding, self.derived.after_write, index, applied, encode)
        if queued:
            await on_threads(MODEL_WORK, self.derived.queue_encoding, queued)

    async def import_memories(
        self,
        memories: object,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        assume_utc: bool = False,
        encode_kv: bool | None = None,
        history: object = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """Store memories exported from Mem0 with their ids, scopes, metadata and times; see
        :meth:`MemoryClient.import_memories` (same arguments, result and errors). The memories' spans are measured
        on a model thread."""
        read = self._read_imports(memories, optional_scope(user_id, agent_id, run_id), assume_utc, history)
        encode = encode_mode(encode_kv, self.config.kv.encode_on_add)
        plan = await arun_steps(self._import_steps(read.memories), self.adb, MODEL_WORK)
        if encode == "eager" and (plan.changes or plan.imported_before):  # refused before the write, as add's
            await on_threads(MODEL_WORK, self.derived.load_encoder)
        applied: list[tuple[ChangeSet, AppliedChanges]] = []
        for changes in plan.changes:
            index = await self._aindex()
            done = await self.adb.apply(changes)
            await self._aafter_write(index, done, encode)
            applied.append((changes, done))
        if encode == "eager" and plan.imported_before:  # a rerun after an interruption encodes what it left
            batch = self.config.kv.encode_batch_size
            await on_threads(MODEL_WORK, prepare_kv, self.derived, plan.imported_before, batch)
        elif encode == "background" and plan.imported_before:  # the encoder skips those it finds encoded
            await on_threads(MODEL_WORK, self.derived.queue_encoding, plan.imported_before)
        return imports_to_results(applied, plan.left_out, read.expired)

    async def update(
        self,
        memory_id: str,
        text: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        *,
        data: str | None = None,
        expiration_date: str | None = None,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> dict[str, Any]:
        """Change a memory's text and/or metadata; see :meth:`MemoryClient.update`."""
        refuse_unsupported_mem0("update", expiration_date=expiration_date)
        change = self._update_change(memory_id, text, metadata, data)
        await self._arequire_in_scope(memory_id, optional_scope(user_id, agent_id, run_id))
        return await self._aupdate(memory_id, change)

    async def _aupdate(self, memory_id: str, change: ChangeSet) -> dict[str, Any]:
        await arun_steps(self._span_steps(change), self.adb)
        index = await self._aindex()
        applied = await self.adb.apply(change)
        await self._aafter_write(index, applied, encode="lazy")
        record = applied.updated[0][1] if applied.updated else await self.adb.get(memory_id)
        if record is None:
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
        return {"message": "Memory updated successfully!", "result": memory_to_dict(record)}

    async def _arequire_in_scope(self, memory_id: str, scope: Scope | None) -> None:
        if scope is not None and await self.adb.get(memory_id, scope) is None:
            raise MemoryNotFoundError(f"no memory with id {memory_id!r} in scope {scope.as_dict()}")

    async def delete(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> dict[str, str]:
        """Delete one memory, its vector and its K/V; see :meth:`MemoryClient.delete`."""
        await self._arequire_in_scope(memory_id, optional_scope(user_id, agent_id, run_id))
        return await self._adelete(memory_id)

    async def _adelete(self, memory_id: str) -> dict[str, str]:
        index = await self._aindex()
        applied = await self.adb.apply(ChangeSet(None, deletes=(memory_id,), strict=True))
        await self._aafter_write(index, applied, encode="lazy")
        return {"message": "Memory deleted successfully!"}

    async def delete_all(
        self, user_id: ScopeId | None = None, agent_id: ScopeId | None = None, run_id: ScopeId | None = None
    ) -> dict[str, Any]:
        """Delete every memory of a scope; see :meth:`MemoryClient.delete_all`.

        Raises:
            ScopeError: when no id is given (never "delete everything").
        """
        return await self._adelete_all(Scope.of(user_id, agent_id, run_id))

    async def _adelete_all(self, scope: Scope) -> dict[str, Any]:
        index = await self._aindex()
        deleted = await self.adb.delete_scope(scope)
        await self._aafter_write(index, AppliedChanges([], [], deleted, []), encode="lazy")
        return {"message": "Memories deleted successfully!", "deleted": len(deleted)}

    async def reset(self) -> None:
        """Delete every memory, history row, vector and stored K/V of this client's database."""
        await self._areset()

    async def _areset(self) -> None:
        known = (await self.adb.versions()).ids  # K/V first, as MemoryClient.reset
        await asyncio.to_thread(self.derived.forget_kv, known)
        memory_ids = await self.adb.reset()
        await asyncio.to_thread(self.derived.reset, memory_ids)

    async def reconcile(self) -> ReconcileReport:
        """Repair the FAISS index and the K/V store against SQL and report what was repaired; see
        :meth:`MemoryClient.reconcile` (SQL awaited on the event loop, files and embedding on a model thread).

        Raises:
            ConfigError: when the index file is not a readable FAISS index (delete it: it is rebuilt).
        """
        return await arun_steps(self.derived.reconcile_steps(), self.adb, MODEL_WORK)

    # ------------------------------------------------------------------ read path
    async def _asearch_records(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        steps = self.derived.search_steps(query, scope, node, limit, threshold)
        return await arun_steps(steps, self.adb, self._index_threads())

    async def search(
        self,
        query: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
        version: str | None = None,
        output_format: str | None = None,
        rerank: bool = False,
        explain: bool = False,
        reference_date: str | None = None,
        show_expired: bool = False,
    ) -> dict[str, list[dict[str, Any]]]:
        """Memories most similar to ``query``; see :meth:`MemoryClient.search` (v1 and v2 shapes)."""
        check_version(version)
        refuse_unsupported_mem0("search", rerank=rerank, explain=explain, reference_date=reference_date)
        check_flag(show_expired, "show_expired")
        check_output_format(output_format)
        args = self._search_args(query, user_id, agent_id, run_id, filters, limit, top_k, threshold)
        return await self._asearch(query, *args)

    async def _asearch(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None
    ) -> dict[str, list[dict[str, Any]]]:
        hits = await self._asearch_records(query, scope, node, limit, threshold)
        return {"results": [memory_to_dict(r, s) for r, s in hits]}

    async def recall(
        self,
        query: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
    ) -> list[RecalledMemory]:
        """What :meth:`search` finds, as records with their scores; see :meth:`MemoryClient.recall`."""
        args = self._search_args(query, user_id, agent_id, run_id, filters, limit, top_k, threshold)
        hits = await self._asearch_records(query, *args)
        return [RecalledMemory(record, score) for record, score in hits]

    async def memory_kv(self, memories: Sequence[MemoryRecord | str]) -> list[FactKV]:
        """The K/V of ``memories`` (records or ids) as :meth:`chat` serves them, loaded or encoded on a model
        thread; see :meth:`MemoryClient.memory_kv` (same errors)."""
        records = [m if isinstance(m, MemoryRecord) else await self._arecord(m) for m in check_memories(memories)]
        return await on_threads(MODEL_WORK, self.derived.memory_kv, records)

    async def _arecord(self, memory_id: str) -> MemoryRecord:
        record = await self.adb.get(memory_id)
        if record is None:
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
        return record

    async def get(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> dict[str, Any] | None:
        """One memory by id, or ``None``; see :meth:`MemoryClient.get`."""
        return await self._aget(memory_id, optional_scope(user_id, agent_id, run_id))

    async def _aget(self, memory_id: str, scope: Scope | None = None) -> dict[str, Any] | None:
        record = await self.adb.get(memory_id, scope)
        return memory_to_dict(record) if record is not None else None

    async def get_all(
        self,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        top_k: int | None = None,
        version: str | None = None,
        output_format: str | None = None,
        show_expired: bool = False,
    ) -> dict[str, list[dict[str, Any]]]:
        """The scope's memories matching ``filters``, oldest first; see :meth:`MemoryClient.get_all`."""
        check_version(version)
        check_output_format(output_format)
        check_flag(show_expired, "show_expired")
        scope, node = resolve_scope(user_id, agent_id, run_id, filters)
        return await self._aget_all(scope, node, resolve_limit(limit, top_k))

    async def _aget_all(self, scope: Scope, node: Filter | None, limit: int) -> dict[str, list[dict[str, Any]]]:
        if limit == 0:
            return {"results": []}
        return {"results": [memory_to_dict(r) for r in await self.adb.list(scope, limit=limit, filters=node)]}

    async def history(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> list[dict[str, Any]]:
        """Every change to a memory, oldest first; see :meth:`MemoryClient.history`."""
        scope = optional_scope(user_id, agent_id, run_id)
        return [history_to_dict(row) for row in await self.adb.history(memory_id, scope)]

    @overload
    async def chat(
        self,
        query: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any] | ChatMessage] | None = None,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        memory_ids: Sequence[str] | None = None,
        search_query: str | None = None,
        mode: ChatMode = "kv",
        stream: Literal[False] = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        repetition_penalty: float | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> ChatResult: ...

    @overload
    async def chat(
        self,
        query: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any] | ChatMessage] | None = None,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        memory_ids: Sequence[str] | None = None,
        search_query: str | None = None,
        mode: ChatMode = "kv",
        stream: Literal[True],
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        repetition_penalty: float | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> AsyncGenerator[ChatChunk, None]: ...

    async def chat(
        self,
        query: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any] | ChatMessage] | None = None,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        filters: Mapping[str, Any] | None = None,
        limit: int | None = None,
        memory_ids: Sequence[str] | None = None,
        search_query: str | None = None,
        mode: ChatMode = "kv",
        stream: bool = False,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        repetition_penalty: float | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> ChatResult | AsyncGenerator[ChatChunk, None]:
        """Answer a question or a conversation with the scope's memories; see :meth:`MemoryClient.chat` (same
        arguments, results and errors). Retrieval is async; K/V loading, prefill and decode run in a worker thread.
        With ``stream=True`` the awaited call returns an async iterator of :class:`ChatChunk`; the answer is
        generated on a thread of its own and handed to the loop chunk by chunk (closing the iterator early stops
        generation after the current token)."""
        request = resolve_chat(
            query,
            messages=messages,
            user_id=user_id,
            agent_id=agent_id,
            run_id=run_id,
            filters=filters,
            limit=limit,
            memory_ids=memory_ids,
            search_query=search_query,
            mode=mode,
            stream=stream,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            repetition_penalty=repetition_penalty,
            stop=stop,
        )
        # No foreground mark across an await: it would cover the wait for a free model thread (or the model's load),
        # while the model threads may be blocked in a full encode queue that only the encoder drains. The model's
        # uses mark themselves on their worker thread (_generate, _chunks and its steps).
        closing = self._closing  # a close() from now on ends this chat
        self._refuse_if_closed(closing)  # begun while close() runs: the model is not loaded again
        await on_threads(MODEL_WORK, self.engine.load)  # model load is not part of the request's latency
        t0 = time.perf_counter()
        records = await self._achat_records(request)
        retrieval_ms = ms_since(t0)
        if request.stream:
            self._refuse_if_closed(closing)  # closed while the memories were chosen
            chunks = await on_threads(MODEL_WORK, self._chunks, request, records, t0, retrieval_ms, closing)
            return _iterate_on_thread(chunks)
        abandoned = threading.Event()
        try:
            return await on_threads(MODEL_WORK, self._generate, request, records, t0, retrieval_ms, abandoned, closing)
        finally:  # cancelled (a timeout, a server client gone): the worker stops decoding within one token
            abandoned.set()

    async def _achat_records(self, request: ChatRequest) -> list[MemoryRecord]:
        """The memories ``request`` injects; see :meth:`MemoryClient._chat_records`."""
        if request.memory_ids is None:

            async def search(k: int) -> list[MemoryRecord]:
                hits = await self._asearch_records(request.search_query, request.scope, request.node, k)
                return [r for r, _ in hits]

            return await SentTexts.of(request.conversation).aretrieve_unsent(search, request.limit)  # as sync
        records = []
        for memory_id in request.memory_ids:
            record = await self.adb.get(memory_id, request.scope)
            if record is None:
                raise MemoryNotFoundError(f"no memory with id {memory_id!r} in scope {request.scope.as_dict()}")
            records.append(record)
        return records

    async def prepare_kv(
        self, *, user_id: ScopeId | None = None, agent_id: ScopeId | None = None, run_id: ScopeId | None = None
    ) -> KVPrepareReport:
        """Encode now, and store, the K/V a :meth:`chat` would otherwise encode on first use; see
        :meth:`MemoryClient.prepare_kv` (same arguments, result and errors). SQL is awaited on the event loop, the
        encoding runs on a model thread."""
        ids = (await self.adb.versions(optional_scope(user_id, agent_id, run_id))).ids  # no texts
        return await on_threads(MODEL_WORK, prepare_kv, self.derived, ids, self.config.kv.encode_batch_size)

    async def prune_kv(
        self,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        dry_run: bool = False,
    ) -> KVPruneReport:
        """Remove the stored K/V that no :meth:`chat` of this client looks up; see :meth:`MemoryClient.prune_kv`
        (same arguments, result and errors). SQL is awaited on the event loop, the rest (tokenising, files) runs on
        a model thread."""
        check_flag(dry_run, "dry_run")
        ids = (await self.adb.versions(optional_scope(user_id, agent_id, run_id))).ids  # no texts
        return await on_threads(MODEL_WORK, prune_kv, self.derived, ids, dry_run=dry_run)

    async def wait_for_encoding(self, timeout: float | None = None) -> bool:
        """Wait until the background K/V encoder has finished what ``add`` queued; see
        :meth:`MemoryClient.wait_for_encoding` (same argument, result and errors). It waits on the event loop,
        looking at the queue every :data:`ENCODING_POLL_S` seconds, and holds no worker thread (a server's many
        waits would otherwise fill the pool every other request needs)."""
        limit = check_timeout(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        while self.derived.pending_encoding():
            left = ENCODING_POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(left, ENCODING_POLL_S))
        return True

    async def close(self, *, encoding_timeout: float | None = None) -> None:
        """Wait for the background K/V encoder to finish (it stays closed), for at most ``encoding_timeout`` seconds
        (``None``: however long it takes), write the index file if it changed, and release what this client opened
        or built; see :meth:`MemoryClient.close` (same argument and errors)."""
        limit = check_timeout(encoding_timeout, "encoding_timeout")
        deadline = None if limit is None else time.monotonic() + limit  # counted from now, not from a free thread

        def close_encoding() -> list[str]:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self.derived.close_encoding(left)

        self._closing.set()
        try:
            # waits for the encoder's queue to drain, or for the timeout and the chunk running; a model thread may be
            # free only after the deadline (a review's find: the timeout then started late), so it counts from here
            await on_threads(MODEL_WORK, close_encoding)
            await asyncio.to_thread(self._release)
            if self._adb is not None:
                await self._adb.close()
            if self._db is not None:
                await asyncio.to_thread(self._db.close)
        finally:
            self._closing = threading.Event()  # for the chats that begin from now on

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def _iterate_on_thread(chunks: Generator[ChatChunk, None, None]) -> AsyncGenerator[ChatChunk, None]:
    """Run ``chunks`` on a thread of its own (decoding is CPU/GPU-bound; the event loop stays free) and hand each
    chunk to the loop as it is produced.

    The thread computes at most one chunk ahead of the consumer: after handing one over it waits until the consumer
    asks for the next. So a consumer that stops reading (``break``) stops the decoding within one token, and
    closing the iterator (``await it.aclose()``, or dropping it) closes the generator on its thread, which ends
    the engine request and frees its cache.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    wanted = threading.Semaphore(0)  # one release per chunk the consumer asks for after the first
    stopped = threading.Event()

    def hand_over(kind: str, value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the stream ran
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

    def pump() -> None:
        try:
            for chunk in chunks:
                hand_over("chunk", chunk)
                wanted.acquire()
                if stopped.is_set():
                    break
        except BaseException as exc:  # handed to the consumer, who re-raises it
            hand_over("error", exc)
        finally:
            chunks.close()
            hand_over("end", None)

    threading.Thread(target=pump, name="inferscale-chat-stream", daemon=True).start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
            wanted.release()
    finally:
        stopped.set()
        wanted.release()


AsyncMemory = AsyncMemoryClient
