"""Settings of ``inferscale serve``: :class:`ServeSettings`, what both engines share (where the server listens, what
it loads), with :class:`ServerOptions` (``--engine transformers``) adding request limits, and
``inferscale.server.vllm_memory.ServeOptions`` (``--engine vllm``) vLLM's cache sizes; :func:`memory_config`, the
memory client's config of either."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferscale.arguments import MAX_LIMIT
from inferscale.config import DType, MemoryConfig
from inferscale.errors import ConfigError
from inferscale.mem0_config import config_with_flags
from inferscale.server.key_checks import (
    DEFAULT_FAILED_KEY_CHECK_BURST,
    DEFAULT_FAILED_KEY_CHECKS_PER_S,
    KeyCheckLimits,
)
from inferscale.validation_text import shown_input

MAX_PORT = 65_535
"""The highest TCP port (0 asks the system for a free one)."""

DEFAULT_MAX_REQUEST_BYTES = 1 << 20
"""Largest request body the server reads (1 MiB); a larger one is answered 413 ``request_too_large``."""

MAX_SHUTDOWN_GRACE_S = 86_400.0
"""The longest shutdown grace accepted (seconds, a day): a grace of 1e10 s passed validation and overflowed the
wait of the encoder's drain (``threading.TIMEOUT_MAX``), so the client was never closed (a review's find)."""

DEFAULT_SHUTDOWN_GRACE_S = 30.0
"""How long a stopping server's shutdown may take (seconds, from the signal; Kubernetes' default termination grace
period): running requests finish within it, and the background K/V encoder works for what is left, plus the chunk
it is encoding then (:class:`ServeSettings`). Under Kubernetes set it a few seconds below the pod's
``terminationGracePeriodSeconds`` so that the pod is not killed before the process has exited."""

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""The hosts a server without API keys may listen on."""


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What both engines' servers share.

    Attributes:
        host, port: where the server listens. With no API keys in the store only a loopback host is allowed
            (:data:`LOOPBACK_HOSTS`).
        data_dir: the memory database, index and K/V folder (``MemoryConfig.data_dir``; ``None``: ``<home>/data``).
        db_url: the memory database (``MemoryConfig.db_url``; ``None``: ``<data_dir>/memory.db``). The API keys
            live in it too.
        model: the chat model folder or hub id; ``None`` is the embedded SmolLM2-135M-Instruct.
        dtype: the chat model's weights and K/V dtype; ``None`` keeps ``EngineConfig``'s default (``"auto"``).
        served_model_name: the model name clients send and replies report; ``None``: the model's own name.
        recompute: ``kv.recompute``, the memory tokens prefilled again at serve time (``"tail:n"``, ...;
            :mod:`inferscale.kv.recompute`); ``None`` keeps ``KVConfig``'s default. The vLLM server serves
            ``"none"`` and ``"tail:n"`` and refuses the others at startup.
        memory_layout: ``MemoryConfig.memory_layout``, the order a chat lays its retrieved memories out in
            (``"score"``, best first, or ``"added"``, oldest first); ``None`` keeps ``MemoryConfig``'s default.
        shutdown_grace_s: on SIGTERM or Ctrl-C, how long (seconds) the shutdown may take, counted from the
            signal: the server lets running requests finish for up to the grace (rounded up to whole seconds) once
            it stops accepting new ones; then it cancels them (an open stream ends and its engine request is freed)
            and closes the memory client, whose background K/V encoder gets what is left of the grace
            (``close(encoding_timeout=...)``: then it starts no further chunk, finishes the one running, and logs
            how many memories it leaves to be encoded on first use). 0 cancels the requests and stops the encoder
            at once. ``--engine vllm`` passes it to vLLM as ``--shutdown-timeout``.
        failed_key_checks_per_s, failed_key_check_burst: the budget of failed checks of API keys the server has not
            verified before (:class:`~inferscale.server.key_checks.KeyCheckLimits`: failed checks per second, a
            finite number > 0, and how many it holds, a whole number >= 1); past it such keys are answered 429
            ``rate_limited`` at once, without a scrypt. Keys verified before are never refused by it.
        config_file: a JSON file of the memory client's config, as ``MemoryClient(config=...)`` takes it (our
            fields or Mem0's shape; :func:`~inferscale.mem0_config.config_from_file`): what :func:`memory_config`
            starts from, so that a server extracts facts with the ``llm`` it names, embeds with its ``embedder``,
            encodes under its ``kv`` settings and answers after its ``system_prompt``. The settings above that are
            given override it; ``None``: every field at its default.
        log_level: uvicorn's log level (``inferscale --log-level``; ``"info"``, its access log included, by
            default); ``--engine vllm`` passes it to vLLM as ``--uvicorn-log-level``.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str | None = None
    db_url: str | None = None
    model: str | None = None
    dtype: DType | None = None
    served_model_name: str | None = None
    recompute: str | None = None
    memory_layout: str | None = None
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    failed_key_checks_per_s: float = DEFAULT_FAILED_KEY_CHECKS_PER_S
    failed_key_check_burst: int = DEFAULT_FAILED_KEY_CHECK_BURST
    config_file: str | None = None
    log_level: str = "info"

    def __post_init__(self) -> None:
        """Check the shutdown grace, the port and the failed key check budget.

        Raises:
            ConfigError: for a ``shutdown_grace_s`` that is not a number of seconds, is negative or past
                :data:`MAX_SHUTDOWN_GRACE_S` (a wait that long overflowed the encoder's drain at shutdown),
                a port outside 0-65535 (before the model is loaded: uvicorn's bind raised ``OverflowError``), or a
                budget :class:`~inferscale.server.key_checks.KeyCheckLimits` refuses.
        """
        grace = self.shutdown_grace_s
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= MAX_SHUTDOWN_GRACE_S:
            raise ConfigError(
                f"shutdown grace must be a finite number of seconds >= 0 (at most {MAX_SHUTDOWN_GRACE_S:,.0f}), "
                f"got {shown_input(self.shutdown_grace_s)}"
            )
        check_setting("port (--port)", self.port, 0, MAX_PORT)
        _ = self.key_check_limits

    @property
    def key_check_limits(self) -> KeyCheckLimits:
        """The key store's budget of failed key checks (``KeyStore.for_config(config, options.key_check_limits)``).

        Raises:
            ConfigError: for a rate or burst out of bounds (see :class:`ServeSettings`).
        """
        return KeyCheckLimits(self.failed_key_checks_per_s, self.failed_key_check_burst)

    @property
    def engine_device(self) -> str | None:
        """The device of the memory client's transformers engine: ``"cpu"`` (the vLLM server's copy of the weights,
        which only encodes facts), unless a subclass says otherwise; ``None`` keeps the config file's."""
        return "cpu"

    @property
    def encodes_only(self) -> bool:
        """Whether the memory client's engine only encodes facts (the vLLM server's) rather than serving chats."""
        return True

    @property
    def shutdown_grace_whole_s(self) -> int:
        """:attr:`shutdown_grace_s` rounded up to whole seconds, as uvicorn and vLLM take it (never cut short)."""
        return math.ceil(self.shutdown_grace_s)


