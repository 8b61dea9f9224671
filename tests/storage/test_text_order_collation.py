"""A tester's find: ``gt``/``gte``/``lt``/``lte`` on a metadata string followed the PostgreSQL database's collation,
so on a database created with an ICU ``en-US`` locale (the default of many managed services) ``{"gt": "B"}`` left
out ``"a"``, which SQLite (code point order) keeps. Both backends now order text by code point. The test database
itself is ``C.UTF-8``, so this one creates an ICU database of its own (skipped where the server cannot)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from databases import postgres_base_url

from inferscale.filters import parse_filters
from inferscale.scope import Scope
from inferscale.storage import MemoryStore

NAMES = ["a", "B", "c", "É", "e", "Z"]  # code point order: B < Z < a < c < e < É
CASES = [({"gt": "B"}, ["Z", "a", "c", "e", "É"]), ({"gte": "a"}, ["a", "c", "e", "É"]), ({"lt": "c"}, ["B", "Z", "a"])]
USER = Scope(user_id="u")


@contextmanager
def _icu_database() -> Iterator[str]:
    base = postgres_base_url()
    if base is None:
        pytest.skip("no PostgreSQL server answered (tests/databases.py)")
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    name = f"inferscale_icu_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(
                text(f"create database {name} template template0 locale_provider icu icu_locale 'en-US' locale 'C'")
            )
    except DBAPIError as exc:
        admin.dispose()
        pytest.skip(f"this PostgreSQL server cannot create an ICU database: {str(exc.orig).splitlines()[0]}")
    try:
        yield base.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"drop database {name} with (force)"))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres-icu"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryStore]:
    with ExitStack() as stack:
        url = f"sqlite:///{tmp_path}/memory.db" if request.param == "sqlite" else stack.enter_context(_icu_database())
        store = stack.enter_context(MemoryStore(url))  # closed before its database is dropped
        for name in NAMES:
            store.add(f"memory of {name}", USER, {"name": name})
        yield store


@pytest.mark.parametrize(("condition", "expected"), CASES, ids=[next(iter(c)) for c, _ in CASES])
def test_metadata_text_compares_by_code_point_on_every_backend(
    store: MemoryStore, condition: dict[str, str], expected: list[str]
) -> None:
    found = store.list(USER, filters=parse_filters({"name": condition}))
    assert sorted((m.metadata["name"] for m in found), key=lambda name: [ord(c) for c in name]) == expected
