"""The request bodies of the server's routes (pydantic models, which FastAPI also publishes in the OpenAPI schema).

They give each field its JSON shape and pass its value through unchanged: the memory client validates values and
raises its typed errors, exactly as in process, so nothing is re-checked here. Validation is strict (no coercion:
``"5"`` is not a number, as in the client), and unknown fields are refused with 400 ``invalid_input`` so that a
misspelt field is not silently ignored. The one exception is the OpenAI chat body, which keeps unknown fields for
:func:`inferscale.server.openai_chat.check_supported_fields` to judge (a field sent with its neutral value is
accepted, as OpenAI-compatible servers do).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Messages = str | dict[str, Any] | list[dict[str, Any]]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AddBody(_Body):
    """``POST /v1/memories/``: the arguments of ``MemoryClient.add`` (``version`` is Mem0's and only checked)."""

    messages: Messages
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None
    infer: bool = True
    prompt: str | None = None
    encode_kv: bool | None = None
    output_format: str | None = None
    version: str | None = None
    timestamp: int | float | str | None = None
    expiration_date: str | None = None


class SearchBody(_Body):
    """``POST /v1/memories/search/`` and ``/v2/memories/search/``: the arguments of ``MemoryClient.search``."""

    query: str
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    filters: dict[str, Any] | None = None
    limit: int | None = None
    top_k: int | None = None
    threshold: float | None = None
    version: str | None = None
    output_format: str | None = None
    rerank: bool = False
    explain: bool = False
    reference_date: str | None = None
    show_expired: bool = False


class GetAllBody(_Body):
    """``POST /v2/memories/``: the arguments of ``MemoryClient.get_all`` (v2: ``filters`` in the body)."""

    filters: dict[str, Any] | None = None
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    limit: int | None = None
    top_k: int | None = None
    version: str | None = None
    output_format: str | None = None
    show_expired: bool = False


class UpdateBody(_Body):
    """``PUT /v1/memories/{memory_id}/``: the new text (``text``, or Mem0's ``data``) and/or metadata (Mem0's
    ``expiration_date`` only as ``null``: memories do not expire)."""

    text: str | None = None
    data: str | None = None
    metadata: dict[str, Any] | None = None
    expiration_date: str | None = None


class EncodingWaitBody(_Body):
    """``POST /v1/encoding/wait/``: the argument of ``MemoryClient.wait_for_encoding`` (seconds; ``null``: the most
    one request waits)."""

    timeout: float | None = None


class ChatOptions(_Body):
    """The ``inferscale`` object of a chat request: whose memories, and how they are chosen (the arguments of
    ``MemoryClient.chat``). ``user_id`` defaults to OpenAI's ``user``."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    filters: dict[str, Any] | None = None
    limit: int | None = None
    # Typed loosely so that the client's own check answers a wrong shape, with the message it gives in process; the
    # schema still documents a list of ids.
    memory_ids: Any = Field(default=None, json_schema_extra={"type": "array", "items": {"type": "string"}})
    search_query: str | None = None
    mode: str = "kv"


class ChatBody(BaseModel):
    """``POST /v1/chat/completions``: OpenAI's chat request, plus vLLM's ``top_k`` and ``repetition_penalty`` and
    the optional ``inferscale`` object. Other OpenAI fields are accepted only with their neutral value."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    messages: list[dict[str, Any]]
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    n: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    inferscale: ChatOptions | None = None
