"""``inferscale serve --engine transformers``: the memory client, its API keys and the FastAPI app under uvicorn."""

from __future__ import annotations

import logging

from inferscale.async_client import AsyncMemoryClient
from inferscale.errors import ConfigError
from inferscale.server.keys import KeyStore
from inferscale.server.options import LOOPBACK_HOSTS, ServerOptions, memory_config
from inferscale.storage.database import shown_url

__all__ = ["check_listen_address", "memory_config", "serve_transformers"]

log = logging.getLogger(__name__)

UVICORN_STARTUP_FAILURE = 3
"""The exit status of a server that could not start (uvicorn's, as ``uvicorn.run`` exits with)."""


def check_listen_address(host: str, keys: KeyStore) -> bool:
    """Whether the server may listen on ``host``; returns ``True`` when it runs open (no API keys), which is logged.

    Raises:
        ConfigError: when the store holds no API key and ``host`` is not a loopback address: without keys, anyone
            who can reach the port could read and delete every memory.
    """
    if keys.has_keys():
        return False
    if host not in LOOPBACK_HOSTS:
        raise ConfigError(
            f"refusing to listen on {host!r} without API keys: anyone reaching it could read and delete every "
            f"memory. Create a key first (`inferscale keys create NAME --admin`), or listen on 127.0.0.1"
        )
    log.warning(
        "no API keys in %s: the server is OPEN (no authentication) and listens on loopback (%s) only; "
        "create a key with `inferscale keys create` to require one",
        shown_url(keys.url),
        host,
    )
    return True


def serve_transformers(options: ServerOptions) -> None:
    """Run the server until interrupted (blocks): the async memory client on the transformers engine, the API keys
    of its database, and the app of :func:`inferscale.server.app.create_app` under uvicorn on ``host:port``. The
    model is loaded before the port opens. On SIGTERM or Ctrl-C, ``options.shutdown_grace_s`` bounds the whole
    shutdown: the running requests get the grace, and the background K/V encoder what is left of it once they are
    done (plus the chunk it is encoding then; :class:`~inferscale.server.shutdown.ShutdownClock`).

    Raises:
        ConfigError: for bad options, or a non-loopback host with no API key in the store
            (:func:`check_listen_address`).
        ModelNotAvailableError: when the model cannot be found.
        SystemExit: with status 3 when uvicorn could not start the server (as ``uvicorn.run`` exits).
    """
    import uvicorn

    from inferscale.server.app import create_app
    from inferscale.server.shutdown import ShutdownClock, serve_uvicorn

    config = memory_config(options)
    keys = KeyStore.for_config(config, options.key_check_limits)
    try:
        check_listen_address(options.host, keys)
        client = AsyncMemoryClient(config)
        log.info("loading %s", client.model_name)
        client.engine.load()
        clock = ShutdownClock()  # the requests and the encoder's drain share one grace, counted from the signal
        app = create_app(client, keys=keys, options=options, shutdown_clock=clock)
        server_config = uvicorn.Config(
            app,
            host=options.host,
            port=options.port,
            log_level=options.log_level,
            timeout_graceful_shutdown=options.shutdown_grace_whole_s,
        )
        if not serve_uvicorn(server_config, clock):
            raise SystemExit(UVICORN_STARTUP_FAILURE)
    finally:
        keys.close()
