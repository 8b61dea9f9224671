"""OpenAI chat-completions pieces shared by both servers (``--engine transformers`` and ``--engine vllm``): which
request fields a memory chat honours, the request's messages as checked :class:`ChatMessage` values, its token
budget and sampler ``top_k``, and the ``chat.completion`` / ``chat.completion.chunk`` shapes sent back (streams as
server-sent events). Pure functions: no I/O, no framework.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferscale.arguments import check_max_new_tokens
from inferscale.conversation import ChatMessage, check_messages
from inferscale.errors import InvalidInputError
from inferscale.validation_text import shown_input

SUPPORTED_FIELDS = frozenset(
    {
        "model", "messages", "user", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens",
        "temperature", "top_p", "top_k", "seed", "repetition_penalty", "stop",
    }
)  # fmt: skip
"""The OpenAI chat fields a memory request honours; any other field given a value is refused, not ignored."""

DEFAULT_MEANING_VALUES: dict[str, tuple[Any, ...]] = {
    "response_format": ({"type": "text"},),
    "service_tier": ("auto", "default"),
    "modalities": (["text"],),
}
"""Values of fields a memory request does not honour that ask for what it does anyway: a plain text answer, on the
one tier there is. OpenAI accepts each as its default, and SDK wrappers send them so (a new user's find: they were
refused)."""

SSE_DONE = b"data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""


def check_supported_fields(body: Mapping[str, Any]) -> None:
    """Refuse a memory request that sets a field it would otherwise silently ignore (tools, ``response_format``,
    ``logprobs``, presence/frequency penalties, ``logit_bias``, ``n`` above 1, ...). A field sent with its neutral
    value (``null``, ``false``, ``0``, empty), or a value that asks for what the request does anyway
    (:data:`DEFAULT_MEANING_VALUES`), is accepted.

    Raises:
        InvalidInputError: naming every unsupported field that was set, or for ``stream_options`` that are not an
            object of OpenAI's flags (:data:`STREAM_OPTIONS`, each ``true``, ``false`` or ``null``).
    """
    _check_stream_options(body.get("stream_options"))
    unsupported = sorted(
        k
        for k, v in body.items()
        if k not in SUPPORTED_FIELDS
        and v not in (None, False, 0, [], {})
        and v not in DEFAULT_MEANING_VALUES.get(k, ())
    )
    if body.get("n") not in (None, 1):
        unsupported.append(f"n={body['n']!r} (one answer per request: n may be 1 or left out)")
    if unsupported:
        supported = sorted(SUPPORTED_FIELDS - {"n"})
        raise InvalidInputError(
            f"unsupported field(s) for a memory chat: {', '.join(unsupported)}; supported: {', '.join(supported)}, "
            "and n=1"
        )


STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})
"""OpenAI's ``stream_options`` flags: ``include_usage`` asks for the usage chunk; ``include_obfuscation`` changes
nothing here (no padding is sent)."""


def _check_stream_options(options: Any) -> None:
    """Refuse ``stream_options`` a stream would not honour: a non-boolean ``include_usage`` sent no usage chunk, and
    said nothing (a helper's find).

    Raises:
        InvalidInputError: for a value that is neither ``null`` nor an object, a key not in :data:`STREAM_OPTIONS`,
            or a flag that is neither a boolean nor ``null``.
    """
    if options is None:
        return
    if not isinstance(options, Mapping):
        raise InvalidInputError(f"stream_options must be an object, got {shown_input(options)}")
    unknown = sorted(set(options) - STREAM_OPTIONS)
    if unknown:
        raise InvalidInputError(f"stream_options has unsupported keys {unknown}; supported: {sorted(STREAM_OPTIONS)}")
    for key, value in options.items():
        if value is not None and not isinstance(value, bool):
            raise InvalidInputError(f"stream_options.{key} must be true or false, got {shown_input(value)}")


def text_content(content: Any) -> Any:
    """OpenAI content parts (``[{"type": "text", "text": ...}]``) joined into one string; other values as given
    (:func:`check_messages` judges them).

    Raises:
        InvalidInputError: for a part that is not text (images, audio).
    """
    if not isinstance(content, list):
        return content
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type", "text") != "text" or not isinstance(part.get("text"), str):
            raise InvalidInputError(f"content part {i} is not a text part; only text content is supported")
        texts.append(part["text"])
    return "".join(texts)


def _translated(message: Any) -> Any:
    """One OpenAI message with its content parts joined; other values as given (:func:`check_messages` judges them,
    and reads its role's aliases)."""
    if not isinstance(message, dict):
        return message
    return {**message, "content": text_content(message.get("content"))}


def chat_messages(messages: Any) -> tuple[ChatMessage, ...]:
    """An OpenAI request's ``messages`` as checked :class:`ChatMessage` values; a ``developer`` message is a system
    message (:data:`inferscale.conversation.ROLE_ALIASES`, read by :func:`check_messages`).

    Raises:
        InvalidInputError: for a missing or empty list, an unknown role, non-text content, no user message, a
            conversation that ends with an assistant turn (see :func:`check_messages`).
    """
    if not isinstance(messages, list):
        raise InvalidInputError("'messages' must be a list of {'role', 'content'} objects")
    return check_messages([_translated(m) for m in messages])


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    """The answer budget a request asks for (tokens): ``max_completion_tokens``, else ``max_tokens``, else ``None``.

    Raises:
        InvalidInputError: when the field given is not a positive int, naming that field.
    """
    name = budget_field(body)
    return check_max_new_tokens(body.get(name), name)


def budget_field(body: Mapping[str, Any]) -> str:
    """The request's name for its answer budget, which an error advises lowering: ``max_completion_tokens`` when
    given, else ``max_tokens``."""
    return "max_tokens" if body.get("max_completion_tokens") is None else "max_completion_tokens"


def sampler_top_k(value: Any) -> Any:
    """OpenAI-compatible servers' ``top_k`` (vLLM's extension) as InferScale's: 0 and -1 mean all tokens
    (``None``); other values as given."""
    return None if value in (0, -1) and not isinstance(value, bool) else value


def sse(data: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data)}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Completion:
    """The identity shared by a reply's ``chat.completion`` or all of its chunks.

    Attributes:
        id: ``"chatcmpl-<hex>"``.
        created: Unix time (seconds).
        model: the model name the reply reports.
    """

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, model: str) -> Completion:
        """A fresh id, created now."""
        return cls(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model)

    def message(self, content: str, finish_reason: Any, **extra: Any) -> dict[str, Any]:
        """The ``chat.completion`` object with one assistant ``choice``, plus ``extra`` top-level fields (``usage``,
        ``inferscale``)."""
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}
            ],
            **extra,
        }

    def chunk(self, delta: Mapping[str, Any], finish_reason: Any = None, **extra: Any) -> bytes:
        """One ``chat.completion.chunk`` event with ``delta`` in its one choice, plus ``extra`` top-level fields."""
        choice = {"index": 0, "delta": dict(delta), "finish_reason": finish_reason}
        return sse(self._head("chat.completion.chunk") | {"choices": [choice], **extra})

    def usage_chunk(self, usage: Any) -> bytes:
        """The chunk with no choices and the ``usage`` (sent when ``stream_options.include_usage`` is true)."""
        return sse(self._head("chat.completion.chunk") | {"choices": [], "usage": usage})

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def include_usage(body: Mapping[str, Any]) -> bool:
    """Whether a streamed request asked for the usage chunk (``stream_options.include_usage``)."""
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True
