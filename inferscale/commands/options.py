"""The options the memory and key commands share, each declared once, as the fields of a settings dataclass
(:func:`inferscale.cli_options.cli`), and attached to every command through argparse parent parsers
(:func:`parents`).

- :class:`ScopeOptions`: ``--user``, ``--agent``, ``--run``: whose memories.
- :class:`StoreOptions`: ``--config``, ``--data-dir``, ``--db-url``: the local store (and the key store, in its
  database).
- :class:`ModelOptions`: ``--model``, ``--dtype``: the local store's chat model.
- :class:`RemoteOptions`: ``--host``, ``--api-key``: a server to talk to instead of the local store.
- :class:`OutputOptions`: ``--json``: the client's return value as JSON, for scripts.
- :class:`SelectOptions`: ``--filters``, ``--limit``: which memories a search, list or chat considers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from inferscale.cli_options import MODEL_OPTION, add_options, cli, from_args, integer, quoted
from inferscale.config import DATABASE_FILE, DType, EngineConfig, MemoryConfig
from inferscale.errors import ConfigError
from inferscale.json_text import loads_json
from inferscale.mem0_config import config_with_flags
from inferscale.scope import ScopeIds
from inferscale.storage.database import sqlite_file
from inferscale.terminal_text import terminal_safe

__all__ = [
    "LOCAL_ONLY",
    "Common",
    "ModelOptions",
    "OutputOptions",
    "Parents",
    "RemoteOptions",
    "ScopeIds",
    "ScopeOptions",
    "SelectOptions",
    "StoreOptions",
    "json_object",
    "parents",
]


def json_object(text: str) -> dict[str, Any]:
    """A command-line word holding a JSON object, e.g. ``'{"category": "travel"}'``.

    Raises:
        argparse.ArgumentTypeError: for text that is not JSON or not an object (argparse reports it and exits 2).
    """
    try:
        value = loads_json(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {quoted(text)} ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object ({{...}}), got {quoted(text)}")
    return value


@dataclass(frozen=True)
class ScopeOptions:
    """Whose memories a command reads or writes; ids given are ANDed (as the client's ``user_id``, ``agent_id``,
    ``run_id``)."""

    user_id: str | None = field(default=None, metadata=cli("--user", metavar="ID", help="the memories' user id"))
    agent_id: str | None = field(default=None, metadata=cli("--agent", metavar="ID", help="the memories' agent id"))
    run_id: str | None = field(default=None, metadata=cli("--run", metavar="ID", help="the memories' run id"))

    def ids(self) -> ScopeIds:
        """``{"user_id", "agent_id", "run_id"}``, as the client's keyword arguments."""
        return ScopeIds(user_id=self.user_id, agent_id=self.agent_id, run_id=self.run_id)

    def describe(self, none: str = "the scope of the --filters or API key") -> str:
        """The ids given, e.g. ``"user=alice run=r1"``, or ``none`` when no id is. For a memory command, a call
        without ids that succeeded took its scope from the ``--filters`` (their ``user_id``/``agent_id``/``run_id``)
        or from the API key (one bound id; with ``--host``), since a call with no scope at all is refused: the
        default. A command that reads every memory without ids (``prepare-kv``, ``prune-kv``) passes
        ``"every scope"``. Each id's terminal controls are escaped (:func:`~inferscale.terminal_text.terminal_safe`).
        """
        named = [(k, v) for k, v in (("user", self.user_id), ("agent", self.agent_id), ("run", self.run_id)) if v]
        return " ".join(f"{k}={terminal_safe(v)}" for k, v in named) or none


@dataclass(frozen=True)
class StoreOptions:
    """The local store: the client's config from a file, its data folder and its database (``inferscale serve``
    takes ``--data-dir`` and ``--db-url`` too)."""

    config_file: str | None = field(
        default=None,
        metadata=cli(
            "--config",
            metavar="FILE",
            help="a JSON file of the app's client config, as MemoryClient(config=...) takes it (our fields or Mem0's "
            "shape); the flags given override it",
        ),
    )
    data_dir: str | None = field(
        default=None,
        metadata=cli("--data-dir", metavar="DIR", help="memory database, index and K/V folder (default <home>/data)"),
    )
    db_url: str | None = field(
        default=None,
        metadata=cli("--db-url", metavar="URL", help="memory database URL (default <data-dir>/memory.db)"),
    )

    def config(self, model: ModelOptions | None = None) -> MemoryConfig:
        """The :class:`MemoryConfig` of the store these options name: the ``--config`` file's (every field at its
        default without one), with ``--data-dir``, ``--db-url`` and ``model``'s chat model and dtype where given
        (:func:`~inferscale.mem0_config.config_with_flags`, as ``inferscale serve``: ``--data-dir`` moves the
        database, index and K/V folder a file names). The app's own config makes a command see what the app sees:
        ``prepare-kv`` encodes under the app's ``kv`` settings and system prompt, which key the K/V.

        Raises:
            ConfigError: when the file cannot be read, is not JSON, or holds a config that does not validate, or a
                flag's value is refused.
        """
        given = {} if model is None else {"model": model.model, "dtype": model.dtype}
        engine = {name: value for name, value in given.items() if value is not None}
        return config_with_flags(self.config_file, data_dir=self.data_dir, db_url=self.db_url, engine=engine)

    def existing_config(self, model: ModelOptions | None = None) -> MemoryConfig:
        """:meth:`config`, for a command that reads or changes what a store already holds (every command but ``add``,
        ``import-mem0``, ``keys create`` and ``serve``): a data folder named by ``--data-dir`` or the config file must
        hold the database (``memory.db``) when the database lives there (no ``--db-url``). Opening a mistyped path, or
        an existing folder that is not a store (``--data-dir .``), would create a new, empty store there and answer
        from it (no memories found, none deleted) as if the right one were empty. The default folder (``<home>/data``)
        is taken as it is: before a first ``add`` it holds nothing, as a new store.

        Raises:
            ConfigError: when that folder or its database file does not exist, or a SQLite ``--db-url`` (or the config
                file's ``db_url``) names a file that does not exist (it too opened a new, empty store, and ``keys
                list`` reported "0 API keys": a new user's find), naming it; or as :meth:`config`.
        """
        config = self.config(model)
        create = (
            "`inferscale add`, `inferscale import-mem0`, `inferscale keys create` and `inferscale serve` create a store"
        )
        if config.data_dir is not None and config.db_url is None and not (config.data_path() / DATABASE_FILE).is_file():
            named = "--data-dir" if self.data_dir is not None else f"data_dir in {self.config_file}"
            missing = f"no {DATABASE_FILE} in that folder" if config.data_path().is_dir() else "no folder there"
            raise ConfigError(f"no store at {config.data_path()} ({named}): {missing}. Check the path; {create}")
        database = _sqlite_database(config.db_url) if config.db_url is not None else None
        if database is not None and not database.is_file():
            named = "--db-url" if self.db_url is not None else f"db_url in {self.config_file}"
            raise ConfigError(f"no store at {config.db_url} ({named}): no file {database}. Check the URL; {create}")
        return config


