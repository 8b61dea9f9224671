"""A database URL's password never reaches a log line, a message or a repr (an SRE's report: an open server's
start-up warning logged ``postgresql+psycopg://postgres:S3cretPW@127.0.0.1:5432/h4_pg`` in clear, while the
connection-error path masked it)."""

from __future__ import annotations

import logging

import pytest

from inferscale.errors import ConfigError
from inferscale.server.keys import KeyStore
from inferscale.server.run import check_listen_address
from inferscale.storage import MemoryStore, make_engine
from inferscale.storage.async_store import AsyncMemoryStore
from inferscale.storage.database import shown_url

SECRET = "S3cretPW"
URL = f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:5432/h4_pg"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (URL, "postgresql+psycopg://postgres:***@127.0.0.1:5432/h4_pg"),
        ("sqlite:////tmp/m.db", "sqlite:////tmp/m.db"),
        (f"postgresql://u:{SECRET}@host:notaport/db", "postgresql://u:***@host:notaport/db"),  # SQLAlchemy refuses it
    ],
)
def test_shown_url_masks_the_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_an_open_servers_warning_names_the_database_without_its_password(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = KeyStore(URL)  # connects on first use: has_keys is answered here
    monkeypatch.setattr(keys, "has_keys", lambda: False)
    with caplog.at_level(logging.WARNING, logger="inferscale.server.run"):
        assert check_listen_address("127.0.0.1", keys) is True
    assert "the server is OPEN" in caplog.text and "postgres:***@127.0.0.1" in caplog.text
    assert SECRET not in caplog.text


def test_stores_and_url_errors_do_not_show_the_password() -> None:
    assert SECRET not in repr(MemoryStore(URL)) and SECRET not in repr(AsyncMemoryStore(URL))
    for bad in (f"postgresql://u:{SECRET}@host:notaport/db", f"nosuchdialect://u:{SECRET}@host/db"):
        with pytest.raises(ConfigError) as refused:
            make_engine(bad)
        assert SECRET not in str(refused.value) and "***" in str(refused.value)
