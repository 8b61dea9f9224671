"""``chat`` over the wire, without I/O: the OpenAI-shaped request, and the :class:`ChatResult` or :class:`ChatChunk`
values rebuilt from the server's reply or stream.

The request is ``POST /v1/chat/completions`` with OpenAI's ``messages``, ``stream``, ``max_tokens`` and sampling
fields, and an ``inferscale`` object with what OpenAI has no field for (the scope, ``filters``, ``limit``,
``memory_ids``, ``search_query``, ``mode``). The reply's ``inferscale`` object is :meth:`ChatResult.to_dict` without
the answer, which is the message's content (or, streamed, the content deltas joined).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from inferscale.arguments import check_max_new_tokens, check_query
from inferscale.chat_request import chat_conversation
from inferscale.errors import InvalidInputError, ServerError
from inferscale.json_text import loads_json
from inferscale.remote.calls import ApiCall, check_sendable, encode_json
from inferscale.remote.errors import decoded_error
from inferscale.scope import check_scope_ids
from inferscale.types import ChatChunk, ChatResult

CHAT_PATH = "/v1/chat/completions"

_RESULT = TypeAdapter(ChatResult)


def chat_call(
    query: Any,
    *,
    messages: Any,
    user_id: Any,
    agent_id: Any,
    run_id: Any,
    filters: Any,
    limit: Any,
    memory_ids: Any,
    search_query: Any,
    mode: Any,
    stream: Any,
    max_new_tokens: Any,
    temperature: Any,
    top_p: Any,
    top_k: Any,
    seed: Any,
    repetition_penalty: Any,
    stop: Any,
) -> ApiCall[ChatResult]:
    """The chat request (never retried once sent: it generates). A query is sent as one user message; ``top_k`` is
    the sampler's (vLLM's extension of OpenAI's body), ``max_new_tokens`` is OpenAI's ``max_tokens``.

    Raises:
        InvalidInputError: when both or neither of ``query`` and ``messages`` are given (the request has one
            conversation), for a query, ``search_query`` or messages the local client refuses (content parts, a role
            other than system, user and assistant: the server reads OpenAI's wider shapes), ``mode`` is not ``"kv"``
            or ``"prompt"`` (a ``None`` would be left out, and the server would serve ``"kv"``), ``stream`` is not a
            bool (it decides what this call returns), or ``top_k`` is 0 or -1
            (on the OpenAI wire they mean "every token", which the local client refuses: they cannot be sent with
            the local meaning), and what :func:`~inferscale.scope.check_scope_ids` and
            :func:`~inferscale.remote.calls.check_sendable` refuse (a scope id that is not a storable non-empty
            string; a value with no faithful JSON form), with the local client's error naming the argument; every
            other value is the server's to judge.
        ScopeError: for a scope id that is neither a non-empty string nor an int.

    A chat that names no scope is sent, as ``search`` is: the server fills in the user of a key bound to one, and
    refuses it otherwise with the local client's :class:`~inferscale.errors.ScopeError`. The body always carries the
    ``inferscale`` object (``mode`` at least), which tells the server the chat asks for memory: only a
    plain OpenAI request (no ``user``, no ``inferscale``) is answered without memory.
    """
    # the local client's checks: the server reads OpenAI's wider shapes (content parts, the developer role), which
    # a call that works here only would make the local client refuse
    chat_conversation(query, messages, mode=mode, stream=stream)
    if search_query is not None:
        check_query(search_query, "search_query")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k in (0, -1):
        raise InvalidInputError(f"top_k must be a positive int or None, got {top_k!r}")
    check_max_new_tokens(max_new_tokens)  # under its own name: the wire's is OpenAI's max_tokens
    user_id, agent_id, run_id = check_scope_ids(user_id, agent_id, run_id)
    # checked under the arguments' own names (the wire's are OpenAI's, e.g. max_tokens, or nested in "inferscale")
    memory = check_sendable(
        {
            "user_id": user_id,
            "agent_id": agent_id,
            "run_id": run_id,
            "filters": filters,
            "limit": limit,
            "memory_ids": memory_ids,
            "search_query": search_query,
            "mode": mode,
        }
    )
    given = check_sendable(
        {
            "query": query,
            "messages": messages,
            "max_new_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "seed": seed,
            "repetition_penalty": repetition_penalty,
            "stop": stop,
        }
    )
    body = {
        "messages": [{"role": "user", "content": given["query"]}] if messages is None else given["messages"],
        "stream": stream,
        "max_tokens": given.get("max_new_tokens"),
        "temperature": given.get("temperature"),
        "top_p": given.get("top_p"),
        "top_k": given.get("top_k"),
        "seed": given.get("seed"),
        "repetition_penalty": given.get("repetition_penalty"),
        "stop": given.get("stop"),
        "inferscale": memory,
    }
    return ApiCall("POST", CHAT_PATH, chat_result, content=encode_json(body), idempotent=False)


def result_of(answer: str, report: Any) -> ChatResult:
    """The :class:`ChatResult` of ``answer`` and a reply's ``inferscale`` object (``ChatResult.to_dict()`` without
    ``answer``; timings in ms).

    Raises:
        ServerError: when the object does not hold every field with its type.
    """
    if not isinstance(report, Mapping):
        raise ServerError(f"the chat reply's 'inferscale' object is missing or not an object: {report!r}")
    try:
        return _RESULT.validate_python({**report, "answer": answer})
    except ValidationError as exc:
        raise ServerError(f"the chat reply's 'inferscale' object is malformed: {exc}") from exc


def chat_result(reply: Any) -> ChatResult:
    """The :class:`ChatResult` of a ``chat.completion`` reply.

    Raises:
        ServerError: for a reply without one choice's text content or a well-formed ``inferscale`` object.
    """
    try:
        answer = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ServerError(f"the chat reply has no choices[0].message.content: {str(reply)[:200]}") from exc
    if not isinstance(answer, str):
        raise ServerError(f"the chat reply's content is {type(answer).__name__}, not text")
    return result_of(answer, reply.get("inferscale"))


class ChunkReader:
    """Reads a chat stream's server-sent events (``data:`` payloads, in order) into :class:`ChatChunk` values.

    Every non-empty content delta is a chunk; the event carrying the ``inferscale`` object ends the answer with a
    last chunk whose ``delta`` is ``""`` and whose ``result`` is the whole :class:`ChatResult`. ``[DONE]`` ends the
    stream; an ``{"error": ...}`` event raises the error it names.
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self.result: ChatResult | None = None
        self.done = False

    def feed(self, data: str) -> list[ChatChunk]:
        """The chunks one event's ``data`` adds (often one, none for the role event and ``[DONE]``).

        Raises:
            InferScaleError: the error an ``{"error": ...}`` event names (its code's type).
            ServerError: for data that is not a JSON object, or content after the answer ended.
        """
        if data == "[DONE]":
            self.done = True
            return []
        try:
            event = loads_json(data)
        except ValueError as exc:
            raise ServerError(f"the chat stream sent an event that is not JSON: {data[:200]!r}") from exc
        if not isinstance(event, dict):
            raise ServerError(f"the chat stream sent an event that is not a JSON object: {data[:200]!r}")
        if "error" in event:
            raise decoded_error(event) or ServerError(f"the chat stream sent a malformed error event: {data[:200]!r}")
        chunks: list[ChatChunk] = []
        for choice in event.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            text = delta.get("content") if isinstance(delta, dict) else None
            if text:
                if self.result is not None:
                    raise ServerError("the chat stream sent content after its last chunk")
                self._parts.append(str(text))
                chunks.append(ChatChunk(str(text)))
        if "inferscale" in event:
            self.result = result_of("".join(self._parts), event["inferscale"])
            chunks.append(ChatChunk("", self.result))
        return chunks

    def end(self) -> None:
        """The stream closed.

        Raises:
            ServerError: when it closed before the event that carries the result.
        """
        if self.result is None:
            raise ServerError("the chat stream ended before its last chunk (the one with the 'inferscale' report)")
