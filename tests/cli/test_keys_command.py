"""``inferscale keys create | list | revoke`` on the key store of the test's data folder: a created key
authenticates with its bound scopes, a revoked one no longer does."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_runner import Fakes, Ran

from inferscale.commands.options import StoreOptions
from inferscale.server.keys import KeyStore
from inferscale.server.options import ServerOptions, memory_config


@pytest.fixture
def store(fakes: Fakes) -> Iterator[KeyStore]:
    """The key store the commands use: the one in the data folder's memory database (as ``inferscale serve``)."""
    keys = KeyStore.for_config(StoreOptions(data_dir=str(fakes.data_dir)).config())
    yield keys
    keys.close()


def test_create_list_revoke_round_trip(cli: Callable[..., Ran], store: KeyStore) -> None:
    created = cli("keys", "create", "alice's agent", "--user", "alice", "--user", "al", "--agent", "helper", "--json")
    assert created.code == 0, created.err
    body = created.json()
    key, api_key = body["key"], body["api_key"]
    assert "not shown again" in created.err
    found = store.authenticate(key)
    assert found is not None and found.key_id == api_key["key_id"]
    assert (found.name, found.user_ids, found.agent_ids, found.run_ids, found.admin) == (
        "alice's agent",
        ("alice", "al"),
        ("helper",),
        None,
        False,
    )
    assert api_key == {
        "key_id": found.key_id,
        "name": "alice's agent",
        "admin": False,
        "user_ids": ["alice", "al"],
        "agent_ids": ["helper"],
        "run_ids": None,
        "created_at": found.created_at.isoformat(),
        "revoked_at": None,
    }

    admin = cli("keys", "create", "ops", "--admin", "--json").json()
    listed = cli("keys", "list", "--json").json()
    assert (
        [k["key_id"] for k in listed] == [k.key_id for k in store.list()] == [found.key_id, admin["api_key"]["key_id"]]
    )
    assert listed[1]["admin"] is True and listed[1]["user_ids"] is None

    revoked = cli("keys", "revoke", found.key_id, "--json")
    assert revoked.code == 0
    assert revoked.json()["revoked_at"] is not None
    assert store.authenticate(key) is None
    assert store.authenticate(admin["key"]) is not None


def test_create_prints_the_key_once_with_a_warning(cli: Callable[..., Ran], store: KeyStore) -> None:
    ran = cli("keys", "create", "ci", "--run", "nightly")
    assert ran.code == 0
    key = next(line for line in ran.out.splitlines() if line.startswith("isk_"))
    found = store.authenticate(key)
    assert found is not None and found.run_ids == ("nightly",)
    assert f"created API key {found.key_id} (ci)" in ran.out
    assert "warning: save this key now: it is not shown again" in ran.err
    assert key not in cli("keys", "list").out


def test_list_table_shows_scopes_admin_and_revocation(cli: Callable[..., Ran], store: KeyStore) -> None:
    bound = cli("keys", "create", "bob", "--user", "bob", "--json").json()["api_key"]
    admin = cli("keys", "create", "root", "--admin", "--json").json()["api_key"]
    revoked = cli("keys", "revoke", bound["key_id"])
    assert revoked.code == 0 and f"revoked API key {bound['key_id']} (bob)" in revoked.out
    ran = cli("keys", "list")
    assert "2 API keys" in ran.out
    rows = {k: next(line for line in ran.out.splitlines() if k in line) for k in (bound["key_id"], admin["key_id"])}
    when_revoked = store.list()[0].revoked_at
    assert when_revoked is not None
    assert "user=bob" in rows[bound["key_id"]] and when_revoked.strftime("%Y-%m-%d %H:%M") in rows[bound["key_id"]]
    assert "any" in rows[admin["key_id"]] and "yes" in rows[admin["key_id"]]


def test_the_table_tells_two_ids_from_one_id_with_a_comma(cli: Callable[..., Ran], store: KeyStore) -> None:
    """An adversarial tester's find: keys bound to ["alice", "bob"] and to ["alice,bob"] both showed
    ``user=alice,bob``, and a leading space of an id was lost."""
    two = cli("keys", "create", "two", "--user", "alice", "--user", "bob", "--json").json()["api_key"]
    one = cli("keys", "create", "one", "--user", "alice,bob", "--json").json()["api_key"]
    spaced = cli("keys", "create", "spaced", "--user", " x", "--agent", "a.b@c:d+e-f_g", "--json").json()["api_key"]
    out = cli("keys", "list").out
    rows = {k["name"]: next(line for line in out.splitlines() if k["key_id"] in line) for k in (two, one, spaced)}
    assert "user=alice,bob " in rows["two"]
    assert 'user="alice,bob" ' in rows["one"]
    assert 'user=" x" agent=a.b@c:d+e-f_g ' in rows["spaced"]
    lookalike = cli("keys", "create", "lookalike", "--user", "\u0430lice", "--json").json()["api_key"]  # Cyrillic а
    assert 'user="\u0430lice" ' in next(
        line for line in cli("keys", "list").out.splitlines() if lookalike["key_id"] in line
    )


