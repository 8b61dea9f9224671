"""Versioned schemas: Alembic revision chains, brought to their head on a store's first use, safely under concurrency.

A :class:`SchemaChain` is one Alembic script directory inside the package with its own version table: the memory
store's (:data:`MEMORY_SCHEMA`, tables ``memories``, ``memory_history``, ``kv_entries``) lives here; the server's
API keys keep a chain of their own in :mod:`inferscale.server` (the storage layer knows nothing of them), so each
part upgrades on its own. No ``alembic.ini`` is needed: :func:`ensure_schema` drives Alembic's commands with a
:class:`~alembic.config.Config` built in code, on the caller's engine.

:func:`upgrade_schema`, in one write transaction:

1. waits for the schema lock: on PostgreSQL a transaction-scoped advisory lock on (version table, current schema),
   on SQLite the file's write lock that ``BEGIN IMMEDIATE`` already holds; so processes that open a fresh database
   at the same moment take turns, and all but the first find it at its head;
2. reads the version table; a revision this code does not know (written by a newer InferScale) is a
   :class:`~inferscale.errors.SchemaError`, before anything is changed;
3. without a version table, tables of the chain that are present were made by ``create_all`` before the schema was
   versioned: they are compared with the chain's baseline (Alembic's autogenerate comparison) and, when they
   match, the database is stamped at the baseline revision, keeping its rows; a mismatch is a ``SchemaError``;
4. upgrades to the head revision (a fresh database: every revision from the first).

Alembic's ``context`` and ``op`` are process-wide proxies, so one process runs one chain at a time
(:data:`MIGRATION_LOCK`, taken before the transaction begins; the async store polls for it, so that a coroutine
waiting for it never blocks the event loop that another coroutine holding it needs).

Adding a revision: change the models, then add ``versions/vNNNN_<what>.py`` with ``down_revision`` set to the head;
``tests/storage/test_schema.py`` checks that the head schema equals the models on both backends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, MetaData, inspect

from inferscale.errors import SchemaError
from inferscale.storage.database import WRITE_OPTION
from inferscale.storage.locks import advisory_key, current_schema, lock_keys
from inferscale.storage.uninterrupted import sigint_deferred

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SchemaChain:
    """One versioned schema: an Alembic script directory and the version table that records its revision.

    Attributes:
        name: what the tables hold, for messages (e.g. ``"memory store"``).
        script_location: the folder with ``env.py`` and ``versions/``.
        version_table: the table recording the database's revision (one row).
        baseline_revision: the revision that equals the tables ``create_all`` made before the chain existed.
        baseline: builds the baseline's tables as a frozen ``MetaData`` (never the live models, which move on).
    """

    name: str
    script_location: Path
    version_table: str
    baseline_revision: str
    baseline: Callable[[], MetaData]


@dataclass(frozen=True, slots=True)
class SchemaUpgrade:
    """What :func:`upgrade_schema` found and did.

    Attributes:
        before: the revision found (``None``: no version table).
        after: the revision the database is at now (the head).
        stamped: tables made before versioning were found, checked and stamped at the baseline.
    """

    before: str | None
    after: str
    stamped: bool


def _baseline() -> MetaData:
    from inferscale.storage.migrations.baseline import baseline_metadata

    return baseline_metadata()


MEMORY_SCHEMA = SchemaChain(
    name="memory store",
    script_location=Path(__file__).resolve().parent / "migrations",
    version_table="inferscale_schema_version",
    baseline_revision="0001_baseline",
    baseline=_baseline,
)
"""The memory store's chain: ``memories``, ``memory_history`` and ``kv_entries``."""

MIGRATION_LOCK = threading.Lock()
"""Held while a chain runs in this process (Alembic's ``context`` and ``op`` proxies are process-wide)."""


@cache
def _script(location: Path) -> ScriptDirectory:
    """The chain's script directory (its revision files parsed once per process)."""
    return ScriptDirectory(str(location))


def alembic_config(chain: SchemaChain, conn: Connection) -> Config:
    """An in-memory Alembic config that runs ``chain`` on ``conn`` (read back by the chain's ``env.py``), for
    Alembic's commands; the caller holds :data:`MIGRATION_LOCK` and ``conn``'s transaction."""
    config = Config()
    config.set_main_option("script_location", str(chain.script_location).replace("%", "%%"))
    config.attributes["connection"] = conn
    config.attributes["chain"] = chain
    return config


def configure_env(config: Config) -> tuple[Connection, SchemaChain]:
    """The connection and chain that :func:`ensure_schema` handed to Alembic, for a chain's ``env.py``.

    Raises:
        SchemaError: when the chain is run another way (e.g. the ``alembic`` command): InferScale upgrades its
            schema itself, on first use.
    """
    conn, chain = config.attributes.get("connection"), config.attributes.get("chain")
    if not isinstance(conn, Connection) or not isinstance(chain, SchemaChain):
        raise SchemaError(
            "InferScale's migrations run through inferscale.storage.schema.ensure_schema (on a store's first use), "
            "not the alembic command"
        )
    return conn, chain


