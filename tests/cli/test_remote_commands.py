"""The memory commands with ``--host``: the same commands, through a real server (uvicorn on 127.0.0.1, fake models)
and the remote client, with a key made by ``inferscale keys create`` on the server's database. ``--json`` prints
what the remote client returns; the server's refusals are one error line with exit code 1."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Ran
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.cli import main

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto."]


@pytest.fixture
def server(tmp_path: Path, engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A server over the fakes; yields its URL and its data folder (where ``keys create`` writes)."""
    from server_fixture import running_server

    from inferscale.server.app import create_app
    from inferscale.server.keys import KeyStore
    from inferscale.server.options import ServerOptions

    monkeypatch.delenv("INFERSCALE_API_KEY", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    config = fake_config(tmp_path / "server")
    client = AsyncMemoryClient(config, engine=engine, embedder=HashEmbedder(), generator=ScriptedGenerator())
    keys = KeyStore.for_config(config)
    with running_server(create_app(client, keys=keys, options=ServerOptions())) as url:
        yield url, tmp_path / "server"
    keys.close()


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    def call(*argv: str) -> Ran:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return call


def test_commands_through_a_server_with_a_scoped_key(
    server: tuple[str, Path], run: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, data_dir = server
    key = run("keys", "create", "maya", "--user", "maya", "--data-dir", str(data_dir), "--json").json()["key"]
    remote = ("--host", url, "--api-key", key)
    added = [run("add", fact, "--user", "maya", "--no-infer", *remote, "--json") for fact in FACTS]
    assert all(a.code == 0 for a in added), [a.err for a in added]
    ids = [a.json()["results"][0]["id"] for a in added]

    reference: Any = MemoryClient(host=url, api_key=key)
    try:
        assert run("list", "--user", "maya", *remote, "--json").json() == reference.get_all(user_id="maya")
        search = run("search", "Where do I live?", "--user", "maya", "--limit", "1", *remote, "--json").json()
        assert search == reference.search("Where do I live?", user_id="maya", limit=1)
        assert run("history", ids[0], "--user", "maya", *remote, "--json").json() == reference.history(ids[0])
    finally:
        reference.close()

    table = run("list", "--user", "maya", *remote)
    assert all(any(i in line and f in line for line in table.out.splitlines()) for i, f in zip(ids, FACTS, strict=True))

    monkeypatch.setenv("INFERSCALE_API_KEY", key)  # the remote client's default key
    streamed = run("chat", "What is my dog called?", "--user", "maya", "--host", url, "--stream", "--json")
    assert streamed.code == 0, streamed.err
    chunks = [json.loads(line) for line in streamed.out.splitlines()]
    final = chunks[-1]["result"]
    assert "".join(c["delta"] for c in chunks) == final["answer"] and set(final["memory_ids"]) <= set(ids)

    deleted = run("delete", ids[0], "--user", "maya", "--host", url, "--json")
    assert deleted.json() == {"message": "Memory deleted successfully!"}


def test_the_servers_refusals_are_one_line_exit_1(server: tuple[str, Path], run: Callable[..., Ran]) -> None:
    url, data_dir = server
    key = run("keys", "create", "maya", "--user", "maya", "--data-dir", str(data_dir), "--json").json()["key"]
    other = run("list", "--user", "bob", "--host", url, "--api-key", key)  # outside the key's scope
    wrong = run("list", "--user", "maya", "--host", url, "--api-key", key[:-2] + "xx")  # not the key
    for ran, word in ((other, "bob"), (wrong, "key")):
        assert ran.code == 1 and ran.out == ""
        assert ran.err.startswith("error: ") and ran.err.count("\n") == 1 and word in ran.err, ran.err


def test_delete_all_without_a_scope_flag_is_refused_with_a_bound_key_too(
    server: tuple[str, Path], run: Callable[..., Ran]
) -> None:
    """docs/cli.md: ``delete --all`` is refused without a scope flag (the key's user is not filled in); ``list``
    without one says where its scope came from, never "no scope"."""
    url, data_dir = server
    key = run("keys", "create", "maya", "--user", "maya", "--data-dir", str(data_dir), "--json").json()["key"]
    remote = ("--host", url, "--api-key", key)
    assert run("add", FACTS[0], "--no-infer", *remote).code == 0
    refused = run("delete", "--all", *remote)
    assert refused.code != 0 and refused.out == "" and "user_id, agent_id or run_id" in refused.err, refused
    listed = run("list", *remote)
    assert listed.code == 0 and "1 memory of the scope of the --filters or API key" in listed.out, listed
    assert "no scope" not in listed.out
    deleted = run("delete", "--all", "--user", "maya", *remote)
    assert deleted.code == 0 and "deleted 1 memory of user=maya" in deleted.out, deleted
