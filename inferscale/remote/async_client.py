""":class:`AsyncRemoteMemoryClient`: :class:`~inferscale.async_client.AsyncMemoryClient`'s API on an InferScale
server, over httpx's async client.

Each coroutine builds its request (:mod:`inferscale.remote.calls`, :mod:`inferscale.remote.chat`), the same values
:class:`~inferscale.remote.sync_client.RemoteMemoryClient` builds, and sends it through the
:class:`~inferscale.remote.transport.AsyncTransport`; this module holds no logic of its own.

Why one file over 300 lines: one method per Mem0 call with the local client's full signature (``chat`` with its two
typed overloads), each a one-line shell.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Literal, overload

import httpx

from inferscale.arguments import check_timeout
from inferscale.conversation import ChatMessage
from inferscale.errors import budget_named
from inferscale.remote import calls
from inferscale.remote.chat import chat_call
from inferscale.remote.transport import DEFAULT_RETRIES, DEFAULT_TIMEOUT_S, AsyncTransport, Connection
from inferscale.scope import ScopeId
from inferscale.types import ChatChunk, ChatMode, ChatResult


class AsyncRemoteMemoryClient:
    """The memory API of an InferScale server (``inferscale serve``) as coroutines, with the async local client's
    methods, arguments, results and exception types. ``AsyncMemoryClient(host=..., api_key=...)`` returns one.
    Construction does no I/O: :meth:`ping` checks the server and the key. Use it on one event loop.

    Calls that may be sent twice (every read and update) are retried on connection errors and on 502/503/504
    replies that do not come from the InferScale server itself (a proxy's), with exponential backoff (awaited, so
    other tasks run meanwhile); ``add``, ``chat``, ``reset`` and the deletes are retried only when the connection
    could not be made (see :mod:`inferscale.remote.retry`).

    Args:
        host: the server's URL, e.g. ``"http://127.0.0.1:8000"`` (no default: there is no hosted service).
        api_key: the key (``isk_...``) sent as ``Authorization: Token <key>``, as Mem0's client sends it; ``None``
            reads ``INFERSCALE_API_KEY``, and no key is sent when that is unset (a server without keys).
        timeout: seconds each phase of a request may take (connect, write, each read of the reply).
        retries: attempts after the first, for the calls that are retried.
        transport: the httpx transport to send with (default httpx's; tests pass ``httpx.MockTransport``).

    Raises:
        ConfigError: for a host that is not an http(s) URL, a key that is not a string, a timeout that is not
            positive or retries below 0.

    Every call raises, besides the local client's errors: :class:`~inferscale.errors.ServerError` when the server
    cannot be reached after the retries, breaks off or answers in another shape,
    :class:`~inferscale.errors.AuthenticationError` for a missing, unknown or revoked key and
    :class:`~inferscale.errors.PermissionDeniedError` for a call the key may not make.
    """

    def __init__(
        self,
        host: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._transport = AsyncTransport(Connection.of(host, api_key, timeout, retries), transport)

    @property
    def host(self) -> str:
        """The server's URL, without a trailing slash."""
        return self._transport.connection.base_url

    async def ping(self) -> dict[str, Any]:
        """Check the server and the key.

        Returns:
            ``{"status": "ok", "admin": bool, "scopes": {"user_ids", "agent_ids", "run_ids"}}``: each scope a list of
            the ids the key may touch, or ``None`` for any.

        Raises:
            AuthenticationError: for a missing, unknown or revoked key (on a server with keys).
        """
        return await self._transport.call(calls.ping())

    async def wait_for_encoding(self, timeout: float | None = None) -> bool:
        """Wait until the server's background K/V encoder has finished what ``add`` queued; see
        :meth:`RemoteMemoryClient.wait_for_encoding <inferscale.remote.RemoteMemoryClient.wait_for_encoding>` (same
        argument, result and errors: an admin key only)."""
        for call in calls.wait_for_encoding(timeout, self._transport.connection.timeout):
            if await self._transport.call(call):
                return True
        return False

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
        """Remember a conversation; see :meth:`AsyncMemoryClient.add
        <inferscale.async_client.AsyncMemoryClient.add>` (same arguments, result and errors). Never sent twice."""
        call = calls.add(
            messages,
            user_id=user_id,
            agent_id=agent_id,
            run_id=run_id,
            metadata=metadata,
            infer=infer,
            prompt=prompt,
            encode_kv=encode_kv,
            timestamp=timestamp,
            expiration_date=expiration_date,
            output_format=output_format,
            version=version,
        )
        return await self._transport.call(call)

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
        """Change a memory's text and/or metadata; see :meth:`AsyncMemoryClient.update
        <inferscale.async_client.AsyncMemoryClient.update>`."""
        call = calls.update(
            memory_id,
            text=text,
            metadata=metadata,
            data=data,
            expiration_date=expiration_date,
            user_id=user_id,
            agent_id=agent_id,
            run_id=run_id,
        )
        return await self._transport.call(call)

    async def delete(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> dict[str, str]:
        """Delete one memory; see :meth:`AsyncMemoryClient.delete
        <inferscale.async_client.AsyncMemoryClient.delete>`."""
        return await self._transport.call(calls.delete(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id))

    async def delete_all(
        self, user_id: ScopeId | None = None, agent_id: ScopeId | None = None, run_id: ScopeId | None = None
    ) -> dict[str, Any]:
        """Delete every memory of a scope; see :meth:`AsyncMemoryClient.delete_all
        <inferscale.async_client.AsyncMemoryClient.delete_all>`."""
        return await self._transport.call(calls.delete_all(user_id=user_id, agent_id=agent_id, run_id=run_id))

    async def reset(self) -> None:
        """Delete every memory of the server's database (an admin key's call)."""
        await self._transport.call(calls.reset())

    # ------------------------------------------------------------------ read path
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
        """Memories most similar to ``query``; see :meth:`AsyncMemoryClient.search
        <inferscale.async_client.AsyncMemoryClient.search>` (v1 and v2 shapes)."""
        call = calls.search(
            query,
            user_id=user_id,
            agent_id=agent_id,
            run_id=run_id,
            filters=filters,
            limit=limit,
            top_k=top_k,
            threshold=threshold,
            version=version,
            output_format=output_format,
            rerank=rerank,
            explain=explain,
            reference_date=reference_date,
            show_expired=show_expired,
        )
        return await self._transport.call(call)

    async def get(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> dict[str, Any] | None:
        """One memory by id, or ``None``; see :meth:`AsyncMemoryClient.get
        <inferscale.async_client.AsyncMemoryClient.get>`."""
        return await self._transport.call(calls.get(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id))

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
        """The scope's memories matching ``filters``, oldest first; see :meth:`AsyncMemoryClient.get_all
        <inferscale.async_client.AsyncMemoryClient.get_all>`."""
        call = calls.get_all(
            user_id=user_id,
            agent_id=agent_id,
            run_id=run_id,
            filters=filters,
            limit=limit,
            top_k=top_k,
            version=version,
            output_format=output_format,
            show_expired=show_expired,
        )
        return await self._transport.call(call)

    async def history(
        self,
        memory_id: str,
        *,
        user_id: ScopeId | None = None,
        agent_id: ScopeId | None = None,
        run_id: ScopeId | None = None,
    ) -> list[dict[str, Any]]:
        """Every change to a memory, oldest first; see :meth:`AsyncMemoryClient.history
        <inferscale.async_client.AsyncMemoryClient.history>`."""
        return await self._transport.call(calls.history(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id))

    # ------------------------------------------------------------------ chat
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
        """Answer a question or a conversation with the scope's memories, on the server's engine; see
        :meth:`AsyncMemoryClient.chat <inferscale.async_client.AsyncMemoryClient.chat>` (same arguments, results
        and errors). Without ``limit`` the request names none and the server's ``--limit`` applies (5 unless set).

        With ``stream=True`` the awaited call returns an async iterator of the server-sent chunks: the server refuses
        bad input before the first chunk, so the error is raised by the awaited call, and the last chunk carries the
        :class:`ChatResult` (the server's timings). Closing the iterator (``await it.aclose()``) closes the
        connection. Never sent twice.
        """
        call = chat_call(
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
        with budget_named("max_new_tokens"):  # the wire's max_tokens is this method's max_new_tokens
            if stream:
                return await self._transport.stream(call)
            return await self._transport.call(call)

    async def close(self, *, encoding_timeout: float | None = None) -> None:
        """Close the connection pool; a later call opens a new one. ``encoding_timeout`` is checked as the local
        client's (:meth:`MemoryClient.close <inferscale.client.MemoryClient.close>`), so the two take the same
        arguments, and has no other effect: the background encoder is the server's, bounded by its shutdown grace.

        Raises:
            InvalidInputError: when ``encoding_timeout`` is not ``None`` or a finite number >= 0.
        """
        check_timeout(encoding_timeout, "encoding_timeout")
        await self._transport.close()

    async def __aenter__(self) -> AsyncRemoteMemoryClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
