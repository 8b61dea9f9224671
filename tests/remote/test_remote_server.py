"""The remote clients on a real server with API keys (uvicorn on 127.0.0.1, a free port): the key travels as Mem0's
``Authorization: Token`` header, a key bound to one user sees only that user's memories, and the Mem0 quickstart
runs unchanged with only the host added."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config

pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install 'inferscale-memory[server]')")

from server_fixture import running_server

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.errors import (
    AuthenticationError,
    InvalidInputError,
    MemoryNotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ScopeError,
)
from inferscale.server.app import create_app
from inferscale.server.keys import KeyStore
from inferscale.server.options import ServerOptions

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "migrate_from_mem0.py"


class Keyed:
    """A server with two keys: ``admin`` and ``alice`` (bound to user_id "alice")."""

    def __init__(self, url: str, admin: str, alice: str) -> None:
        self.url, self.admin, self.alice = url, admin, alice


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Keyed]:
    monkeypatch.delenv("INFERSCALE_API_KEY", raising=False)
    config = fake_config(tmp_path)
    keys = KeyStore.for_config(config)
    _, admin = keys.create("admin", admin=True)
    _, alice = keys.create("alice", user_ids=["alice"])
    served = AsyncMemoryClient(config, embedder=HashEmbedder(), generator=ScriptedGenerator())
    try:
        with running_server(create_app(served, keys=keys, options=ServerOptions())) as url:
            yield Keyed(url, admin, alice)
    finally:
        keys.close()


def test_the_key_is_sent_and_its_scopes_answer_ping(keyed: Keyed, monkeypatch: pytest.MonkeyPatch) -> None:
    with MemoryClient(host=keyed.url, api_key=keyed.alice) as alice:
        assert alice.ping() == {
            "status": "ok",
            "admin": False,
            "scopes": {"user_ids": ["alice"], "agent_ids": None, "run_ids": None},
        }
    monkeypatch.setenv("INFERSCALE_API_KEY", keyed.admin)
    with MemoryClient(host=keyed.url) as admin:  # the key from the environment
        assert admin.ping()["admin"] is True


@pytest.mark.parametrize("api_key", [None, "isk_000000000000_wrong"], ids=["no-key", "unknown-key"])
def test_a_missing_or_unknown_key_is_an_authentication_error(keyed: Keyed, api_key: str | None) -> None:
    with MemoryClient(host=keyed.url, api_key=api_key) as client:
        for call in (client.ping, lambda: client.get_all(user_id="alice"), lambda: client.add("x", user_id="a")):
            with pytest.raises(AuthenticationError):
                call()


def test_a_key_bound_to_alice_touches_only_alices_memories(keyed: Keyed) -> None:
    with (
        MemoryClient(host=keyed.url, api_key=keyed.admin) as admin,
        MemoryClient(host=keyed.url, api_key=keyed.alice) as alice,
    ):
        bob = admin.add("Bob likes tennis", user_id="bob", infer=False)["results"][0]["id"]
        mine = alice.add("Alice likes chess", infer=False)["results"][0]  # the key's one user_id is the scope
        assert admin.get(mine["id"])["user_id"] == "alice"  # type: ignore[index]
        assert [r["memory"] for r in alice.search("likes", limit=5)["results"]] == ["Alice likes chess"]
        assert alice.get(bob) is None  # another user's memory does not exist for this key
        assert alice.history(bob) == []
        with pytest.raises(MemoryNotFoundError):
            alice.update(bob, "Alice wrote this")
        with pytest.raises(MemoryNotFoundError):
            alice.delete(bob)
        with pytest.raises(PermissionDeniedError):
            alice.get_all(user_id="bob")
        with pytest.raises(PermissionDeniedError):
            alice.reset()
        assert admin.get(bob)["memory"] == "Bob likes tennis"  # type: ignore[index]


def test_delete_all_needs_a_named_scope_even_with_a_key_bound_to_one_user(keyed: Keyed) -> None:
    """As in process (ScopeError, never "everything"): the key's one user is not filled in for delete_all."""
    with MemoryClient(host=keyed.url, api_key=keyed.alice) as alice:
        alice.add("Alice likes chess", infer=False)
        with pytest.raises(ScopeError, match="user_id, agent_id or run_id"):
            alice.delete_all()
        assert [m["memory"] for m in alice.get_all()["results"]] == ["Alice likes chess"]
        assert alice.delete_all(user_id="alice")["deleted"] == 1


