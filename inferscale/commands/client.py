"""The one place a command builds what it calls: :func:`open_client` (the local store, or a server at ``--host``)
and :func:`open_key_store` (the API keys, in the local store's database).

The commands look this module up when they run, so tests may replace the ``MemoryClient`` it calls (to run the
commands on fake models) while every option is still parsed and checked here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferscale.client import MemoryClient
from inferscale.commands.options import ModelOptions, RemoteOptions, StoreOptions
from inferscale.errors import InvalidInputError

if TYPE_CHECKING:
    from typing import TypeAlias

    from inferscale.remote import RemoteMemoryClient
    from inferscale.server.keys import KeyStore

    CommandClient: TypeAlias = MemoryClient | RemoteMemoryClient
    """What a memory command calls: the local client, or the remote one on ``--host`` (the same methods)."""

__all__ = ["open_client", "open_key_store"]


def open_client(
    store: StoreOptions, model: ModelOptions, remote: RemoteOptions, *, creates_store: bool = False
) -> CommandClient:
    """The client a memory command calls: ``MemoryClient(config)`` on the local store, or ``MemoryClient(host=...,
    api_key=...)`` on the server at ``--host`` (the key from ``--api-key``; without it the remote client reads
    ``$INFERSCALE_API_KEY``). Building it does no I/O; the store opens, or the server is called, on first use.
    A local store must exist unless the command ``creates_store`` (``add``, ``import-mem0``):
    :meth:`StoreOptions.existing_config` (a named data folder must hold its ``memory.db``).

    Raises:
        InvalidInputError: for ``--host`` with local store options (the server's own apply), or ``--api-key``
            without ``--host``.
        ConfigError: for a local store's options that do not validate, or a named data folder that holds no store
            (no folder, or no ``memory.db`` in it; unless ``creates_store``).
    """
    if remote.host is None:
        if remote.api_key is not None:
            raise InvalidInputError("--api-key is for a server: give --host URL too, or drop --api-key")
        return MemoryClient(store.config(model) if creates_store else store.existing_config(model))
    if store != StoreOptions() or model != ModelOptions():
        raise InvalidInputError(
            "--config, --data-dir, --db-url, --model and --dtype configure a local store; the server at --host uses "
            "its own: drop them"
        )
    # MemoryClient.__new__ returns the remote client for a host; with no api_key it reads $INFERSCALE_API_KEY.
    return MemoryClient(host=remote.host, api_key=remote.api_key)


def open_key_store(store: StoreOptions, *, creates_store: bool = False) -> KeyStore:
    """The API key store in the database of the store ``store`` names (the one ``inferscale serve`` reads). Its
    module needs SQLAlchemy only, not the server's extra. Building it does no I/O.

    Raises:
        ConfigError: as :func:`open_client`: a named data folder must hold a store unless the command
            ``creates_store`` (``keys create``).
    """
    from inferscale.server.keys import KeyStore

    return KeyStore.for_config(store.config() if creates_store else store.existing_config())