def _sqlite_database(db_url: str) -> Path | None:
    """The database file a SQLite URL names (:func:`inferscale.storage.database.sqlite_file`), or ``None`` for an
    in-memory database, another backend, or a URL SQLAlchemy cannot parse (the store reports that one when it
    opens)."""
    try:
        url = make_url(db_url)
    except ArgumentError:
        return None
    return sqlite_file(url)


@dataclass(frozen=True)
class ModelOptions:
    """The local store's chat model, also the model that extracts facts. ``None``: not given (the
    :class:`EngineConfig` default), so that a given value, even the default's, counts as given (``--host`` refuses
    it)."""

    model: str | None = field(default=None, metadata=MODEL_OPTION)
    dtype: DType | None = field(
        default=None,
        metadata=cli(
            "--dtype",
            choices=typing.get_args(DType),
            help=f"model dtype (default {EngineConfig.model_fields['dtype'].default})",
        ),
    )


@dataclass(frozen=True)
class RemoteOptions:
    """An InferScale server to call instead of the local store (``inferscale serve``)."""

    host: str | None = field(
        default=None,
        metadata=cli("--host", metavar="URL", help="call the InferScale server at URL instead of the local store"),
    )
    api_key: str | None = field(
        default=None,
        metadata=cli("--api-key", metavar="KEY", help="the server's API key (default $INFERSCALE_API_KEY)"),
    )


@dataclass(frozen=True)
class OutputOptions:
    """How a command prints its result."""

    as_json: bool = field(
        default=False,
        metadata=cli("--json", action="store_true", help="print the client's return value as JSON on stdout, only it"),
    )


@dataclass(frozen=True)
class SelectOptions:
    """Which memories a search, a list or a chat considers, besides the scope."""

    filters: dict[str, Any] | None = field(
        default=None,
        metadata=cli(
            "--filters", type=json_object, metavar="JSON", help='a Mem0 filter object, e.g. \'{"category": "travel"}\''
        ),
    )
    limit: int | None = field(
        default=None,
        metadata=cli(
            "--limit", type=integer, metavar="N", help="memories at most (default: the client's, 100; chat: 5)"
        ),
    )


@dataclass(frozen=True)
class Common:
    """The shared options of one memory command, parsed."""

    scope: ScopeOptions
    store: StoreOptions
    model: ModelOptions
    remote: RemoteOptions
    output: OutputOptions

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Common:
        """Read them from a namespace a parser with :attr:`Parents.memory` parents parsed."""
        return cls(
            from_args(ScopeOptions, args),
            from_args(StoreOptions, args),
            from_args(ModelOptions, args),
            from_args(RemoteOptions, args),
            from_args(OutputOptions, args),
        )


@dataclass(frozen=True)
class Parents:
    """argparse parent parsers holding the shared options (``add_parser(..., parents=...)``).

    Attributes:
        memory: scope, store, model, server and output options: every memory command.
        local: scope, store, model and output options: a memory command that works on the local store only
            (``prepare-kv``); its parser sets the server options to their defaults (:data:`LOCAL_ONLY`).
        keys: store and output options: the key commands (keys live in the local database).
        select: ``--filters`` and ``--limit``: search, list and chat.
    """

    memory: list[argparse.ArgumentParser]
    local: list[argparse.ArgumentParser]
    keys: list[argparse.ArgumentParser]
    select: list[argparse.ArgumentParser]


LOCAL_ONLY: dict[str, None] = {f.name: None for f in dataclasses.fields(RemoteOptions)}
"""The server options' defaults, for ``set_defaults`` on a parser with :attr:`Parents.local` parents: the command
offers no ``--host`` or ``--api-key``, and :meth:`Common.from_args` reads a local store."""


def _parent(title: str, options: type) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    add_options(parser.add_argument_group(title), options)
    return parser


def parents() -> Parents:
    """The parent parsers of the memory and key commands, each shared option added once."""
    scope = _parent("scope (whose memories)", ScopeOptions)
    store = _parent("local store", StoreOptions)
    model = _parent("local model", ModelOptions)
    remote = _parent("server", RemoteOptions)
    output = _parent("output", OutputOptions)
    select = _parent("selection", SelectOptions)
    return Parents(
        memory=[scope, store, model, remote, output],
        local=[scope, store, model, output],
        keys=[store, output],
        select=[select],
    )
