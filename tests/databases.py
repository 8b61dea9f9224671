"""The test databases: a SQLite file under a folder, or a fresh, empty schema on the PostgreSQL server.

:func:`database_url` is shared by the ``db_url`` fixture (tests/conftest.py, one database per test) and by test
modules that fill one database per module and read it many times.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Literal

import pytest

PG_HOST = "127.0.0.1:5432"
PG_DATABASE = "test"
PG_ROLES = ("postgres", "root")

Backend = Literal["sqlite", "postgres"]


@cache
def postgres_base_url() -> str | None:
    """The first ``postgresql+psycopg://ROLE@127.0.0.1:5432/test`` URL that connects (trust auth), or None."""
    try:
        import psycopg  # noqa: F401  (SQLAlchemy's driver for the URLs below)
    except ImportError:
        return None
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    for role in PG_ROLES:
        url = f"postgresql+psycopg://{role}@{PG_HOST}/{PG_DATABASE}"
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        try:
            with engine.connect() as conn:
                conn.execute(text("select 1"))
            return url
        except OperationalError:
            continue
        finally:
            engine.dispose()
    return None


@contextmanager
def database_url(backend: Backend, directory: Path) -> Iterator[str]:
    """A database URL of ``backend`` for the length of the block: a SQLite file under ``directory``, or a fresh,
    empty schema on the PostgreSQL server (its connections use it through libpq's ``search_path`` option; dropped
    with its tables when the block ends).

    Raises:
        pytest.skip.Exception: for PostgreSQL, when psycopg is missing or no server answers (the caller is skipped).
    """
    if backend == "sqlite":
        yield f"sqlite:///{directory}/db/memory.db"
        return
    base = postgres_base_url()
    if base is None:
        roles = ", ".join(PG_ROLES)
        pytest.skip(f"no PostgreSQL server answered at {PG_HOST}/{PG_DATABASE} (roles {roles}, trust auth)")
    from sqlalchemy import create_engine, text

    schema = f"inferscale_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base)
    with admin.begin() as conn:
        conn.execute(text(f'create schema "{schema}"'))
    try:
        yield f"{base}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'drop schema "{schema}" cascade'))
        admin.dispose()
