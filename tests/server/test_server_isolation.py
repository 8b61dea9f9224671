"""A key bound to user alice cannot read, search, chat with, update, delete, list, see the history of or delete all
of user bob's memories, on any route, in any call shape (v1 ids, v2 filters, OR filters, explicit memory ids). Each
test checks bob's memories and their history are unchanged afterwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from server_harness import Served

BOB_FACTS = ["Bob's dog is a poodle named Rex.", "Bob lives in Lisbon."]
ALICE_FACTS = ["Alice's dog is a beagle named Biscuit.", "Alice lives in Porto."]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "What is my dog called?"}], "max_tokens": 2}


@dataclass
class Tenants:
    served: Served
    alice: httpx.Client
    bob_ids: list[str]
    alice_ids: list[str]
    admin: httpx.Client

    def bob_snapshot(self) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
        """Bob's memories and each one's history, read with the admin key."""
        memories = self.admin.get("/v1/memories/", params={"user_id": "bob"}).json()["results"]
        return memories, [self.admin.get(f"/v1/memories/{m}/history/").json() for m in self.bob_ids]


@pytest.fixture
def tenants(served: Served) -> Any:
    _, admin_key = served.keys.create("admin", admin=True)
    _, alice_key = served.keys.create("alice", user_ids=["alice"])
    _, bob_key = served.keys.create("bob", user_ids=["bob"])
    with served.http(admin_key) as admin, served.http(alice_key) as alice, served.http(bob_key) as bob:

        def add_all(http: httpx.Client, facts: list[str]) -> list[str]:
            return [
                http.post("/v1/memories/", json={"messages": f, "infer": False}).json()["results"][0]["id"]
                for f in facts
            ]

        bob_ids = add_all(bob, BOB_FACTS)  # the key's one user fills in user_id
        bob.put(f"/v1/memories/{bob_ids[0]}/", json={"metadata": {"pet": "dog"}}).raise_for_status()
        alice_ids = add_all(alice, ALICE_FACTS)
        yield Tenants(served, alice, bob_ids, alice_ids, admin)


def _code(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


# Each attempt on bob's memories: the request alice's key makes, and the reply it must get.
Attempt = Callable[[Tenants], httpx.Response]
REFUSED: dict[str, tuple[Attempt, tuple[int, str]]] = {
    "get": (lambda t: t.alice.get(f"/v1/memories/{t.bob_ids[0]}/"), (404, "memory_not_found")),
    "get naming bob": (
        lambda t: t.alice.get(f"/v1/memories/{t.bob_ids[0]}/", params={"user_id": "bob"}),
        (403, "permission_denied"),
    ),
    "update": (
        lambda t: t.alice.put(f"/v1/memories/{t.bob_ids[0]}/", json={"text": "Rex is a cat."}),
        (404, "memory_not_found"),
    ),
    "update naming alice": (
        lambda t: t.alice.put(f"/v1/memories/{t.bob_ids[0]}/", params={"user_id": "alice"}, json={"text": "x"}),
        (404, "memory_not_found"),
    ),
    "delete": (lambda t: t.alice.delete(f"/v1/memories/{t.bob_ids[0]}/"), (404, "memory_not_found")),
    "history": (lambda t: t.alice.get(f"/v1/memories/{t.bob_ids[0]}/history/"), (404, "memory_not_found")),
    "delete_all": (lambda t: t.alice.delete("/v1/memories/", params={"user_id": "bob"}), (403, "permission_denied")),
    "get_all v1": (lambda t: t.alice.get("/v1/memories/", params={"user_id": "bob"}), (403, "permission_denied")),
    "get_all v2 filters": (
        lambda t: t.alice.post("/v2/memories/", json={"filters": {"user_id": "bob"}}),
        (403, "permission_denied"),
    ),
    "get_all v2 AND filters": (
        lambda t: t.alice.post("/v2/memories/", json={"filters": {"AND": [{"user_id": "bob"}]}}),
        (403, "permission_denied"),
    ),
    "get_all v2 one-branch OR": (  # the parser reads a one-branch OR as its branch: bob is pinned
        lambda t: t.alice.post("/v2/memories/", json={"filters": {"OR": [{"user_id": "bob"}]}}),
        (403, "permission_denied"),
    ),
    "search v1": (
        lambda t: t.alice.post("/v1/memories/search/", json={"query": "dog", "user_id": "bob"}),
        (403, "permission_denied"),
    ),
    "search v2 filters": (
        lambda t: t.alice.post("/v2/memories/search/", json={"query": "dog", "filters": {"user_id": "bob"}}),
        (403, "permission_denied"),
    ),
    "add as bob": (
        lambda t: t.alice.post("/v1/memories/", json={"messages": "x", "user_id": "bob", "infer": False}),
        (403, "permission_denied"),
    ),
    "chat as OpenAI user bob": (
        lambda t: t.alice.post("/v1/chat/completions", json={**CHAT, "user": "bob"}),
        (403, "permission_denied"),
    ),
    "chat with inferscale.user_id bob": (
        lambda t: t.alice.post("/v1/chat/completions", json={**CHAT, "inferscale": {"user_id": "bob"}}),
        (403, "permission_denied"),
    ),
    "chat with bob's filters": (
        lambda t: t.alice.post("/v1/chat/completions", json={**CHAT, "inferscale": {"filters": {"user_id": "bob"}}}),
        (403, "permission_denied"),
    ),
    "chat injecting bob's memory": (
        lambda t: t.alice.post("/v1/chat/completions", json={**CHAT, "inferscale": {"memory_ids": t.bob_ids[:1]}}),
        (404, "memory_not_found"),
    ),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_alices_key_is_refused_on_bobs_memories(tenants: Tenants, name: str) -> None:
    attempt, expected = REFUSED[name]
    before = tenants.bob_snapshot()
    assert len(before[0]) == 2 and [len(h) for h in before[1]] == [2, 1]
    reply = attempt(tenants)
    assert _code(reply) == expected, reply.text
    assert "Bob" not in reply.text and "Rex" not in reply.text
    assert tenants.bob_snapshot() == before


# Calls that succeed for alice but whose OR / unbound filters name bob: they answer with alice's memories only.
ANSWERED: dict[str, Attempt] = {
    "search without a user": lambda t: t.alice.post("/v1/memories/search/", json={"query": "Bob dog Rex Lisbon"}),
    "search v2 OR bob": lambda t: t.alice.post(
        "/v2/memories/search/", json={"query": "dog", "filters": {"OR": [{"user_id": "bob"}, {"user_id": "alice"}]}}
    ),
    "search v2 NOT alice": lambda t: t.alice.post(
        "/v2/memories/search/", json={"query": "dog", "filters": {"NOT": [{"user_id": "alice"}]}}
    ),
    "get_all v2 OR bob": lambda t: t.alice.post(
        "/v2/memories/", json={"filters": {"OR": [{"user_id": "bob"}, {"agent_id": "x"}]}}
    ),
    "get_all v2 user wildcard": lambda t: t.alice.post("/v2/memories/", json={"filters": {"user_id": "*"}}),
    "get_all v2 user in list": lambda t: t.alice.post(
        "/v2/memories/", json={"filters": {"user_id": {"in": ["bob", "alice"]}}}
    ),
    "get_all v1 without a user": lambda t: t.alice.get("/v1/memories/"),
}


@pytest.mark.parametrize("name", list(ANSWERED))
def test_filters_that_name_bob_answer_with_alices_memories_only(tenants: Tenants, name: str) -> None:
    before = tenants.bob_snapshot()
    reply = ANSWERED[name](tenants)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    assert {r["id"] for r in results} <= set(tenants.alice_ids)
    assert all(r["user_id"] == "alice" for r in results)
    assert tenants.bob_snapshot() == before


def test_a_chat_with_an_or_filter_naming_bob_injects_alices_memories_only(tenants: Tenants) -> None:
    before = tenants.bob_snapshot()
    options = {"filters": {"OR": [{"user_id": "bob"}, {"user_id": "alice"}]}, "limit": 10}
    reply = tenants.alice.post("/v1/chat/completions", json={**CHAT, "inferscale": options})
    assert reply.status_code == 200, reply.text
    assert sorted(reply.json()["inferscale"]["memory_ids"]) == sorted(tenants.alice_ids)
    reply = tenants.alice.post("/v1/chat/completions", json={**CHAT, "inferscale": {"limit": 10}})
    assert sorted(reply.json()["inferscale"]["memory_ids"]) == sorted(tenants.alice_ids)
    assert tenants.bob_snapshot() == before


def test_alice_still_reaches_her_own_memories_on_every_route(tenants: Tenants) -> None:
    alice, mine = tenants.alice, tenants.alice_ids[0]
    assert alice.get(f"/v1/memories/{mine}/").json()["memory"] == ALICE_FACTS[0]
    assert alice.put(f"/v1/memories/{mine}/", json={"text": "Biscuit is a beagle."}).status_code == 200
    assert [h["event"] for h in alice.get(f"/v1/memories/{mine}/history/").json()] == ["ADD", "UPDATE"]
    assert alice.delete(f"/v1/memories/{mine}/").status_code == 200
    assert alice.delete("/v1/memories/").json()["error"]["code"] == "scope_required"  # never the key's whole scope
    assert alice.delete("/v1/memories/", params={"user_id": "alice"}).json()["deleted"] == 1
    assert tenants.served.row_counts()[0] == 2  # bob's two


def test_a_key_bound_to_several_users_must_name_one(tenants: Tenants) -> None:
    _, both = tenants.served.keys.create("both", user_ids=["alice", "bob"])
    with tenants.served.http(both) as http:
        assert _code(http.get("/v1/memories/")) == (403, "permission_denied")
        assert len(http.get("/v1/memories/", params={"user_id": "bob"}).json()["results"]) == 2
        assert _code(http.get("/v1/memories/", params={"user_id": "carol"})) == (403, "permission_denied")


def test_a_key_bound_to_an_agent_leaves_the_user_free_within_that_agent(tenants: Tenants) -> None:
    _, travel = tenants.served.keys.create("travel agent", agent_ids=["travel"])
    with tenants.served.http(travel) as http:
        added = http.post("/v1/memories/", json={"messages": "Bob flies Monday.", "user_id": "bob", "infer": False})
        assert added.json()["results"][0]["memory"] == "Bob flies Monday."
        stored = tenants.admin.get("/v1/memories/", params={"user_id": "bob", "agent_id": "travel"}).json()
        assert [(m["memory"], m["agent_id"]) for m in stored["results"]] == [("Bob flies Monday.", "travel")]
        # bob's memories outside the agent are out of reach, by id or by listing
        assert _code(http.get(f"/v1/memories/{tenants.bob_ids[0]}/")) == (404, "memory_not_found")
        listed = http.get("/v1/memories/", params={"user_id": "bob"}).json()["results"]
        assert [m["memory"] for m in listed] == ["Bob flies Monday."]


def test_a_deleted_memorys_history_answers_as_the_local_client_does(tenants: Tenants) -> None:
    """The ADD ... DELETE rows stay readable after the deletion: by an admin key (no bound list), as the local client
    and an open server give them, and by a key bound to the memory's user, whose scope the rows record; a key bound
    to another user gets 404, the remote client's ``[]`` (as for a live memory of alice's)."""
    from inferscale import MemoryClient

    mine = tenants.alice_ids[0]
    assert tenants.alice.delete(f"/v1/memories/{mine}/").status_code == 200
    admin = tenants.admin.get(f"/v1/memories/{mine}/history/")
    assert admin.status_code == 200, admin.text
    assert [(h["event"], h["memory_id"], h["user_id"]) for h in admin.json()] == [
        ("ADD", mine, "alice"),
        ("DELETE", mine, "alice"),
    ]
    assert tenants.alice.get(f"/v1/memories/{mine}/history/").json() == admin.json()
    served = tenants.served
    _, alice_key = served.keys.create("alice again", user_ids=["alice"])
    _, bob_key = served.keys.create("bob again", user_ids=["bob"])
    _, admin_key = served.keys.create("admin again", admin=True)
    with MemoryClient(host=served.url, api_key=admin_key) as remote_admin:
        assert remote_admin.history(mine) == admin.json()
    with MemoryClient(host=served.url, api_key=alice_key) as remote_alice:
        assert remote_alice.history(mine) == admin.json() == remote_alice.history(mine, user_id="alice")
    with MemoryClient(host=served.url, api_key=bob_key) as remote_bob:
        assert remote_bob.history(mine) == [] == remote_bob.history(mine, user_id="bob")
    # an admin key changes nothing else: a missing memory is still 404 on get, update and delete
    for reply in (
        tenants.admin.get(f"/v1/memories/{mine}/"),
        tenants.admin.put(f"/v1/memories/{mine}/", json={"text": "x"}),
        tenants.admin.delete(f"/v1/memories/{mine}/"),
    ):
        assert _code(reply) == (404, "memory_not_found"), reply.text


def test_history_rows_of_unknown_scope_are_read_by_an_unbound_key_only(tenants: Tenants) -> None:
    """Rows that recorded no scope and whose memory is gone (deleted before the store recorded scopes, revision
    0004_history_scope) lie outside every bound key's lists: 404 for alice's key, the rows for the admin key; a live
    memory's rows that recorded none take its scope, so alice's key reads those of her memory."""
    from sqlalchemy import create_engine, insert

    from inferscale.storage.models import HistoryRow, utc_now

    mine = tenants.alice_ids[0]
    sql = create_engine(tenants.served.config.database_url())
    try:
        with sql.begin() as conn:
            for memory_id, event in (("m-gone-before-0004", "ADD"), ("m-gone-before-0004", "DELETE"), (mine, "UPDATE")):
                conn.execute(insert(HistoryRow).values(memory_id=memory_id, event=event, created_at=utc_now()))
    finally:
        sql.dispose()
    assert _code(tenants.alice.get("/v1/memories/m-gone-before-0004/history/")) == (404, "memory_not_found")
    admin = tenants.admin.get("/v1/memories/m-gone-before-0004/history/").json()
    assert [(h["event"], h.get("user_id")) for h in admin] == [("ADD", None), ("DELETE", None)]
    own = tenants.alice.get(f"/v1/memories/{mine}/history/").json()
    assert [(h["event"], h["user_id"]) for h in own] == [("ADD", "alice"), ("UPDATE", "alice")]
