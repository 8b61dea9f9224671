"""One ``chat`` call's arguments, checked and resolved the same way for the sync and async clients.

Everything is validated here, before anything is retrieved or generated: the query or messages, the scope, how the
memories are chosen (retrieval with ``search_query`` or explicit ``memory_ids``), the mode, the token budget and the
sampling settings. Every problem raises :class:`~inferscale.errors.InvalidInputError` (or
:class:`~inferscale.errors.ScopeError`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale.arguments import (
    DEFAULT_CHAT_LIMIT,
    MAX_LIMIT,
    check_chat_mode,
    check_chat_query,
    check_max_new_tokens,
    check_query,
    check_query_or_messages,
    resolve_limit,
    resolve_scope,
)
from inferscale.conversation import ChatMessage, SamplingSettings, check_messages, last_user_text
from inferscale.errors import InvalidInputError
from inferscale.filters import WILDCARD, Filter
from inferscale.kept_search import asearch_kept, search_kept
from inferscale.scope import SCOPE_KEYS, Scope, ScopeId
from inferscale.storable import is_blank
from inferscale.storage import MemoryRecord
from inferscale.types import ChatMode


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A checked ``chat`` call.

    Attributes:
        conversation: the caller's turns (a query is one user turn).
        scope: whose memories are used.
        memory_ids: the memories to inject, in this order, with no retrieval; ``None`` retrieves.
        search_query: what retrieval embeds (the last user message unless the caller named one).
        node: the Mem0 filter retrieval applies (``None``: the whole scope).
        limit: memories retrieved at most.
        mode: ``"kv"`` or ``"prompt"``.
        max_new_tokens: the answer budget (tokens); ``None`` uses the engine config's.
        sampling: temperature, top-p, top-k, seed, repetition penalty, stop strings.
        stream: whether the caller asked for an iterator of chunks.
    """

    conversation: tuple[ChatMessage, ...]
    scope: Scope
    memory_ids: tuple[str, ...] | None
    search_query: str
    node: Filter | None
    limit: int
    mode: ChatMode
    max_new_tokens: int | None
    sampling: SamplingSettings
    stream: bool


@dataclass(frozen=True, slots=True)
class SentTexts:
    """The texts a conversation already puts in the prompt: its user and assistant messages, stripped. A retrieved
    memory whose text is one of them (a question stored by an earlier session's write-back, say) would repeat it
    and take the place of a memory the prompt lacks: a chat leaves it out and the next memory takes its place
    (:meth:`retrieve_unsent`). The framework packages leave the same memories out of what they recall.

    Attributes:
        texts: the stripped, non-empty contents of the user and assistant messages.
    """

    texts: frozenset[str]

    @classmethod
    def of(cls, conversation: Sequence[ChatMessage]) -> SentTexts:
        """The texts of ``conversation``'s user and assistant messages."""
        sent = (m.content.strip() for m in conversation if m.role in ("user", "assistant"))
        return cls(frozenset(text for text in sent if text))

    def repeats(self, text: str) -> bool:
        """Whether ``text``, stripped, is one of :attr:`texts`."""
        return text.strip() in self.texts

    def retrieve_unsent(
        self, search: Callable[[int], Sequence[MemoryRecord]], limit: int, most: int | None = None
    ) -> list[MemoryRecord]:
        """The best ``limit`` memories ``search(k)`` (the best ``k`` of the scope, best first) finds that repeat no
        sent text, searching wider while fewer remain (:func:`~inferscale.kept_search.search_kept`: ``limit`` plus
        one per text, at most ``2 * limit``, at first), up to ``most`` when given.

        Raises:
            Whatever ``search`` raises.
        """
        return search_kept(search, self._unsent, limit, extra=min(len(self.texts), limit), most=most)

    async def aretrieve_unsent(
        self, search: Callable[[int], Awaitable[Sequence[MemoryRecord]]], limit: int, most: int | None = None
    ) -> list[MemoryRecord]:
        """:meth:`retrieve_unsent` with an async ``search``; same result and errors."""
        return await asearch_kept(search, self._unsent, limit, extra=min(len(self.texts), limit), most=most)

    def _unsent(self, memory: MemoryRecord) -> bool:
        return not self.repeats(memory.text)


