"""``inferscale prepare-kv`` on a real MemoryClient (fake models, K/V encoded lazily): it encodes what chats would
encode on first use, for the scope given or for every scope, and refuses a server (``--host``)."""

from __future__ import annotations

from collections.abc import Callable

from cli_runner import Ran

from inferscale import MemoryClient

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto."]


def _add(cli: Callable[..., Ran], user: str, facts: list[str]) -> list[str]:
    ids = []
    for fact in facts:
        ran = cli("add", fact, "--user", user, "--no-infer", "--json")
        assert ran.code == 0, ran.err
        ids += [r["id"] for r in ran.json()["results"]]
    return ids


def test_prepare_kv_json_reports_the_scope_then_every_scope(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    alice, bob = _add(cli, "alice", FACTS), _add(cli, "bob", FACTS[:1])
    ran = cli("prepare-kv", "--user", "alice", "--json")
    assert ran.code == 0, ran.err
    assert ran.json() == {"memories": 2, "encoded": 2, "left": []}
    assert reference().derived.missing_kv([*alice, *bob]) == bob
    ran = cli("prepare-kv", "--json")
    assert ran.json() == {"memories": 3, "encoded": 1, "left": []}


def test_prepare_kv_table_names_the_counts_and_the_scope(cli: Callable[..., Ran]) -> None:
    _add(cli, "alice", FACTS)
    ran = cli("prepare-kv", "--user", "alice")
    assert ran.code == 0, ran.err
    assert "encoded the K/V of 2 memories (2 memories of user=alice)" in ran.out
    assert "encoded the K/V of 0 memories (2 memories of every scope)" in cli("prepare-kv").out


def test_prepare_kv_refuses_a_server(cli: Callable[..., Ran]) -> None:
    ran = cli("prepare-kv", "--host", "http://127.0.0.1:9", local=False)
    assert ran.code == 2
    assert "prepare-kv encodes into a local store" in ran.err
