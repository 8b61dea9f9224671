""":class:`InferScaleMemory`: Mem0Memory's shape (``from_client``, ``from_config``, ``context``,
``search_msg_limit``) over an InferScale ``MemoryClient``, whose recalled memories travel to the LLM by id."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, SerializeAsAny
from llama_index.core.memory import BaseMemory, Memory
from llama_index.memory.inferscale._messages import memory_message, search_text, turns_to_add
from llama_index.memory.inferscale._scope import InferScaleContext
from llama_index.memory.inferscale._search import async_search

from inferscale import AsyncMemoryClient, ConfigError, InvalidInputError, MemoryClient
from inferscale.arguments import MAX_LIMIT
from inferscale.kept_search import asearch_kept, search_kept
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient
from inferscale.scope import SCOPE_KEYS
from inferscale.storable import is_blank
from inferscale.write_back import astore_turns, store_turns

DEFAULT_TOKEN_LIMIT = 3000
"""Tokens of chat history :meth:`InferScaleMemory.get` returns at most (the recalled memories come on top)."""

SyncClient = MemoryClient | RemoteMemoryClient
"""A client answering sync calls: a local one, or a server's (``MemoryClient(host=...)``)."""
AsyncClient = AsyncMemoryClient | AsyncRemoteMemoryClient
"""A client answering async calls: a local one on the same store, or a server's."""