def _memory_ids(memory_ids: Any) -> tuple[str, ...]:
    if isinstance(memory_ids, (str, bytes)) or not isinstance(memory_ids, Sequence):
        raise InvalidInputError(f"memory_ids must be a list of memory id strings, got {type(memory_ids).__name__}")
    ids = tuple(memory_ids)
    if not all(isinstance(i, str) and not is_blank(i) for i in ids):
        raise InvalidInputError("memory_ids must hold non-empty strings")
    if len(set(ids)) != len(ids):
        raise InvalidInputError("memory_ids names a memory twice; each memory is injected once")
    if len(ids) > MAX_LIMIT:
        raise InvalidInputError(f"memory_ids holds {len(ids):,} ids; at most {MAX_LIMIT:,}")
    return ids


def chat_conversation(query: Any, messages: Any, *, mode: Any, stream: Any) -> tuple[ChatMessage, ...]:
    """The conversation of a ``chat`` call, checked first, as every client kind checks it (the remote clients before
    sending: the server reads OpenAI's wider shapes, content parts and the developer role among them): a query is
    one user message.

    Raises:
        InvalidInputError: when neither or both of ``query`` and ``messages`` are given, for a query that is not a
            non-empty string, bad messages (:func:`~inferscale.conversation.check_messages`), a mode other than
            ``"kv"`` or ``"prompt"``, or a ``stream`` that is not a bool.
    """
    check_query_or_messages(query, messages)
    check_chat_mode(mode)
    if not isinstance(stream, bool):
        raise InvalidInputError(f"stream must be True or False, got {stream!r}")
    return (ChatMessage("user", check_chat_query(query)),) if messages is None else check_messages(messages)


def resolve_chat(
    query: str | None,
    *,
    messages: Sequence[ChatMessage | Mapping[str, Any]] | None,
    user_id: ScopeId | None,
    agent_id: ScopeId | None,
    run_id: ScopeId | None,
    filters: Mapping[str, Any] | None,
    limit: int | None,
    memory_ids: Sequence[str] | None,
    search_query: str | None,
    mode: Any,
    stream: Any,
    max_new_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    repetition_penalty: float | None,
    stop: str | Sequence[str] | None,
) -> ChatRequest:
    """Check a ``chat`` call's arguments (see :meth:`inferscale.MemoryClient.chat`).

    Raises:
        ScopeError: when no scope id is given.
        InvalidInputError: when neither or both of ``query`` and ``messages`` are given, for bad messages (empty,
            an unknown role, no user message, ending with an assistant turn), ``memory_ids`` together with
            ``limit``, ``search_query`` or ``filters`` that do more than name the scope (an operator, a wildcard
            ``"*"``, a metadata key), a bad mode, budget, ``stream`` flag or sampling value.
    """
    conversation = chat_conversation(query, messages, mode=mode, stream=stream)
    scope, node = resolve_scope(user_id, agent_id, run_id, filters)
    ids: tuple[str, ...] | None = None
    if memory_ids is not None:
        # filters that only name the scope (Mem0 v2's way to pass user_id) choose nothing, so they may stay; a
        # wildcard ("agent_id": "*": the id is set) chooses memories, which memory_ids would silently ignore
        scope_only = isinstance(filters, Mapping) and all(
            k in SCOPE_KEYS
            and (v != WILDCARD if isinstance(v, str) else isinstance(v, int) and not isinstance(v, bool))
            for k, v in filters.items()
        )
        given = (("limit", limit), ("filters", None if scope_only else filters), ("search_query", search_query))
        clash = [name for name, value in given if value is not None]
        if clash:
            raise InvalidInputError(
                f"memory_ids chooses the memories, so {', '.join(clash)} would be ignored; pass one or the other "
                "(filters may still name the scope: {'user_id': ...})"
            )
        ids = _memory_ids(memory_ids)
    retrieve_with = last_user_text(conversation) if search_query is None else check_query(search_query, "search_query")
    return ChatRequest(
        conversation=conversation,
        scope=scope,
        memory_ids=ids,
        search_query=retrieve_with,
        node=node,
        limit=resolve_limit(limit, None, DEFAULT_CHAT_LIMIT),
        mode=mode,
        max_new_tokens=check_max_new_tokens(max_new_tokens),
        sampling=SamplingSettings.of(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            repetition_penalty=repetition_penalty,
            stop=stop,
        ),
        stream=stream,
    )
