"""Settings of ``inferscale serve --engine transformers``: where it listens, what it loads, and request limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
"""Largest request body the server reads (1 MiB); a larger one is answered 413 ``request_too_large``."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""The hosts a server without API keys may listen on."""


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How the server runs.

    Attributes:
        host, port: where uvicorn listens. With no API keys in the store only a loopback host is allowed
            (:data:`LOOPBACK_HOSTS`).
        data_dir: the memory database, index and K/V folder (``MemoryConfig.data_dir``; ``None``: ``<home>/data``).
        db_url: the memory database (``MemoryConfig.db_url``; ``None``: ``<data_dir>/memory.db``). The API keys
            live in it too.
        model: the chat model folder or hub id; ``None`` is the embedded SmolLM2-135M-Instruct.
        dtype: the chat model's weights and K/V dtype; ``None`` keeps ``EngineConfig``'s default.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
        max_request_bytes: the largest request body read (bytes); larger ones get 413 before parsing.
        chat_limit: memories a chat retrieves when the request names no ``limit`` (``None``: the client's default).
        served_model_name: the model name ``/v1/models`` and chat replies report; ``None`` is the client's
            ``model_name``.
        log_level: uvicorn's log level.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str | None = None
    db_url: str | None = None
    model: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    device: str = "auto"
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    chat_limit: int | None = None
    served_model_name: str | None = None
    log_level: str = "info"