@dataclass(frozen=True, slots=True)
class ServerOptions(ServeSettings):
    """How the transformers server runs: :class:`ServeSettings` and

    Attributes:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``; ``None`` keeps the config file's
            ``engine.device`` (``"auto"`` without one).
        max_request_bytes: the largest request body read (bytes); larger ones get 413 before parsing.
        chat_limit: memories a chat retrieves when the request names no ``limit`` (``None``: the client's default).
    """

    device: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    chat_limit: int | None = None

    def __post_init__(self) -> None:
        """Check every setting before anything is loaded.

        Raises:
            ConfigError: as :meth:`ServeSettings.__post_init__`, or for a ``max_request_bytes`` under 1 (every
                request, ``/health`` included, got 413) or a ``chat_limit`` that is negative or over
                :data:`~inferscale.arguments.MAX_LIMIT` (every chat got 400, blamed on its client).
        """
        ServeSettings.__post_init__(self)
        check_setting("the request size limit (--max-request-bytes)", self.max_request_bytes, 1)
        if self.chat_limit is not None:
            check_setting("the chat limit (--limit)", self.chat_limit, 0, MAX_LIMIT)

    @property
    def engine_device(self) -> str | None:
        """:attr:`device`."""
        return self.device

    @property
    def encodes_only(self) -> bool:
        """``False``: this server's engine serves the chats."""
        return False


def check_setting(name: str, value: object, low: int, high: int | None = None) -> None:
    """Refuse a server setting that is not a whole number from ``low`` to ``high`` (no upper bound: ``None``).

    Raises:
        ConfigError: naming the setting and its bounds.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"from {low} to {high:,}" if high is not None else f"of at least {low}"
        raise ConfigError(f"{name} must be a whole number {bounds}, got {shown_input(value)}")


def memory_config(options: ServeSettings) -> MemoryConfig:
    """The memory client's config for either server: the ``config_file``'s (every field at its default without one),
    with what the options give over it: the transformers engine on ``model`` (``dtype``, ``engine_device``), data in
    ``data_dir`` (the database, index and K/V folder all there, the file's ``db_url``, ``index_path`` and
    ``kv.store_dir`` set aside) or ``db_url``, ``kv.recompute`` from ``recompute`` and ``memory_layout``. The engine
    is always the transformers one (the server's own, or the vLLM server's CPU copy that encodes facts, which has no
    GPU K/V tier), whatever the file's ``engine.provider``; vLLM's limits are :class:`ServeSettings`' subclass's
    (``inferscale serve`` takes them from the file's engine when no flag gives them). Its database holds the
    memories and the API keys (``KeyStore.for_config``).

    Raises:
        ConfigError: for a config file that cannot be read or does not validate, or a value ``EngineConfig``,
            ``KVConfig`` or ``MemoryConfig`` refuses (an unknown recompute policy or memory layout among them):
            :func:`~inferscale.mem0_config.config_with_flags`, which builds it as every command builds its own.
    """
    given = {"model": options.model, "dtype": options.dtype, "device": options.engine_device}
    engine: dict[str, object] = {name: value for name, value in given.items() if value}
    engine.update(provider="transformers", max_model_len=None, kv_cache_bytes=None)  # vLLM's own: ServeOptions'
    kv: dict[str, object] = {} if options.recompute is None else {"recompute": options.recompute}
    if options.encodes_only:  # its K/V reach vLLM through files: a GPU tier for the CPU copy would hold nothing
        kv["device_budget_bytes"] = 0
    layout = {} if options.memory_layout is None else {"memory_layout": options.memory_layout}
    return config_with_flags(
        options.config_file, data_dir=options.data_dir, db_url=options.db_url, engine=engine, kv=kv, fields=layout
    )