def test_key_errors_are_one_line_with_the_exit_code_of_their_kind(cli: Callable[..., Ran], store: KeyStore) -> None:
    """A key without a scope is bad input (2), named in the command line's terms (it said ``admin=True``); an
    unknown key id is not found (1, as ``delete`` of an unknown memory; it exited 2)."""
    unbound = cli("keys", "create", "nobody")  # a non-admin key must bind a scope
    assert unbound.code == 2 and unbound.out == ""
    assert unbound.err.startswith("error: a key needs --user, --agent or --run") and unbound.err.count("\n") == 1
    assert "--admin for a key that may touch every scope" in unbound.err and "admin=True" not in unbound.err
    unknown = cli("keys", "revoke", "0123456789ab")
    assert unknown.code == 1 and "no API key has id '0123456789ab'" in unknown.err and unknown.err.count("\n") == 1
    assert store.list() == []


def test_an_admin_key_bound_to_scopes_is_refused(cli: Callable[..., Ran], store: KeyStore) -> None:
    """An admin key touches every scope (and may reset the store), so lists on it would bind nothing."""
    for scope in (("--user", "alice"), ("--agent", "a", "--run", "r")):
        ran = cli("keys", "create", "tenant admin", "--admin", *scope)
        assert ran.code == 2 and ran.out == "" and ran.err.count("\n") == 1, ran.err
        assert ran.err.startswith("error: an admin key touches every scope") and "cannot bind" in ran.err
    assert store.list() == []


def test_keys_made_with_a_config_file_and_data_dir_are_the_servers(cli: Callable[..., Ran], tmp_path: Path) -> None:
    """The last stop's find: ``--data-dir`` set aside the database, index and K/V folder a ``--config`` file names
    for ``inferscale serve`` but not for the other commands, so ``keys create --config app.json --data-dir X`` wrote
    its key into the file's database, and ``serve --config app.json --data-dir X`` never found it."""
    app = tmp_path / "app.json"
    named = {"db_url": f"sqlite:///{tmp_path / 'file.db'}", "index_path": str(tmp_path / "file.faiss")}
    app.write_text(json.dumps({**named, "kv": {"store_dir": str(tmp_path / "file-kv")}}), encoding="utf-8")
    data = tmp_path / "data"
    command = StoreOptions(config_file=str(app), data_dir=str(data)).config()
    served = memory_config(ServerOptions(config_file=str(app), data_dir=str(data)))
    assert (command.database_url(), command.index_path, command.kv.store_dir, command.data_path()) == (
        f"sqlite:///{data / 'memory.db'}",
        None,
        None,
        data,
    )
    assert (served.database_url(), served.index_path, served.kv.store_dir) == (
        command.database_url(),
        command.index_path,
        command.kv.store_dir,
    )
    created = cli(
        "keys", "create", "app", "--user", "maya", "--config", str(app), "--data-dir", str(data), "--json", local=False
    )
    assert created.code == 0, created.err
    keys = KeyStore.for_config(served)
    try:
        assert keys.authenticate(created.json()["key"]) is not None
    finally:
        keys.close()
    assert not (tmp_path / "file.db").exists()
    server = {"db_url": "postgresql+psycopg://app@db.internal:5432/memories"}
    app.write_text(json.dumps(server), encoding="utf-8")  # a review's find: a server's database is in no folder
    on_server = StoreOptions(config_file=str(app), data_dir=str(data)).config()
    assert (on_server.database_url(), on_server.data_path()) == (server["db_url"], data)
    assert memory_config(ServerOptions(config_file=str(app), data_dir=str(data))).database_url() == server["db_url"]
    app.write_text(json.dumps({**named, "kv": {"store_dir": str(tmp_path / "file-kv")}}), encoding="utf-8")
    kept = StoreOptions(config_file=str(app)).config()  # no --data-dir: the file's paths
    assert (kept.db_url, kept.index_path, kept.kv.store_dir) == (*named.values(), str(tmp_path / "file-kv"))
