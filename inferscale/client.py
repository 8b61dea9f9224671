"""The public API: :class:`MemoryClient` (alias :class:`Memory`), shaped like Mem0's in both call shapes.

- v1: scope ids as keyword arguments, ``search(query, user_id="alice", limit=5)``;
- v2: scope ids inside ``filters``, ``search(query, filters={"user_id": "alice"}, top_k=5)``.

Writes go to SQL first (the source of truth), in one transaction per call with a history row per change; the
FAISS index and the fact K/V are derived from it (:mod:`inferscale.derived`). A call that fails validation raises
before anything is written. :class:`~inferscale.client_core.ClientCore` holds what this client shares with
:class:`inferscale.async_client.AsyncMemoryClient`.

Why one file over 400 lines: one documented public method per Mem0 call (v1 and v2 shapes), each a thin shell over
the shared core and the derived stores; the logic lives in :mod:`inferscale.client_core` and :mod:`inferscale.derived`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
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
from inferscale.steps import run_steps
from inferscale.storage import MemoryRecord
from inferscale.storage.change_sets import AppliedChanges, ChangeSet
from inferscale.types import ChatChunk, ChatMode, ChatResult, RecalledMemory

if TYPE_CHECKING:
    from inferscale.remote import RemoteMemoryClient


class MemoryClient(ClientCore):
    """Long-term memory for agents, with KV-injected recall in :meth:`chat`.

    Construction does no I/O: the database, index and models are opened on first use. Every public method
    that answers in Mem0's shapes delegates to a protected one of the same name (``add`` → ``_add``), the shape
    the async client mirrors.

    Args:
        config: a :class:`MemoryConfig`, a dict of its fields, or a Mem0-shaped dict (``{"llm": {"provider": ...,
            "config": {...}}, "vector_store": ..., "history_db_path": ...}``); ``llm`` and ``embedder`` are each read
            in the shape their keys show (:func:`~inferscale.mem0_config.config_from_dict`). ``None`` runs on the
            embedded defaults.
        engine: an engine to use instead of building one from ``config.engine`` (tests, shared models).
        embedder: an embedder to use instead of ``config.embedder``.
        generator: a JSON generator for fact extraction and reconcile instead of ``config.llm``.
        host: an InferScale server's URL (``"http://127.0.0.1:8000"``): the call returns a
            :class:`~inferscale.remote.RemoteMemoryClient` on it instead, with the same memory and chat methods,
            arguments, results and errors (not the local store's own: ``recall``, ``memory_kv``, ``reconcile``,
            ``prepare_kv``, ``context_window``, ``model_name``, ``kv_store``). Only ``api_key``, ``timeout`` and
            ``retries`` may come with it.
        api_key, timeout, retries: the remote client's (see :class:`~inferscale.remote.RemoteMemoryClient`);
            ``api_key`` defaults to ``INFERSCALE_API_KEY``.
        org_id, project_id: Mem0 platform arguments, accepted as ``None`` only (they have no counterpart here).

    Raises:
        ConfigError: for a config that does not validate or an ``llm``/``embedder`` section that fits neither
            shape (the message names it and the keys that do not fit); for ``host`` together with ``config``,
            ``engine``, ``embedder`` or ``generator`` (a remote client uses the server's), or ``api_key``,
            ``timeout`` or ``retries`` without ``host``; for an ``org_id`` or ``project_id`` that is not ``None``;
            for ``engine.provider="vllm"`` while a spawned child process re-runs the main script
            (:func:`~inferscale.client_core.refuse_in_spawn_bootstrap`).
    """

    _remote_class = "RemoteMemoryClient"

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
    ) -> RemoteMemoryClient: ...

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """The overloads' implementation (mypy needs one here): :meth:`ClientCore.__new__
        <inferscale.client_core.ClientCore.__new__>` builds the local or the remote client.

        Raises:
            ConfigError: see the class.
        """
        return super().__new__(cls, *args, **kwargs)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MemoryClient:
        """Build a client from a config dict: :class:`MemoryConfig` fields, Mem0's shape, or both side by side
        (see :func:`~inferscale.mem0_config.config_from_dict`).

        Raises:
            ConfigError: for a config that does not validate, a section that fits neither shape, or an unsupported
                provider.
        """
        return cls(config)

    @property
    def index(self) -> VectorIndex:
        """The FAISS index, loaded from disk and reconciled with SQL on first use (:meth:`reconcile`)."""
        return run_steps(self.derived.index_steps(), self.db)

    # ------------------------------------------------------------------ write path
    def add(
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
        """Remember a conversation.

        With ``infer=True`` the LLM extracts facts (JSON-constrained; chunk by chunk for long conversations). Facts
        already stored verbatim in the scope are dropped; for the rest, similar stored memories of the scope are
        retrieved and the LLM decides ADD, UPDATE, DELETE or NONE (see :mod:`inferscale.memory.reconcile`). With
        ``infer=False`` every non-system message is stored as it is, with its ``role`` and, when it has a ``name``,
        that name as ``actor_id`` (in its metadata; the result dicts show both beside the scope ids, as Mem0's do). All
        changes and their history rows are written in one transaction. New and updated memories are embedded before the
        call returns (``search`` finds them at once); deleted ones lose their vector and K/V. The new and updated
        memories' K/V are encoded as ``config.kv.encode_on_add`` says: by a background thread after the call returns
        (``"background"``, the default: what ``chat`` injects never depends on timing, it encodes any memory it
        retrieves that is not encoded yet; a chat that arrives while the thread encodes waits for one chunk of
        ``kv.encode_chunk_size`` facts at most, but a streamed one may wait for a chunk at each token, since the thread
        may run one between two steps of a stream; the call blocks only while ``kv.encode_queue_size`` memories already
        wait), inside the call (``"eager"``), or on the first ``chat`` that retrieves them (``"lazy"``).
        ``encode_kv=True`` asks for eager and ``encode_kv=False`` for lazy in this call. ``prompt`` is Mem0's per-call
        custom instructions for fact extraction (what to save or skip, how to word facts): with ``infer=True`` the LLM
        is shown them after the extraction prompt's own rules, instead of ``llm.custom_instructions`` for this call.

        Returns:
            ``{"results": [{"id", "memory", "event"}, ...]}`` with event ``"ADD"``, ``"UPDATE"`` (plus
            ``"previous_memory"``) or ``"DELETE"``; ``[]`` when nothing changed.

        ``timestamp`` and ``expiration_date`` are Mem0 2.x arguments accepted only as ``None`` or ``False``: a memory is
        timestamped when it is added, and memories do not expire. ``version`` is Mem0's (``"v1"`` or ``"v2"``):
        checked, and changes nothing.

        Raises:
            ScopeError: when no user_id, agent_id or run_id is given, or one is neither a non-empty string nor an int.
            InvalidInputError: for malformed messages, an ``infer`` or ``encode_kv`` that is not a bool (``None``
                also for ``encode_kv``), metadata that is not a dict of plain JSON (str keys at any depth, no NaN)
                or sets a scope id or ``actor_id``, a ``prompt`` that is not a non-blank string of at most
                :data:`~inferscale.config.MAX_INSTRUCTIONS_CHARS` characters or is given with ``infer=False``, a
                ``timestamp``/``expiration_date`` (not supported), or a
                ``version`` other than ``"v1"``/``"v2"``; for a fact too long for the model's context once encoded
                after the system prefix alone (at the farthest position bucket), or a text it would give a stored
                memory that is too long after that memory's context turns, in every ``encode_on_add`` mode and
                before anything is written (the message names it and the positions it needs, as the encoder's does).
                A new memory whose context turns would not fit with it keeps its last turns that fit. Measured with
                the model's tokenizer and config alone: an ``add`` never loads the model's weights for it.
            ModelNotAvailableError, ConfigError: when the chat model's tokenizer or config cannot be found, or its
                tokenizer has no usable chat template, or the engine cannot be built (needed to measure the memories'
                spans; nothing is written). With eager encoding (``encode_kv=True``, ``kv.encode_on_add="eager"``)
                the model itself is loaded before anything is written, and a ``ConfigError`` also means its weights
                cannot be loaded.
            UnsupportedModelError: with eager encoding, for a model whose keys InferScale cannot rotate (see
                docs/architecture.md, "RoPE coverage"); nothing is written. Background and lazy encoding load no
                model in ``add``: the memory is stored, and the encoder, a chat or ``prepare_kv`` raises it later.
            ExtractionError: when the LLM backend gives no answer (unreachable, an HTTP error, no text content;
                nothing is written). A malformed answer is repaired, asked again once or stored verbatim instead.
        """
        refuse_unsupported_mem0("add", timestamp=timestamp, expiration_date=expiration_date)
        check_output_format(output_format)
        check_version(version)
        encode = encode_mode(encode_kv, self.config.kv.encode_on_add)
        return self._add(messages, Scope.of(user_id, agent_id, run_id), metadata, infer, prompt, encode)

    def _add(
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
        changes = run_steps(self._plan_add_steps(msgs, scope, meta, infer, instructions), self.db)
        if changes is None:
            return {"results": []}
        if encode == "eager":  # a model that cannot be loaded or encoded with is refused before the write
            self.derived.load_encoder()
        applied = self._commit(lambda: self.db.apply(changes), encode)
        return {"results": changes_to_results(applied)}

    def _commit(self, write: Callable[[], AppliedChanges], encode: EncodeMode) -> AppliedChanges:
        """Run the SQL ``write``, then bring the index and the K/V in step with it, under the client's lock. The
        index is loaded (and reconciled) before the write, so reconciliation never counts the write as a repair.
        Memories for the background encoder are queued after the lock is released (a full queue blocks here, and
        the encoder needs the lock to drain it)."""
        with self._lock:
            index = self.index
            applied = write()
            queued = self.derived.after_write(index, applied, encode)
        self.derived.queue_encoding(queued)
        return applied

    def import_memories(
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
        """Store memories exported from Mem0, each with its id, text, scope, metadata and times: how a Mem0 user's
        memories move over (:mod:`inferscale.mem0_import`; ``inferscale import-mem0`` reads Mem0's files).

        ``memories`` is a list of Mem0 memories: result items as Mem0's ``get_all`` returns them (its
        ``{"results": [...]}`` is taken too), or Mem0's vector store payloads with their id (as
        :func:`inferscale.mem0_import.read_mem0_file` reads them from a local Qdrant or faiss store). Given ids keep
        only the memories of that scope (ids ANDed). Every record is checked before anything is written: one bad record
        refuses the call and stores none. Each scope's memories are then stored in one transaction, in the order Mem0
        created them, each with the context turns (and K/V) ``add(infer=False)`` of its text would give it, one call
        after another (no LLM call), embedded, and their K/V encoded as ``add``'s are (``encode_kv``, else
        ``kv.encode_on_add``; for a large import, ``encode_kv=False`` and ``inferscale prepare-kv`` later keep the
        call short). The memories skipped as imported before get the K/V they lack too, now or queued as
        ``encode_kv`` says (not with ``False``), so that an import run again after an interruption finishes their
        encoding. Each keeps its Mem0 id, so an app's stored ids still name it. Its history is Mem0's when ``history``
        is given: Mem0's history rows (:func:`inferscale.mem0_history.read_mem0_history` reads its ``history.db``), of
        which those of the memories imported are stored, each dated as in Mem0; without ``history``, or for a memory it
        has no row of, one ADD dated when Mem0 created it. Running the same import again stores nothing twice: a memory
        whose id is stored already is skipped (its text is not updated), and so is one whose id a memory deleted here
        had. Mem0's vectors are not read: InferScale embeds the texts with its own embedder.

        Returns:
            ``{"results": [{"id", "memory", "event": "ADD", ...}, ...], "skipped": [{"id", "reason"}, ...]}``;
            skipped are the memories imported before (the reason says when the stored text differs), those whose id a
            deleted memory had, and those Mem0 hides as expired.

        Raises:
            InvalidInputError: naming the record, for one Mem0 did not write (no id or text, an id that is not a
                canonical UUID, a time without a zone unless ``assume_utc``, bad metadata, an unknown key; see
                :func:`inferscale.mem0_import.mem0_memories`), a text longer than ``max_memory_chars`` or too long
                for the model's context once encoded, an ``expiration_date`` not yet past (InferScale does not expire
                memories), two records that differ with one id, an id held by a memory of another scope, or
                ``history`` rows of a memory that are not its ADD and UPDATEs up to its text (see
                :func:`inferscale.mem0_history.with_history`): found
                while checking, before anything is written. While writing, each scope's memories are one
                transaction: another import that stores one of the ids in another scope first (then refused as
                above) or a database failure leaves the scopes written before it; run the import again to finish it.
            ScopeError: for a record without a user, agent or run id.
            ModelNotAvailableError, ConfigError: as :meth:`add` (the memories' spans are measured with the chat
                model's tokenizer).
        """
        read = self._read_imports(memories, optional_scope(user_id, agent_id, run_id), assume_utc, history)
        encode = encode_mode(encode_kv, self.config.kv.encode_on_add)
        plan = run_steps(self._import_steps(read.memories), self.db)
        if encode == "eager" and (plan.changes or plan.imported_before):  # refused before the write, as add's
            self.derived.load_encoder()
        applied = [
            (changes, self._commit(functools.partial(self.db.apply, changes), encode)) for changes in plan.changes
        ]
        if encode == "eager" and plan.imported_before:  # a rerun after an interruption encodes what it left
            prepare_kv(self.derived, plan.imported_before, self.config.kv.encode_batch_size)
        elif encode == "background" and plan.imported_before:  # the encoder skips those it finds encoded
            self.derived.queue_encoding(plan.imported_before)
        return imports_to_results(applied, plan.left_out, read.expired)

    def update(
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
        """Change a memory's text (``text``, or Mem0's ``data``) and/or merge new metadata into its metadata, key by
        key, as Mem0 does (the ``role`` and ``actor_id`` it was stored with stay unless it names ``role``); records an
        UPDATE history row. A new text is re-embedded and its K/V dropped (encoded again on next use, lazily); a
        metadata-only update keeps the vector and the K/V.

        Returns:
            ``{"message": "Memory updated successfully!", "result": <memory dict>}`` (the dict as after the update;
            unchanged when the new values equal the old ones, and then no history row is written).

        Raises:
            InvalidInputError: when nothing is given, text and data disagree, the new text is no str (checked before
                the memory is looked up), metadata sets a scope id or ``actor_id``, or the new text is longer than
                ``max_memory_chars`` or too long for the model's context once encoded after the memory's context
                turns (nothing is written; see :meth:`add`).
            MemoryNotFoundError: when no memory has that id (or it is outside the scope the given ids name).

        ``expiration_date`` is Mem0 2.x's, accepted only as ``None`` or ``False``: memories do not expire.
        """
        refuse_unsupported_mem0("update", expiration_date=expiration_date)
        change = self._update_change(memory_id, text, metadata, data)
        self._require_in_scope(memory_id, optional_scope(user_id, agent_id, run_id))
        return self._update(memory_id, change)

    def _update(self, memory_id: str, change: ChangeSet) -> dict[str, Any]:
        run_steps(self._span_steps(change), self.db)
        applied = self._commit(lambda: self.db.apply(change), encode="lazy")
        record = applied.updated[0][1] if applied.updated else self.db.get(memory_id)
        if record is None:  # deleted between the two statements
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
        return {"message": "Memory updated successfully!", "result": memory_to_dict(record)}

    def delete(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> dict[str, str]:
        """Delete one memory, its vector and its K/V from every tier; records a DELETE history row that keeps
        the old text. Given ids restrict it to a memory of that scope.

        Returns:
            ``{"message": "Memory deleted successfully!"}``.

        Raises:
            MemoryNotFoundError: when no memory has that id (or it is outside the scope the given ids name).
            InvalidInputError: for an id that is not a non-empty str.
        """
        self._require_in_scope(memory_id, optional_scope(user_id, agent_id, run_id))
        return self._delete(memory_id)

    def _delete(self, memory_id: str) -> dict[str, str]:
        self._commit(lambda: self.db.apply(ChangeSet(None, deletes=(memory_id,), strict=True)), encode="lazy")
        return {"message": "Memory deleted successfully!"}

    def delete_all(
        self, user_id: ScopeId | None = None, agent_id: ScopeId | None = None, run_id: ScopeId | None = None
    ) -> dict[str, Any]:
        """Delete every memory of a scope (ids ANDed), with their vectors, K/V and a DELETE history row each.

        Returns:
            ``{"message": "Memories deleted successfully!", "deleted": <count>}``.

        Raises:
            ScopeError: when no id is given: this never means "delete everything" (that is :meth:`reset`).
        """
        return self._delete_all(Scope.of(user_id, agent_id, run_id))

    def _delete_all(self, scope: Scope) -> dict[str, Any]:
        deleted = self._commit(lambda: AppliedChanges([], [], self.db.delete_scope(scope), []), encode="lazy").deleted
        return {"message": "Memories deleted successfully!", "deleted": len(deleted)}

    def reset(self) -> None:
        """Delete every memory, history row, vector and stored K/V of this client's database."""
        self._reset()

    def _reset(self) -> None:
        with self._lock:
            # K/V first: once the commit resets the history that names these memories as this database's, a crash
            # before their removal would leave them for good (another database may share the K/V folder)
            self.derived.forget_kv(self.db.versions().ids)
            self.derived.reset(self.db.reset())

    def reconcile(self) -> ReconcileReport:
        """Repair the FAISS index and the K/V store against SQL, the source of truth, and report what was repaired.

        It runs on its own when the client first uses its index; call it to check or repair a store that other
        processes write to, or after a crash of one of them. Vectors missing, stale (embedded from an older text)
        or of deleted memories are fixed; K/V files of deleted or re-worded memories, rows whose file is gone and
        temporary files of dead writers are removed (:meth:`inferscale.derived.DerivedStores.reconcile_steps`).

        Returns:
            A :class:`~inferscale.reconcile.ReconcileReport` of counts (all 0 when everything was in step).

        Raises:
            ConfigError: when the index file is not a readable FAISS index (delete it: it is rebuilt).
        """
        with self._lock:
            return run_steps(self.derived.reconcile_steps(), self.db)

    # ------------------------------------------------------------------ read path
    def _search_records(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        with self._lock:
            return run_steps(self.derived.search_steps(query, scope, node, limit, threshold), self.db)

    def search(
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
            rerank, explain, reference_date, show_expired: Mem0 2.x arguments. ``show_expired`` changes nothing
                (no memory expires, so all are shown); the others are accepted only at their default (``False`` /
                ``None``) and refused otherwise (no reranker, no explanations, no expiry).

        Returns:
            ``{"results": [<memory dict> + {"score"}, ...]}``.

        Raises:
            ScopeError: when no id is given, or an id is neither a non-empty string nor an int.
            InvalidInputError: for an empty query, a bad limit or filter, a ``threshold`` that is not a finite
                number, or a ``show_expired`` that is not a bool.
        """
        check_version(version)
        refuse_unsupported_mem0("search", rerank=rerank, explain=explain, reference_date=reference_date)
        check_flag(show_expired, "show_expired")
        check_output_format(output_format)
        return self._search(
            query, *self._search_args(query, user_id, agent_id, run_id, filters, limit, top_k, threshold)
        )

    def _search(
        self, query: str, scope: Scope, node: Filter | None, limit: int, threshold: float | None
    ) -> dict[str, list[dict[str, Any]]]:
        hits = self._search_records(query, scope, node, limit, threshold)
        return {"results": [memory_to_dict(r, s) for r, s in hits]}

    def recall(
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
        """What :meth:`search` finds, as records: the scope's memories most similar to ``query``, best first.

        For callers that go on to use the memories themselves (a server building its own request, a benchmark, an
        evaluation): each :class:`~inferscale.types.RecalledMemory` holds the stored record (id, text, scope,
        context, vector id) and its cosine score. Pass the records to :meth:`memory_kv` for their K/V.

        Raises:
            ScopeError: when no id is given, or an id is neither a non-empty string nor an int.
            InvalidInputError: for an empty query, a bad limit or filter, or a ``threshold`` that is not a finite
                number.
        """
        hits = self._search_records(
            query, *self._search_args(query, user_id, agent_id, run_id, filters, limit, top_k, threshold)
        )
        return [RecalledMemory(record, score) for record, score in hits]

    def memory_kv(self, memories: Sequence[MemoryRecord | str]) -> list[FactKV]:
        """The K/V of ``memories`` as :meth:`chat` serves them in this order: pre-RoPE keys and values per layer,
        loaded from the K/V store, or encoded now (and stored) when missing or stale.

        Args:
            memories: stored memories in the order they are laid out: records (e.g. from :meth:`recall`) or ids.

        Returns:
            One :class:`~inferscale.kv.fact.FactKV` per memory (keys ``[n_layers, n_kv_heads, n_tokens, head_dim]``
            before RoPE, values alike, in the engine's dtype), on the engine's device or host.

        Raises:
            MemoryNotFoundError: for an id that names no stored memory.
            InvalidInputError: when ``memories`` is not a list (a str would be read one id per character), for an
                id that is not a non-empty str, or a memory too long for the model's context even without its
                context turns (named by its id).
            KVFingerprintMismatchError: when a stored file was written by another model or encoding.
        """
        records = [m if isinstance(m, MemoryRecord) else self._record(m) for m in check_memories(memories)]
        with self._lock:
            return self.derived.memory_kv(records)

    def _record(self, memory_id: str) -> MemoryRecord:
        record = self.db.get(memory_id)
        if record is None:
            raise MemoryNotFoundError(f"no memory with id {memory_id!r}")
        return record

    def get(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
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
        """The memories of the scope that match ``filters``, oldest first, at most ``limit`` (default 100).
        ``show_expired`` is Mem0 2.x's and changes nothing (no memory expires, so all are shown).

        Returns:
            ``{"results": [<memory dict>, ...]}``.

        Raises:
            ScopeError: when no id is given (as a keyword or inside ``filters``). InvalidInputError: for a bad
            limit or filter.
        """
        check_version(version)
        check_output_format(output_format)
        check_flag(show_expired, "show_expired")
        scope, node = resolve_scope(user_id, agent_id, run_id, filters)
        return self._get_all(scope, node, resolve_limit(limit, top_k))

    def _get_all(self, scope: Scope, node: Filter | None, limit: int) -> dict[str, list[dict[str, Any]]]:
        if limit == 0:
            return {"results": []}
        return {"results": [memory_to_dict(r) for r in self.db.list(scope, limit=limit, filters=node)]}

    def history(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> list[dict[str, Any]]:
        """Every change to a memory, oldest first, also after it was deleted. With ids given, only a memory that
        was in that scope has a history (the rows of a memory deleted before the store recorded scopes in its
        history, schema revision 0004, are read without ids only).

        Returns:
            ``[{"id", "memory_id", "event", "old_memory", "new_memory", "old_metadata", "new_metadata",
            "actor_id", "role", "created_at", "is_deleted"}, ...]`` with the memory's scope ids; ``[]`` for an
            unknown id or one outside the scope.

        Raises:
            InvalidInputError: when ``memory_id`` is not a non-empty string.
        """
        scope = optional_scope(user_id, agent_id, run_id)
        return [history_to_dict(row) for row in self.db.history(memory_id, scope)]

    # ------------------------------------------------------------------ chat
    @overload
    def chat(
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
    def chat(
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
    ) -> Generator[ChatChunk, None, None]: ...

    def chat(
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
    ) -> ChatResult | Generator[ChatChunk, None, None]:
        """Answer a question or a conversation with the scope's memories.

        The prompt is ``[system prefix][memory segment][conversation]``: the configured ``system_prompt`` (fixed,
        so stored fact K/V stay reusable), the memories, then everything the caller sends (system text, earlier
        turns, the last user turn) in the model's chat template, prefilled. ``mode="kv"`` writes the memories'
        K/V into the engine's KV cache, rotated to their positions, and prefills only the conversation;
        ``mode="prompt"`` pastes the same memories, as the same tokens, into the prompt (the Mem0-style baseline).

        Args:
            query: a single question (one user turn). Pass it or ``messages``.
            messages: the conversation, ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``,
                ending with a user (or system) turn.
            user_id, agent_id, run_id, filters: whose memories (v1 ids or v2 ``filters``); required.
            limit: memories retrieved (default 5); one whose text is a user or assistant message of the
                conversation is left out, and the next takes its place (the prompt holds that text already).
            memory_ids: inject exactly these memories of the scope, in this order, with no retrieval.
            search_query: what to retrieve with (default: the last user message).
            mode: ``"kv"`` (KV injection) or ``"prompt"``.
            stream: return an iterator of :class:`ChatChunk` instead of a :class:`ChatResult`.
            max_new_tokens: answer budget (tokens; default the engine config's).
            temperature, top_p, top_k, seed, repetition_penalty: sampling; the default (temperature 0) is greedy.
                ``top_k`` here is the sampler's top-k, not a retrieval count (use ``limit``).
            stop: a string or strings that end the answer (not included).

        Returns:
            :class:`ChatResult` (answer, memory ids, token counts, finish reason, timings in ms); with
            ``stream=True`` an iterator of :class:`ChatChunk` whose deltas joined are the answer and whose last
            chunk carries the :class:`ChatResult`. Several streams may be open at once (their decoding steps
            interleave), and the client may be used between two chunks.

        Raises:
            ScopeError: when no scope id is given.
            InvalidInputError: for bad messages (empty, an unknown role, no user message), both or neither of
                ``query`` and ``messages``, ``memory_ids`` with ``limit``/``filters``/``search_query``, a bad mode,
                budget or sampling value (``temperature < 0``, ``top_p`` outside (0, 1]), a conversation the chat
                template refuses, a prompt longer than the model's context
                (:class:`~inferscale.errors.ContextLengthError`, an ``InvalidInputError``), or a ``memory_ids`` entry
                too long for it even without its context turns. Raised before anything is generated, also when
                streaming.
                A memory too long only with its turns is served from its context-free encoding; a *retrieved* one
                too long even without them (stored under a model with a longer context), or too long with this
                chat's conversation and answer budget, is left out with a warning instead, in both modes. The
                prompt's size is checked from token counts before any K/V is loaded or encoded.
            MemoryNotFoundError: for a ``memory_ids`` entry that is not a memory of the scope.
        """
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
        # The lock covers choosing the memories and opening the answer (their K/V loaded or encoded), not decoding:
        # held through a whole answer, it made a search on another thread wait 11 s (a review's threaded app). The
        # model's uses mark themselves (_chunks, _answer), so the encoder yields to them.
        closing = self._closing  # a close() from now on ends this chat
        with contextlib.ExitStack() as answering:
            with self._lock:
                self._refuse_if_closed(closing)  # it waited for the lock while close() released the engine
                self.engine.load()  # model load is not part of the request's latency
                t0 = time.perf_counter()
                records = self._chat_records(request)
                retrieval_ms = ms_since(t0)
                if not request.stream:  # one use of the model from opening the answer to its last token
                    answering.enter_context(self.derived.foreground())
                chunks = self._chunks(request, records, t0, retrieval_ms, closing)
            return chunks if request.stream else self._answer(chunks, closing)

    def _chat_records(self, request: ChatRequest) -> list[MemoryRecord]:
        """The memories ``request`` injects: its ``memory_ids`` (each must be in the scope), or the top ``limit``
        for its ``search_query`` whose text is none of the conversation's messages (:class:`SentTexts`)."""
        if request.memory_ids is None:

            def search(k: int) -> list[MemoryRecord]:
                return [r for r, _ in self._search_records(request.search_query, request.scope, request.node, k)]

            # best first: _servable keeps those that fit, then lays them out
            return SentTexts.of(request.conversation).retrieve_unsent(search, request.limit)
        records = []
        for memory_id in request.memory_ids:
            record = self.db.get(memory_id, request.scope)
            if record is None:
                raise MemoryNotFoundError(f"no memory with id {memory_id!r} in scope {request.scope.as_dict()}")
            records.append(record)
        return records

    def prepare_kv(
        self, *, user_id: ScopeId | None = None, agent_id: ScopeId | None = None, run_id: ScopeId | None = None
    ) -> KVPrepareReport:
        """Encode now, and store, the K/V a :meth:`chat` would otherwise encode on first use: those of every memory
        of the scope (every memory of the database when no id is given) that no tier holds under the current model
        and ``kv`` settings. Run it after changing the model, its dtype, ``kv.storage_format``,
        ``kv.context_window`` or ``kv.position_buckets``, or on a data dir written before a new encoding became the
        default, so that no chat pays for that encoding (:mod:`inferscale.kv_prepare`).

        Encodes on the calling thread, in batches of ``kv.encode_batch_size`` memories, as the background encoder
        does (other calls go on meanwhile); what is stored already is only looked up. The K/V are keyed by this
        client's model, dtype, device and ``kv`` settings: prepare with the configuration the chats will run under
        (for a server's store, the server's own).

        Returns:
            A :class:`~inferscale.kv_prepare.KVPrepareReport`: memories looked at, encoded, and the ids left (too
            long for the model's context window even without their context turns, or changed meanwhile); a memory
            deleted meanwhile is in neither.

        Raises:
            ScopeError: for an id that is neither a non-empty string nor an int.
            InvalidInputError: for an id too long or not storable.
            DatabaseUnavailableError: when the database cannot be connected to.
            ModelNotAvailableError: when the configured model's files cannot be found.
            OSError: when a K/V file cannot be written (what was stored before stays stored).
        """
        ids = self.db.versions(optional_scope(user_id, agent_id, run_id)).ids  # no texts: ids, vector ids, hashes
        return prepare_kv(self.derived, ids, self.config.kv.encode_batch_size)

    def prune_kv(
        self,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
        dry_run: bool = False,
    ) -> KVPruneReport:
        """Remove the stored K/V that no :meth:`chat` of this client looks up: for every memory of the scope (every
        memory of the database when no id is given), each entry written under another model fingerprint or other
        ``kv`` settings (``kv.storage_format``, ``kv.context_window``, position buckets, an older version's
        encoding), from every tier and from ``kv_entries`` (:mod:`inferscale.kv_prune`). Such entries are otherwise
        kept, for clients still running with those settings: after switching to ``kv.storage_format="int8"``, the
        model-dtype files stay on disk until pruned. Run :meth:`prepare_kv` first to encode what the new settings
        lack, and prune with the configuration the chats run under (for a server's store, the server's own): a client
        with other settings sharing the store encodes its K/V again on first use. Encodes nothing. ``dry_run=True``
        removes nothing and reports what would be removed (it reads the same files' headers and rows).

        Returns:
            A :class:`~inferscale.kv_prune.KVPruneReport`: memories looked at, entry copies and rows removed, and
            the bytes of K/V those rows recorded (in a dry run, what would be removed; ``dry_run`` says which).

        Raises:
            ScopeError: for an id that is neither a non-empty string nor an int.
            InvalidInputError: for an id too long or not storable, or a ``dry_run`` that is not ``True`` or
                ``False``.
            DatabaseUnavailableError: when the database cannot be connected to.
            ModelNotAvailableError: when the configured model's files cannot be found.
            OSError: when a K/V file cannot be removed (what was removed before stays removed).
            KVFormatError: when the K/V folder's ``store-id`` file holds anything but an id (nothing is removed).
        """
        check_flag(dry_run, "dry_run")
        ids = self.db.versions(optional_scope(user_id, agent_id, run_id)).ids  # no texts: ids, vector ids, hashes
        return prune_kv(self.derived, ids, dry_run=dry_run)

    def wait_for_encoding(self, timeout: float | None = None) -> bool:
        """Wait until the background encoder has encoded the K/V of every memory ``add`` queued
        (``kv.encode_on_add="background"``), or found it encoded by a ``chat``, deleted, or failed on it (logged;
        it is then encoded on first use). ``chat`` does not need this: it encodes what it retrieves that is not
        encoded yet. Useful before timing ``chat``, or before another process reads the K/V store.

        Args:
            timeout: the most seconds to wait; ``None`` waits as long as it takes.

        Returns:
            ``True`` when nothing is left to encode, ``False`` when ``timeout`` ran out first.

        Raises:
            InvalidInputError: when ``timeout`` is not ``None`` or a finite number >= 0.
        """
        return self.derived.wait_for_encoding(check_timeout(timeout))

    def close(self, *, encoding_timeout: float | None = None) -> None:
        """Wait for the background K/V encoder to finish what ``add`` queued (:meth:`wait_for_encoding`), write
        the index file if it changed, and release what this client opened or built: the database connections, an
        HTTP LLM client, and the engine when the client built it (an engine passed in is left to its owner). The
        client reopens what it needs if it is used again, but the background encoder stays closed: the K/V of
        memories written from then on (or by an ``add`` still running when ``close`` began) are encoded by the
        first ``chat`` that retrieves them, as in ``"lazy"`` mode, so no background thread reopens what ``close``
        released. A non-streamed chat running meanwhile on another thread raises ``EngineClosedError`` within a
        token, as a stream being read does.

        Args:
            encoding_timeout: the most seconds to wait for the background encoder (``None``, the default: until
                every queued memory is encoded, however long). Once spent, the encoder starts no further chunk:
                the chunk running (at most ``kv.encode_chunk_size`` facts) finishes and is stored, and the
                memories not encoded yet are logged at WARNING with their count. Nothing is lost: they are stored,
                and the first ``chat`` that retrieves one encodes it (or :meth:`prepare_kv`,
                ``inferscale prepare-kv``). ``0`` stops the encoder at once. The server passes what is left of its
                shutdown grace.

        Raises:
            InvalidInputError: when ``encoding_timeout`` is not ``None`` or a finite number >= 0 (checked before
                anything is closed).
        """
        limit = check_timeout(encoding_timeout, "encoding_timeout")
        self._closing.set()
        try:
            self.derived.close_encoding(limit)
            with self._lock:
                self._release()
                if self._db is not None:
                    self._db.close()
        finally:
            self._closing = threading.Event()  # for the chats that begin from now on

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


Memory = MemoryClient