def _schema_lock(conn: Connection, chain: SchemaChain) -> None:
    """Wait for the chain's lock in ``conn``'s transaction (PostgreSQL: an advisory lock per schema; SQLite holds
    the write lock already)."""
    if conn.dialect.name == "postgresql":
        key = advisory_key("inferscale.schema", chain.version_table, current_schema(conn))
        lock_keys(conn, [key], escalate=False)  # alone: a migration's DDL must not hold a lock writers wait for


def _check_baseline(conn: Connection, chain: SchemaChain, present: list[str]) -> None:
    """Raise unless the chain's tables in the database equal its baseline (tables, columns, types, keys, indexes).

    Raises:
        SchemaError: naming the differences.
    """
    baseline = chain.baseline()
    missing = sorted(set(baseline.tables) - set(present))

    def ours(name: str | None, type_: str, parent: Any) -> bool:
        return type_ != "table" or name in baseline.tables

    context = MigrationContext.configure(conn, opts={"include_name": ours})
    diffs = compare_metadata(context, baseline)
    if missing or diffs:
        shown = "; ".join(str(d) for d in diffs[:10]) + (f" (and {len(diffs) - 10} more)" if len(diffs) > 10 else "")
        raise SchemaError(
            f"the database holds {chain.name} tables ({', '.join(sorted(present))}) without a version table "
            f"({chain.version_table}) that do not match the schema InferScale versioned first"
            + (f"; missing tables: {', '.join(missing)}" if missing else "")
            + (f"; differences: {shown}" if diffs else "")
            + ". Move them aside or use another database."
        )


def upgrade_schema(conn: Connection, chain: SchemaChain) -> SchemaUpgrade:
    """Bring ``chain``'s tables to the head revision inside ``conn``'s open write transaction (see the module doc).
    The caller holds :data:`MIGRATION_LOCK` (:func:`ensure_schema` does both).

    Returns:
        :class:`SchemaUpgrade`: the revision found, the revision now, and whether old tables were stamped.

    Raises:
        SchemaError: when the database is at a revision this code does not know (a newer InferScale wrote it), or
            holds the chain's tables without a version table and they differ from the baseline. Nothing is changed.
    """
    _schema_lock(conn, chain)
    script = _script(chain.script_location)
    head = script.get_current_head()
    if head is None:
        raise SchemaError(f"the {chain.name} schema has no revisions in {chain.script_location}")
    found = MigrationContext.configure(conn, opts={"version_table": chain.version_table}).get_current_heads()
    known = {revision.revision for revision in script.walk_revisions()}
    unknown = [revision for revision in found if revision not in known]
    if unknown or len(found) > 1:
        raise SchemaError(
            f"the database's {chain.name} schema is at revision {', '.join(found)} ({chain.version_table}), which "
            f"this InferScale does not know (its newest is {head}): it was written by a newer InferScale. "
            "Upgrade inferscale, or use another database."
        )
    before = found[0] if found else None
    if before == head:
        return SchemaUpgrade(before, head, stamped=False)
    config = alembic_config(chain, conn)
    stamped = False
    if before is None:
        present = [name for name in chain.baseline().tables if inspect(conn).has_table(name)]
        if present:
            _check_baseline(conn, chain, present)
            command.stamp(config, chain.baseline_revision)
            stamped = True
            log.warning(
                "the %s tables were made before the schema was versioned: they match revision %s and are stamped "
                "with it (rows kept)",
                chain.name,
                chain.baseline_revision,
            )
    command.upgrade(config, "head")
    log.info("the %s schema went from revision %s to %s", chain.name, before or "(none)", head)
    return SchemaUpgrade(before, head, stamped)


def ensure_schema(engine: Engine, chain: SchemaChain) -> SchemaUpgrade:
    """Upgrade ``chain`` on ``engine``'s database to its head in one write transaction (``BEGIN IMMEDIATE`` on
    SQLite), one chain at a time per process; see :func:`upgrade_schema`.

    A Ctrl-C meanwhile is raised when the transaction has ended
    (:func:`~inferscale.storage.uninterrupted.sigint_deferred`).

    Raises:
        SchemaError: see :func:`upgrade_schema` (the transaction rolls back: nothing is changed).
    """
    with sigint_deferred(), MIGRATION_LOCK, engine.execution_options(**{WRITE_OPTION: True}).begin() as conn:
        return upgrade_schema(conn, chain)


__all__ = [
    "MEMORY_SCHEMA",
    "MIGRATION_LOCK",
    "SchemaChain",
    "SchemaUpgrade",
    "alembic_config",
    "configure_env",
    "ensure_schema",
    "upgrade_schema",
]