class InferScaleMemory(BaseMemory):
    """Chat memory for LlamaIndex chat engines and agents: a chat history (``primary_memory``, a LlamaIndex
    :class:`~llama_index.core.memory.Memory`) plus the scope's long-term memories in an InferScale ``MemoryClient``.

    Built like ``Mem0Memory`` (:meth:`from_client`, :meth:`from_config`), so a Mem0Memory program changes one import.
    :meth:`get` returns ``[memory message, *window]``: a system message holding the memories recalled for the last
    ``search_msg_limit`` messages, tagged with their ids in ``additional_kwargs["inferscale_memory_ids"]``, then the
    newest history that fits ``token_limit``; with no memory recalled there is no memory message (some chat APIs
    refuse an empty system message). :class:`~llama_index.memory.inferscale.InferScaleLLM` drops the tagged text
    and injects those ids as K/V (build it with ``auto_retrieve=False`` so that it injects none on a turn without
    a memory message, as :func:`~llama_index.memory.inferscale.simple_chat_engine` does); any other LLM reads the
    text. :meth:`put` and :meth:`set` store new user and assistant messages with ``client.add(infer=...)``; a
    message ``add`` refuses for what it holds (with ``infer=False``, one longer than ``max_memory_chars`` or than the
    model's context) joins the history but is not stored as a memory, with a warning logged that names the reason,
    so a chat engine's turn goes on.

    Memories stored from messages still in the window, and memories whose text is a message of the window, are not
    recalled again (their text is already there).
    :meth:`aget` and :meth:`aput` use ``async_client`` (an ``AsyncMemoryClient`` on the same store) when given, else
    run the sync client on a thread.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    primary_memory: SerializeAsAny[Memory] = Field(description="The chat history (a LlamaIndex Memory).")
    context: InferScaleContext = Field(description="Whose memories: user_id, agent_id and/or run_id.")
    search_msg_limit: int = Field(default=5, ge=0, description="Recent messages the memory search uses.")
    similarity_top_k: int = Field(default=5, ge=0, description="Memories recalled per get().")
    token_limit: int = Field(default=DEFAULT_TOKEN_LIMIT, ge=1, description="Tokens of chat history get() returns.")
    infer: bool = Field(default=False, description="add(infer=...): extract facts (True) or store messages as is.")

    _client: SyncClient = PrivateAttr()
    _async_client: AsyncClient | None = PrivateAttr(default=None)
    _added: list[list[str]] = PrivateAttr(default_factory=list)  # memory ids stored per history message, in order

    def __init__(self, client: SyncClient, *, async_client: AsyncClient | None = None, **data: Any) -> None:
        super().__init__(**data)
        self._client = client
        self._async_client = async_client

    @classmethod
    def class_name(cls) -> str:
        return "InferScaleMemory"

    # ------------------------------------------------------------------ construction (Mem0Memory's names)
    @classmethod
    def from_defaults(cls, **kwargs: Any) -> InferScaleMemory:
        """Not used: a memory needs a scope and a client. Use :meth:`from_client` or :meth:`from_config`."""
        raise NotImplementedError("use InferScaleMemory.from_client(context=...) or from_config(context=, config=)")

    @classmethod
    def from_client(
        cls,
        context: Mapping[str, Any],
        api_key: str | None = None,
        host: str | None = None,
        org_id: str | None = None,
        project_id: str | None = None,
        search_msg_limit: int = 5,
        *,
        client: SyncClient | None = None,
        token_limit: int = DEFAULT_TOKEN_LIMIT,
        similarity_top_k: int = 5,
        infer: bool = False,
        tokenizer_fn: Callable[[str], list[Any]] | None = None,
        chat_history: Sequence[ChatMessage] | None = None,
        async_client: AsyncClient | None = None,
    ) -> InferScaleMemory:
        """A memory over ``client``; when ``None``, over the InferScale server at ``host`` (with ``api_key``), else
        over a ``MemoryClient`` on the embedded defaults.

        ``api_key``, ``host``, ``org_id`` and ``project_id`` are Mem0's hosted-platform arguments, in its order, so
        that a ``Mem0Memory.from_client`` call works unchanged. ``host`` names an InferScale server
        (``inferscale serve``): the memory calls it with ``MemoryClient(host=host, api_key=api_key)`` and, for
        :meth:`aget`/:meth:`aput`, ``AsyncMemoryClient(host=host, api_key=api_key)``.
        ``api_key`` without ``host``, ``org_id`` and ``project_id`` have no InferScale meaning and are ignored with a
        warning.

        Args:
            context: the scope, ``{"user_id": ..., "agent_id": ..., "run_id": ...}`` (at least one).
            api_key: the server's API key (``isk_...``); ``None`` reads ``$INFERSCALE_API_KEY``. Used with ``host``.
            host: the InferScale server's URL, e.g. ``"http://127.0.0.1:8000"``.
            search_msg_limit: how many recent messages the memory search uses.
            client: the InferScale client (local, or a server's); not together with ``host``.
            token_limit: tokens of chat history :meth:`get` returns at most (counted with ``tokenizer_fn``).
            similarity_top_k: memories recalled per :meth:`get`.
            infer: ``client.add(infer=...)`` for new messages.
            tokenizer_fn: counts tokens (LlamaIndex's default tokenizer when ``None``).
            chat_history: messages the history starts with (not stored as memories).
            async_client: an ``AsyncMemoryClient`` on the same store, for :meth:`aget`/:meth:`aput` (else the
                sync client runs on a thread).

        Raises:
            ScopeError: when the context sets no id. InvalidInputError: for an unknown context key. ConfigError: for
                ``host`` together with ``client`` or ``async_client`` (two clients might name two stores), a
                ``host`` that is not an http(s) URL, or a bad ``api_key``.
        """
        ignored = [name for name, value in (("org_id", org_id), ("project_id", project_id)) if value]
        if host and (client is not None or async_client is not None):
            raise ConfigError("pass the server as host= or clients as client=/async_client=, not both")
        if host:
            client = MemoryClient(host=host, api_key=api_key)
            async_client = AsyncMemoryClient(host=host, api_key=api_key)
        elif api_key:
            ignored.insert(0, "api_key")
        if ignored:
            warnings.warn(
                f"{', '.join(ignored)} name Mem0's hosted platform and are ignored: InferScale runs in-process, or on "
                "your server through host= (with api_key=)",
                UserWarning,
                stacklevel=2,
            )
        return cls._build(
            client or MemoryClient(),
            context,
            search_msg_limit,
            token_limit=token_limit,
            similarity_top_k=similarity_top_k,
            infer=infer,
            tokenizer_fn=tokenizer_fn,
            chat_history=chat_history,
            async_client=async_client,
        )

    @classmethod
    def from_config(
        cls,
        context: Mapping[str, Any],
        config: Mapping[str, Any],
        search_msg_limit: int = 5,
        *,
        token_limit: int = DEFAULT_TOKEN_LIMIT,
        similarity_top_k: int = 5,
        infer: bool = False,
        tokenizer_fn: Callable[[str], list[Any]] | None = None,
        chat_history: Sequence[ChatMessage] | None = None,
    ) -> InferScaleMemory:
        """A memory over ``MemoryClient.from_config(config)``: InferScale's config fields or Mem0's config dict.

        Raises:
            ConfigError: for a config that does not validate. ScopeError, InvalidInputError: as :meth:`from_client`.
        """
        return cls._build(
            MemoryClient.from_config(config),
            context,
            search_msg_limit,
            token_limit=token_limit,
            similarity_top_k=similarity_top_k,
            infer=infer,
            tokenizer_fn=tokenizer_fn,
            chat_history=chat_history,
        )

    @classmethod
    def _build(
        cls,
        client: SyncClient,
        context: Mapping[str, Any],
        search_msg_limit: int,
        *,
        token_limit: int,
        similarity_top_k: int,
        infer: bool,
        tokenizer_fn: Callable[[str], list[Any]] | None,
        chat_history: Sequence[ChatMessage] | None,
        async_client: AsyncClient | None = None,
    ) -> InferScaleMemory:
        scope = InferScaleContext.of(context)
        primary = Memory.from_defaults(
            token_limit=token_limit,
            tokenizer_fn=tokenizer_fn,
            chat_history=list(chat_history) if chat_history else None,
        )
        memory = cls(
            client,
            async_client=async_client,
            primary_memory=primary,
            context=scope,
            search_msg_limit=search_msg_limit,
            similarity_top_k=similarity_top_k,
            token_limit=token_limit,
            infer=infer,
        )
        memory._added = [[] for _ in chat_history or ()]
        return memory

    # ------------------------------------------------------------------ accessors
    @property
    def client(self) -> SyncClient:
        """The InferScale client (local, or a server's)."""
        return self._client

    @property
    def tokenizer_fn(self) -> Callable[[str], list[Any]]:
        """The token counter of the history window; ``SimpleChatEngine`` counts its prefix messages with it and
        passes that count to :meth:`get` as ``initial_token_count``."""
        return self.primary_memory.tokenizer_fn

    def add(self, messages: str | Sequence[Mapping[str, Any]], **kwargs: Any) -> dict[str, Any] | None:
        """``client.add(messages, **kwargs)`` in this memory's ``context`` (Mem0Memory's pass-through); ``None``
        for no messages.

        Raises:
            InvalidInputError: for a ``user_id``/``agent_id``/``run_id`` other than the context's.
        """
        if not messages:
            return None
        return self._client.add(messages, **self._in_context(kwargs))

    def search(self, query: str, **kwargs: Any) -> dict[str, Any]:
        """``client.search(query, **kwargs)`` in this memory's ``context`` (Mem0Memory's pass-through).

        Raises:
            InvalidInputError: for a ``user_id``/``agent_id``/``run_id`` other than the context's.
        """
        return self._client.search(query, **self._in_context(kwargs))

    def _in_context(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """``kwargs`` with the context's scope ids; a scope id the context does not hold is refused."""
        own = self.context.ids()
        for key in SCOPE_KEYS:
            if kwargs.get(key) is not None and kwargs[key] != own.get(key):
                raise InvalidInputError(
                    f"{key}={kwargs[key]!r} is outside this memory's context {own}; pass no scope ids (the "
                    "context's are used) or use a memory built for that scope"
                )
        return {**kwargs, **own}

    # ------------------------------------------------------------------ BaseMemory
    def get(self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any) -> list[ChatMessage]:
        """The memory message (none when no memory is recalled), then the newest chat history that fits
        ``token_limit - initial_token_count`` tokens.

        The window always holds the last user message and what follows it (the turn being answered), even past the
        limit; older messages join while they fit, and a window never opens with an assistant reply to a question
        it left out. Other system messages of the history count like any message (pass a long system prompt as the
        chat engine's ``system_prompt``). Never raises for a full history.

        Args:
            input: text about to be sent, added to the memory search (Mem0Memory's ``input``).
            initial_token_count: tokens the caller puts before the history (``SimpleChatEngine``'s prefix).
            kwargs: passed to ``primary_memory.get`` (its memory blocks' arguments).
        """
        history = self.primary_memory.get(input=input, **kwargs)
        window = self._window(history, self.token_limit - initial_token_count)
        exclude = self._ids_in_window(len(window))
        query = self._query(history, input)
        hits: list[Mapping[str, Any]] = []
        if query:
            scope = self.context.ids()

            def search(k: int) -> list[Mapping[str, Any]]:
                return list(self._client.search(query, **scope, limit=k)["results"])

            keep, extra = self._new_to(exclude, window), self._extra(exclude, window)
            hits = search_kept(search, keep, self.similarity_top_k, extra=extra, most=MAX_LIMIT)
        return self._with_memories(hits, window)

    async def aget(self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any) -> list[ChatMessage]:
        """:meth:`get` on the event loop: the history from ``primary_memory.aget``, the search on ``async_client``
        (or the sync client on a thread)."""
        history = await self.primary_memory.aget(input=input, **kwargs)
        window = self._window(history, self.token_limit - initial_token_count)
        exclude = self._ids_in_window(len(window))
        query = self._query(history, input)
        hits: list[Mapping[str, Any]] = []
        if query:
            search = async_search(self._client, self._async_client, query, self.context.ids())
            keep, extra = self._new_to(exclude, window), self._extra(exclude, window)
            hits = await asearch_kept(search, keep, self.similarity_top_k, extra=extra, most=MAX_LIMIT)
        return self._with_memories(hits, window)

    def get_all(self) -> list[ChatMessage]:
        """The whole chat history (no memory message)."""
        return self.primary_memory.get_all()

    def put(self, message: ChatMessage) -> None:
        """Store a user or assistant message as memory (``client.add``), and append it to the history."""
        ids = self._add([message])
        self.primary_memory.put(message)
        self._added.append(ids)

    async def aput(self, message: ChatMessage) -> None:
        """:meth:`put` on the event loop (``async_client.add``, or ``client.add`` on a thread)."""
        turns = turns_to_add([message])
        ids: list[str] = []
        if turns and self._async_client is not None:
            client, scope = self._async_client, self.context.ids()
            stored = await astore_turns(lambda t: client.add(t, **scope, infer=self.infer), turns)
            ids = _stored_ids(stored)
        elif turns:
            ids = await asyncio.to_thread(self._add, [message])
        await self.primary_memory.aput(message)
        self._added.append(ids)

    def set(self, messages: list[ChatMessage]) -> None:
        """Replace the history with ``messages``; the ones past the current history's length are new and stored as
        memories (Mem0Memory's rule)."""
        known = len(self.primary_memory.get_all())
        added = [self._add([m]) for m in messages[known:]]
        self.primary_memory.set(messages)
        self._added = [[] for _ in messages[: min(known, len(messages))]] + added

    def reset(self) -> None:
        """Clear the chat history; the long-term memories stay."""
        self.primary_memory.reset()
        self._added = []

    # ------------------------------------------------------------------ helpers
    def _add(self, messages: Sequence[ChatMessage]) -> list[str]:
        """Store ``messages``' user/assistant turns; the ids of the memories added or updated."""
        turns = turns_to_add(messages)
        if not turns:
            return []
        scope = self.context.ids()
        return _stored_ids(store_turns(lambda t: self._client.add(t, **scope, infer=self.infer), turns))

    def _ids_in_window(self, n_messages: int) -> AbstractSet[str]:
        """Ids stored from the newest ``n_messages`` history messages."""
        return {i for ids in self._added[len(self._added) - n_messages :] for i in ids} if n_messages else set()

    def _query(self, history: Sequence[ChatMessage], input: str | None) -> str | None:
        """What :meth:`get` searches with (the recent messages and ``input``), or ``None`` for no search."""
        query = search_text(history, self.search_msg_limit, input)
        return query if not is_blank(query) and self.similarity_top_k > 0 else None

    @staticmethod
    def _extra(exclude: AbstractSet[str], window: Sequence[ChatMessage]) -> int:
        """Hits to ask for on top of ``similarity_top_k`` at first: one per memory or message that may be left out
        (the search widens while more are, :func:`~inferscale.kept_search.search_kept`)."""
        return len(exclude) + len(window)

    @staticmethod
    def _new_to(exclude: AbstractSet[str], window: Sequence[ChatMessage]) -> Callable[[Mapping[str, Any]], bool]:
        """Whether a search hit is new to the model: not stored from a message of ``window`` (its id in ``exclude``)
        and not the text of one."""
        shown = {text for m in window if (text := (m.content or "").strip())}
        return lambda hit: hit["id"] not in exclude and hit["memory"].strip() not in shown

    @staticmethod
    def _with_memories(hits: Sequence[Mapping[str, Any]], window: list[ChatMessage]) -> list[ChatMessage]:
        """``window`` after the memory message of ``hits``; ``window`` alone when there is none."""
        return [memory_message(hits), *window] if hits else window

    def _window(self, history: Sequence[ChatMessage], budget: int) -> list[ChatMessage]:
        """The newest messages of ``history`` within ``budget`` tokens (see :meth:`get`)."""
        last_user = next((i for i in range(len(history) - 1, -1, -1) if history[i].role == MessageRole.USER), None)
        start = len(history) - 1 if last_user is None else last_user
        if start < 0:
            return []
        used = sum(self._tokens(m) for m in history[start:])
        while start > 0 and used + self._tokens(history[start - 1]) <= budget:
            start -= 1
            used += self._tokens(history[start])
        while start < len(history) - 1 and history[start].role == MessageRole.ASSISTANT:
            start += 1
        return list(history[start:])

    def _tokens(self, message: ChatMessage) -> int:
        return len(self.tokenizer_fn(message.content or ""))


def _stored_ids(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ids of the memories ``add`` results say were added or updated."""
    return [r["id"] for result in results for r in result["results"] if r.get("event") in ("ADD", "UPDATE")]