@pytest.mark.parametrize("kind", ["local", "local-async", "remote", "remote-async"])
def test_add_accepts_mem0s_version_and_refuses_another(keyed: Keyed, tmp_path: Path, kind: str) -> None:
    """docs/migration.md: ``add(..., version="v2")`` (Mem0's platform scripts) is accepted and changes nothing; any
    other value is InvalidInputError, with nothing stored, on every client."""
    if kind.startswith("remote"):
        made: Any = (MemoryClient if kind == "remote" else AsyncMemoryClient)(host=keyed.url, api_key=keyed.admin)
    else:
        local = MemoryClient if kind == "local" else AsyncMemoryClient
        made = local(fake_config(tmp_path / "local"), embedder=HashEmbedder(), generator=ScriptedGenerator())

    async def scenario() -> list[str]:
        async def call(method: str, *args: Any, **kwargs: Any) -> Any:
            value = getattr(made, method)(*args, **kwargs)
            return await value if asyncio.iscoroutine(value) else value

        try:
            for version in ("v1", "v2", None):
                await call("add", f"fact {version}", user_id="vera", infer=False, version=version)
            with pytest.raises(InvalidInputError, match="version must be 'v1' or 'v2'"):
                await call("add", "fact v3", user_id="vera", infer=False, version="v3")
            return [m["memory"] for m in (await call("get_all", user_id="vera"))["results"]]
        finally:
            await call("close")

    assert asyncio.run(scenario()) == ["fact v1", "fact v2", "fact None"]


def test_the_async_remote_client_sends_the_key_too(keyed: Keyed) -> None:
    async def scenario() -> tuple[list[str], type[Exception]]:
        async with AsyncMemoryClient(host=keyed.url, api_key=keyed.alice) as alice:
            await alice.add("Alice likes go", infer=False)
            texts = [r["memory"] for r in (await alice.get_all())["results"]]
            try:
                await alice.reset()
            except PermissionDeniedError as exc:
                return texts, type(exc)
            raise AssertionError("reset with alice's key went through")

    assert asyncio.run(scenario()) == (["Alice likes go"], PermissionDeniedError)


def test_a_key_refused_for_a_flood_of_failed_checks_is_sent_again_after_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget of one failed key check per 2 s: a wrong key spends it, and alice's key, not verified yet, is
    answered 429 with ``Retry-After`` of at most 2 s. Without retries the remote client raises it with that wait;
    with them it waits and is answered, while the calls before it were refused before they ran (nothing was added
    twice)."""
    monkeypatch.delenv("INFERSCALE_API_KEY", raising=False)
    config = fake_config(tmp_path)
    options = ServerOptions(failed_key_checks_per_s=0.5, failed_key_check_burst=1)
    keys = KeyStore.for_config(config, options.key_check_limits)
    _, alice = keys.create("alice", user_ids=["alice"])
    served = AsyncMemoryClient(config, embedder=HashEmbedder(), generator=ScriptedGenerator())
    try:
        with running_server(create_app(served, keys=keys, options=options)) as url:
            wrong_key = f"isk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"  # well formed: it is checked
            with MemoryClient(host=url, api_key=wrong_key) as wrong, pytest.raises(AuthenticationError):
                wrong.ping()  # the one failed check the bucket held
            with MemoryClient(host=url, api_key=alice, retries=0) as once, pytest.raises(RateLimitedError) as refused:
                once.add("Alice likes go", infer=False)
            assert 1 <= refused.value.retry_after_s <= 2
            with MemoryClient(host=url, api_key=alice) as patient:
                patient.add("Alice likes go", infer=False)  # refused once more, then sent again after the wait
                assert [r["memory"] for r in patient.get_all()["results"]] == ["Alice likes go"]
    finally:
        keys.close()


def load_quickstart() -> Any:
    spec = importlib.util.spec_from_file_location("migrate_from_mem0", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.quickstart


def test_the_mem0_quickstart_runs_unchanged_on_a_remote_client(tmp_path: Path) -> None:
    """The same quickstart, the same fakes: on a local client, then with only ``host=`` added (a server without
    keys); the two runs see the same memories and events."""

    def generator() -> ScriptedGenerator:
        return ScriptedGenerator(
            facts=facts("Dislikes long strategy games", "Loves quick card games"), decisions=json.dumps({"memory": []})
        )

    quickstart = load_quickstart()
    local = MemoryClient(fake_config(tmp_path / "local"), embedder=HashEmbedder(), generator=generator())
    expected = quickstart(local)
    local.close()
    served = AsyncMemoryClient(fake_config(tmp_path / "served"), embedder=HashEmbedder(), generator=generator())
    with running_server(create_app(served, keys=None, options=ServerOptions())) as url, MemoryClient(host=url) as m:
        seen = quickstart(m)

    def without_ids(value: Any) -> Any:
        if isinstance(value, dict):
            volatile = {"id", "memory_id", "created_at", "updated_at", "score"}
            return {k: without_ids(v) for k, v in value.items() if k not in volatile}
        if isinstance(value, list):
            return [without_ids(v) for v in value]
        return value

    assert [r["event"] for r in seen["added"]] == ["ADD", "ADD"]
    assert without_ids(seen) == without_ids(expected)
    assert [h["event"] for h in seen["history"]] == ["ADD", "UPDATE"]
    assert seen["deleted_all"]["deleted"] == 1
