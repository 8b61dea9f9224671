"""Mem0 parity of both clients with fakes (no model loads): call shapes v1 and v2, update/delete/history,
scoping, reset and filters (add with inference is in test_add_inference.py). Every test runs on MemoryClient and
AsyncMemoryClient (through ``client_adapter``), each on SQLite and on PostgreSQL."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from client_adapter import ClientAdapter, MakeClient
from mem0_fakes import fake_config

from inferscale.config import KVConfig, MemoryConfig
from inferscale.errors import InvalidInputError, MemoryNotFoundError, ScopeError
from inferscale.scope import Scope
from inferscale.storage.records import history_public_id


def texts(results: dict[str, list[dict[str, object]]]) -> list[object]:
    return [r["memory"] for r in results["results"]]


# ---- call shapes -------------------------------------------------------------------------------------------


def test_v1_and_v2_call_shapes_agree(m: ClientAdapter) -> None:
    m.add("I like chess", user_id="alice", agent_id="coach", infer=False)
    m.add("I like tennis", user_id="alice", infer=False)
    m.add("I like chess too", user_id="bob", infer=False)

    v1 = m.search("chess", user_id="alice", limit=1)
    v2 = m.search("chess", filters={"user_id": "alice"}, top_k=1)
    v2_and = m.search("chess", filters={"AND": [{"user_id": "alice"}]}, top_k=1, version="v2")
    assert texts(v1) == texts(v2) == texts(v2_and) == ["I like chess"]
    assert {r["user_id"] for r in m.search("like", filters={"user_id": "alice"})["results"]} == {"alice"}

    assert texts(m.get_all(user_id="alice")) == ["I like chess", "I like tennis"]
    assert texts(m.get_all(filters={"user_id": "alice"})) == ["I like chess", "I like tennis"]
    assert texts(m.get_all(filters={"AND": [{"user_id": "alice"}, {"agent_id": "coach"}]})) == ["I like chess"]
    assert texts(m.get_all(user_id="alice", agent_id="coach")) == ["I like chess"]
    assert texts(m.get_all(user_id="alice", limit=1)) == ["I like chess"]
    assert texts(m.get_all(filters={"user_id": "alice"}, top_k=1)) == ["I like chess"]
    # The same id given both ways is fine; different values are refused.
    assert len(m.get_all(user_id="alice", filters={"user_id": "alice"})["results"]) == 2
    with pytest.raises(InvalidInputError, match="disagrees"):
        m.search("chess", user_id="alice", filters={"user_id": "bob"})
    with pytest.raises(InvalidInputError, match="top_k"):
        m.search("chess", user_id="alice", limit=1, top_k=2)
    with pytest.raises(InvalidInputError, match="version"):
        m.get_all(user_id="alice", version="v3")


def test_every_read_and_write_needs_an_id(m: ClientAdapter) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    with pytest.raises(ScopeError):
        m.add("Likes chess", infer=False)
    with pytest.raises(ScopeError):
        m.search("chess")
    with pytest.raises(ScopeError):
        m.get_all()
    # An id only under OR, or a wildcard, pins no scope.
    with pytest.raises(ScopeError):
        m.get_all(filters={"OR": [{"user_id": "alice"}, {"user_id": "bob"}]})
    with pytest.raises(ScopeError):
        m.search("chess", filters={"user_id": "*"})
    with pytest.raises(ScopeError):
        m.delete_all()
    assert len(m.get_all(user_id="alice")["results"]) == 1


def test_metadata_can_never_set_an_id(m: ClientAdapter) -> None:
    for key in ("user_id", "agent_id", "run_id"):
        with pytest.raises(InvalidInputError, match=key):
            m.add("Likes chess", user_id="alice", metadata={key: "mallory"}, infer=False)
    memory_id = m.add("Likes chess", user_id="alice", metadata={"topic": "games"}, infer=False)["results"][0]["id"]
    with pytest.raises(InvalidInputError, match="user_id"):
        m.update(memory_id, metadata={"user_id": "mallory"})
    stored = m.get(memory_id)
    assert stored is not None
    assert stored["user_id"] == "alice" and (stored["metadata"], stored["role"]) == ({"topic": "games"}, "user")


def test_role_and_actor_id_are_top_level_keys_as_in_mem0(m: ClientAdapter) -> None:
    """The failing inputs of a tester's report: Mem0 code reads ``item["role"]`` and filters on ``actor_id``; here
    ``role`` sat inside ``metadata``, a message's ``name`` was on no memory, a ``metadata={"role": ...}`` replaced the
    message's role, and a metadata update dropped it. Now, as in Mem0: the message's role and speaker name
    (``actor_id``) are stored with a verbatim memory, shown beside the scope ids and not in ``metadata``, win over
    the same keys in the call's metadata, and survive a metadata update that does not name them."""
    messages = [
        {"role": "user", "content": "I prefer window seats.", "name": "Maya"},
        {"role": "assistant", "content": "Window seats noted."},
    ]
    said, answered = m.add(messages, user_id="alice", metadata={"topic": "travel"}, infer=False)["results"]
    got = m.get(said["id"])
    assert got is not None
    assert (got["role"], got["actor_id"], got["metadata"]) == ("user", "Maya", {"topic": "travel"})
    got = m.get(answered["id"])
    assert got is not None and (got["role"], got["metadata"]) == ("assistant", {"topic": "travel"})
    assert "actor_id" not in got
    assert [r["id"] for r in m.get_all(user_id="alice", filters={"actor_id": "Maya"})["results"]] == [said["id"]]
    assert [r["id"] for r in m.get_all(user_id="alice", filters={"role": "assistant"})["results"]] == [answered["id"]]
    found = m.search("window seats", user_id="alice", filters={"actor_id": "Maya"})["results"]
    assert [(r["id"], r["role"], r["actor_id"]) for r in found] == [(said["id"], "user", "Maya")]

    admin = m.add("meta role key", user_id="alice", metadata={"role": "admin"}, infer=False)["results"][0]
    got = m.get(admin["id"])
    assert got is not None and (got["role"], got["metadata"]) == ("user", {})  # the message's role wins

    m.update(said["id"], metadata={"topic": "flights"})
    got = m.get(said["id"])
    assert got is not None
    assert (got["role"], got["actor_id"], got["metadata"]) == ("user", "Maya", {"topic": "flights"})
    m.update(said["id"], metadata={"role": "assistant"})  # named: replaced, the other keys kept (Mem0 merges)
    got = m.get(said["id"])
    assert got is not None
    assert (got["role"], got["actor_id"], got["metadata"]) == ("assistant", "Maya", {"topic": "flights"})


def test_a_metadata_update_merges_into_the_stored_metadata_as_mem0s(m: ClientAdapter) -> None:
    """It replaced the whole dict: a migrated app that updated one key lost the others (Mem0 2.2.1 sets the given
    keys over the stored payload)."""
    memory_id = m.add("Rex", user_id="alice", metadata={"category": "pets", "priority": 2}, infer=False)["results"][0]
    m.update(memory_id["id"], metadata={"priority": 5, "seen": True})
    got = m.get(memory_id["id"])
    assert got is not None and got["metadata"] == {"category": "pets", "priority": 5, "seen": True}
    assert [h["event"] for h in m.history(memory_id["id"])] == ["ADD", "UPDATE"]
    m.update(memory_id["id"], metadata={"priority": 5})  # nothing changes: no history row
    assert len(m.history(memory_id["id"])) == 2


def test_metadata_may_not_set_the_speaker(m: ClientAdapter) -> None:
    """``actor_id`` came from metadata as it does from a message's name: a caller could store a memory as said by
    someone else (Mem0 drops it from metadata). It is refused, and nothing is written or changed."""
    said = m.add([{"role": "user", "name": "Maya", "content": "I like tea."}], user_id="alice", infer=False)
    memory_id = said["results"][0]["id"]
    with pytest.raises(InvalidInputError, match="actor_id"):
        m.add("I like coffee.", user_id="alice", metadata={"actor_id": "mallory"}, infer=False)
    with pytest.raises(InvalidInputError, match="actor_id"):
        m.update(memory_id, metadata={"actor_id": "mallory"})
    got = m.get(memory_id)
    assert got is not None and got["actor_id"] == "Maya"
    assert [r["memory"] for r in m.get_all(user_id="alice")["results"]] == ["I like tea."]


def test_history_ids_are_uuids_that_tell_nothing_of_other_tenants_writes(m: ClientAdapter, db_url: str) -> None:
    """A security helper's report: a history row's id was the table's integer key, one counter over every tenant
    (bob's row "11", then alice's "12"): the gaps between a user's own ids showed how much everyone else wrote. The id
    is now a UUID, as Mem0's, made from what the row shows (its memory, event and time): the same on every read,
    whatever other memories saw meanwhile, and after other rows of the memory are deleted (a retention or erasure
    job in SQL: docs/api.md)."""
    alice = m.add("Alice likes tea.", user_id="alice", infer=False)["results"][0]["id"]
    first = [h["id"] for h in m.history(alice)]
    for i in range(3):
        m.add(f"Bob's note {i}", user_id="bob", infer=False)
    m.update(alice, text="Alice likes green tea.")
    m.update(alice, text="Alice likes mint tea.")
    rows = m.history(alice)
    ids = [h["id"] for h in rows]
    assert ids[:1] == first and len(set(ids)) == 3
    made = [history_public_id(alice, h["event"], datetime.fromisoformat(h["created_at"])) for h in rows]
    assert ids == made and all(str(uuid.UUID(i)) == i for i in ids)
    engine = sqlalchemy.create_engine(db_url)
    with engine.begin() as conn:  # the first UPDATE row is purged
        oldest_update = min(
            conn.execute(sqlalchemy.text("SELECT id FROM memory_history WHERE event = 'UPDATE'")).scalars()
        )
        conn.execute(sqlalchemy.text("DELETE FROM memory_history WHERE id = :id"), {"id": oldest_update})
    engine.dispose()
    assert [h["id"] for h in m.history(alice)] == [ids[0], ids[2]]


def test_the_hash_is_mem0s_md5_of_the_text(m: ClientAdapter) -> None:
    """Mem0 code that recomputes a memory's ``hash`` (``hashlib.md5(text.encode()).hexdigest()``) finds it equal."""
    added = m.add("Likes chess 😀", user_id="alice", infer=False)["results"][0]
    expected = hashlib.md5("Likes chess 😀".encode(), usedforsecurity=False).hexdigest()
    assert m.get(added["id"])["hash"] == expected  # type: ignore[index]
    assert [r["hash"] for r in m.get_all(user_id="alice")["results"]] == [expected]
    assert [r["hash"] for r in m.search("chess", user_id="alice")["results"]] == [expected]


def test_an_unknown_id_is_a_value_error_as_in_mem0(m: ClientAdapter) -> None:
    """Mem0's update and delete raise ValueError for an unknown id; migrated ``except ValueError`` code missed
    MemoryNotFoundError, a KeyError only (on every client, the remote ones included)."""
    for call in (lambda: m.update("no-such-id", "x"), lambda: m.delete("no-such-id")):
        with pytest.raises(ValueError, match="no-such-id") as raised:
            call()
        assert isinstance(raised.value, MemoryNotFoundError) and isinstance(raised.value, KeyError)


def test_id_addressed_calls_can_be_scoped(m: ClientAdapter) -> None:
    bob = m.add("Bob likes tennis", user_id="bob", infer=False)["results"][0]["id"]
    assert m.get(bob, user_id="alice") is None
    assert m.get(bob, user_id="bob")["memory"] == "Bob likes tennis"  # type: ignore[index]
    with pytest.raises(MemoryNotFoundError):
        m.update(bob, "Alice wrote this", user_id="alice")
    with pytest.raises(MemoryNotFoundError):
        m.delete(bob, user_id="alice")
    assert m.history(bob, user_id="alice") == []
    assert [h["event"] for h in m.history(bob, user_id="bob")] == ["ADD"]
    assert m.get(bob)["memory"] == "Bob likes tennis"  # type: ignore[index]  # untouched by the refused calls
    m.update(bob, "Bob loves tennis", user_id="bob")
    m.delete(bob, user_id="bob")
    assert m.get(bob) is None


def test_an_id_with_a_slash_or_a_route_word_names_no_memory_on_every_client(m: ClientAdapter) -> None:
    """Over HTTP an escaped "/" is a path separator again once the server decodes the path ("<id>/history" reached
    that memory's history, "a/b" no route at all) and "search" is another route: every client answers as for any
    unknown id, and the memory whose id prefixes one is untouched."""
    kept = m.add("kept", user_id="a", infer=False)["results"][0]["id"]
    for bad in ("a/b", "search", kept + "/history", kept + "/"):
        assert m.get(bad) is None
        assert m.history(bad) == []
        with pytest.raises(MemoryNotFoundError):
            m.update(bad, "overwritten")
        with pytest.raises(InvalidInputError, match="text and data are two names"):
            m.update(bad, "overwritten", data="other")
        with pytest.raises(MemoryNotFoundError):
            m.delete(bad)
    assert m.get(kept)["memory"] == "kept"  # type: ignore[index]
    assert [h["event"] for h in m.history(kept)] == ["ADD"]


# ---- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.add("x", user_id="a", infer="no"), "infer"),
        (lambda m: m.add("\ud800 lone surrogate", user_id="a", infer=False), "Unicode"),
        (lambda m: m.search("\ud800", user_id="a"), "Unicode"),
        (lambda m: m.search("x", user_id="a", threshold="0.5"), "threshold"),
        (lambda m: m.get_all(user_id="a", limit=2**70), "at most"),
        (lambda m: m.chat("x", user_id="a", max_new_tokens=-1), "max_new_tokens"),
        (lambda m: m.chat("x", user_id="a", max_new_tokens=0), "max_new_tokens"),
        (lambda m: m.add("My favourite number is 42. " * 4000, user_id="a", infer=False), "max_memory_chars"),
    ],
)
def test_bad_input_gets_a_typed_error_and_loses_nothing(m: ClientAdapter, call: Any, match: str) -> None:
    m.add("kept", user_id="a", infer=False)
    with pytest.raises(InvalidInputError, match=match):
        call(m)
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["kept"]


def test_an_update_longer_than_max_memory_chars_is_refused_as_add_refuses_it(m: ClientAdapter) -> None:
    """The failing input of a bug: ``update`` stored a text of any length, which ``add(infer=False)`` refuses."""
    kept = m.add("kept", user_id="a", infer=False)["results"][0]["id"]
    too_long = "a" * (MemoryConfig().max_memory_chars + 1)
    with pytest.raises(InvalidInputError, match="max_memory_chars"):
        m.add(too_long, user_id="a", infer=False)
    for call in (lambda: m.update(kept, too_long), lambda: m.update(kept, data=too_long)):
        with pytest.raises(InvalidInputError, match=f"memory {kept!r} has 4,001 characters.*max_memory_chars=4,000"):
            call()
    assert m.get(kept)["memory"] == "kept"  # type: ignore[index]
    assert [h["event"] for h in m.history(kept)] == ["ADD"]
    m.update(kept, too_long[:-1])  # at the limit
    assert m.get(kept)["memory"] == too_long[:-1]  # type: ignore[index]


# ---- get / update / delete / history -----------------------------------------------------------------------


def test_api_round_trip(m: ClientAdapter) -> None:
    a = m.add("Likes chess", user_id="alice", metadata={"kind": "game"}, infer=False)["results"]
    m.add("Likes tennis", user_id="bob", infer=False)
    assert texts(m.search("chess", user_id="alice", limit=1)) == ["Likes chess"]
    assert texts(m.search("chess", filters={"user_id": "alice"}, top_k=1)) == ["Likes chess"]
    assert texts(m.get_all(filters={"AND": [{"user_id": "alice"}, {"kind": "game"}]})) == ["Likes chess"]
    assert m.get_all(user_id="alice", filters={"kind": "sport"})["results"] == []
    memory_id = a[0]["id"]
    assert m.get(memory_id)["memory"] == "Likes chess"  # type: ignore[index]
    m.update(memory_id, data="Likes chess and go")
    assert texts(m.search("go", user_id="alice", limit=1)) == ["Likes chess and go"]
    m.delete(memory_id)
    assert m.get(memory_id) is None
    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "DELETE"]
    assert rows[-1]["old_memory"] == "Likes chess and go"
    with pytest.raises(MemoryNotFoundError):
        m.delete(memory_id)
    with pytest.raises(ScopeError):
        m.delete_all()
    with pytest.raises(ScopeError):
        m.search("x")
    with pytest.raises(InvalidInputError):
        m.add("x", user_id="a", metadata={"agent_id": "g"}, infer=False)
    assert m.delete_all(user_id="bob")["deleted"] == 1
    m.reset()
    m.add("Likes go", user_id="alice", infer=False)
    assert texts(m.get_all(user_id="alice")) == ["Likes go"]


def test_add_update_delete_history(m: ClientAdapter) -> None:
    memory_id = m.add("Lives in Lisbon", user_id="alice", infer=False)["results"][0]["id"]
    got = m.get(memory_id)
    assert got is not None and got["memory"] == "Lives in Lisbon" and got["user_id"] == "alice"
    assert set(got) >= {"id", "memory", "hash", "metadata", "created_at", "updated_at", "user_id"}

    out = m.update(memory_id, "Lives in Porto")
    assert out["result"]["memory"] == "Lives in Porto" and "message" in out
    assert texts(m.search("Porto", user_id="alice")) == ["Lives in Porto"]
    m.update(memory_id, data="Lives in Porto, Portugal")  # Mem0's name for the text
    m.update(memory_id, metadata={"city": "Porto"})
    assert m.get(memory_id)["metadata"] == {"city": "Porto"}  # type: ignore[index]
    with pytest.raises(InvalidInputError):
        m.update(memory_id)
    with pytest.raises(InvalidInputError, match="text and data"):
        m.update(memory_id, text="a", data="b")
    with pytest.raises(MemoryNotFoundError):
        m.update("no-such-id", "x")

    assert m.delete(memory_id)["message"]
    assert m.get(memory_id) is None
    with pytest.raises(MemoryNotFoundError):
        m.delete(memory_id)

    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "UPDATE", "UPDATE", "DELETE"]
    stamps = [datetime.fromisoformat(r["created_at"]) for r in rows]
    assert stamps == sorted(stamps) and all(s.tzinfo is not None for s in stamps)
    assert rows[0]["old_memory"] is None and rows[0]["new_memory"] == "Lives in Lisbon"
    assert rows[1]["old_memory"] == "Lives in Lisbon" and rows[1]["new_memory"] == "Lives in Porto"
    assert rows[-1]["old_memory"] == "Lives in Porto, Portugal" and rows[-1]["new_memory"] is None
    assert rows[-1]["is_deleted"] is True
    assert m.history("never-existed") == []


def test_add_update_delete_gives_three_history_rows(m: ClientAdapter) -> None:
    memory_id = m.add("Drinks tea", user_id="u", infer=False)["results"][0]["id"]
    m.update(memory_id, "Drinks green tea")
    m.delete(memory_id)
    rows = m.history(memory_id)
    assert [r["event"] for r in rows] == ["ADD", "UPDATE", "DELETE"]
    assert [r["created_at"] for r in rows] == sorted(r["created_at"] for r in rows)
    assert rows[2]["old_memory"] == "Drinks green tea"


def test_delete_all_keeps_other_scopes(m: ClientAdapter) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    bob_id = m.add("Likes tennis", user_id="bob", infer=False)["results"][0]["id"]
    out = m.delete_all(user_id="alice")
    assert out["deleted"] == 1
    assert m.get_all(user_id="alice")["results"] == []
    assert texts(m.get_all(user_id="bob")) == ["Likes tennis"]
    bob = m.db.get(bob_id)
    assert bob is not None
    if m.kind == "sync":  # the async client has no public index
        assert bob.vector_id in set(m.index.ids().tolist())
    assert texts(m.search("tennis", user_id="bob")) == ["Likes tennis"]
    with pytest.raises(ScopeError):
        m.delete_all()
    assert texts(m.get_all(user_id="bob")) == ["Likes tennis"]


def test_reset_then_add_works(m: ClientAdapter) -> None:
    m.add("Likes chess", user_id="alice", infer=False)
    m.reset()
    assert m.get_all(user_id="alice")["results"] == []
    if m.kind == "sync":  # the async client has no public index
        assert len(m.index) == 0
    m.add("Likes go", user_id="alice", infer=False)
    assert texts(m.search("go", user_id="alice")) == ["Likes go"]


def test_filters_restrict_search_and_get_all(m: ClientAdapter) -> None:
    m.add("Rated the film", user_id="u", metadata={"score": 9, "kind": "film"}, infer=False)
    m.add("Rated the book", user_id="u", metadata={"score": 4, "kind": "book"}, infer=False)
    m.add("Rated the song", user_id="u", metadata={"kind": "song"}, infer=False)
    assert texts(m.search("rated", user_id="u", filters={"score": {"gte": 5}})) == ["Rated the film"]
    assert texts(m.get_all(user_id="u", filters={"kind": {"in": ["book", "song"]}})) == [
        "Rated the book",
        "Rated the song",
    ]
    assert texts(m.get_all(user_id="u", filters={"score": "*"})) == ["Rated the film", "Rated the book"]
    assert texts(m.get_all(user_id="u", filters={"NOT": [{"kind": "film"}]})) == ["Rated the book", "Rated the song"]
    assert texts(m.get_all(filters={"AND": [{"user_id": "u"}, {"OR": [{"kind": "song"}, {"score": {"lt": 5}}]}]})) == [
        "Rated the book",
        "Rated the song",
    ]
    assert texts(m.get_all(user_id="u", filters={"kind": {"icontains": "FIL"}})) == ["Rated the film"]
    assert texts(m.get_all(user_id="u", filters={"created_at": {"gte": "2000-01-01"}, "kind": {"ne": "book"}})) == [
        "Rated the film",
        "Rated the song",
    ]
    assert m.get_all(user_id="u", filters={"updated_at": {"lt": "2000-01-01"}})["results"] == []
    # timestamp operands as Python values, on every client kind (the remote client sends them as ISO 8601)
    since = {"gte": datetime(2000, 1, 1, tzinfo=UTC), "lt": date(2999, 1, 1)}
    assert texts(m.get_all(user_id="u", filters={"created_at": since, "kind": {"ne": "book"}})) == [
        "Rated the film",
        "Rated the song",
    ]
    assert m.get_all(user_id="u", filters={"created_at": {"lt": datetime(2000, 1, 1)}})["results"] == []
    with pytest.raises(InvalidInputError, match="unknown operator"):
        m.get_all(user_id="u", filters={"score": {"between": [1, 2]}})
    with pytest.raises(InvalidInputError, match="'in'"):
        m.get_all(user_id="u", filters={"kind": ["book"]})


@pytest.mark.parametrize("key", ["café", "名前", "ключ", "😀", 'we"ird\\', "a.b"])
def test_filters_on_non_ascii_and_awkward_metadata_keys(m: ClientAdapter, key: str) -> None:
    """Issue 15 item 5: SQLite found nothing for {"café": "Lumen"} (its JSON path missed the escaped key) and
    answered ne/NOT with the memory; every client on both backends answers as PostgreSQL did."""
    m.add("Favourite bakery is Lumen", user_id="u8", metadata={key: "Lumen"}, infer=False)
    m.add("Favourite cafe is Aster", user_id="u8", metadata={"other": "Lumen"}, infer=False)
    lumen, aster = ["Favourite bakery is Lumen"], ["Favourite cafe is Aster"]
    assert texts(m.get_all(user_id="u8", filters={key: "Lumen"})) == lumen
    assert texts(m.get_all(user_id="u8", filters={key: "*"})) == lumen
    assert texts(m.get_all(user_id="u8", filters={key: {"in": ["Lumen", "x"]}})) == lumen
    assert texts(m.get_all(user_id="u8", filters={key: {"icontains": "lum"}})) == lumen
    assert texts(m.get_all(user_id="u8", filters={key: {"ne": "Lumen"}})) == aster
    assert texts(m.get_all(user_id="u8", filters={"NOT": [{key: "Lumen"}]})) == aster
    assert texts(m.search("favourite bakery", user_id="u8", filters={key: "Lumen"})) == lumen


def test_a_message_added_alone_is_encoded_after_its_scopes_last_memories(
    make: MakeClient, tmp_path: Path, db_url: str
) -> None:
    """Context-window encoding for one-message adds: the new memory's context is the texts of the memories its
    scope stored last (kv.context_window of them, oldest first), frozen at add time; another scope's never."""
    m = make()
    for text in ("I have a beagle.", "I live in Porto.", "I play chess on Fridays."):
        m.add(text, user_id="maya", infer=False)
    m.add("I am a secret of another user.", user_id="noor", infer=False)
    m.add(
        [{"role": "user", "content": "My beagle is Biscuit."}, {"role": "user", "content": "Biscuit is three."}],
        user_id="maya",
        infer=False,
    )
    contexts = {r.text: r.context for r in m.db.list(Scope(user_id="maya"))}
    assert contexts["I have a beagle."] == []
    assert contexts["I live in Porto."] == ["I have a beagle."]
    earlier = ["I have a beagle.", "I live in Porto.", "I play chess on Fridays."]
    assert contexts["My beagle is Biscuit."] == earlier
    assert contexts["Biscuit is three."] == [*earlier, "My beagle is Biscuit."]
    assert m.db.list(Scope(user_id="noor"))[0].context == []

    config = fake_config(tmp_path / "narrow", db_url)
    narrow = make(config=config.model_copy(update={"kv": KVConfig(encode_on_add=False, context_window=1)}))
    narrow.add("First.", user_id="a", infer=False)
    narrow.add("Second.", user_id="a", infer=False)
    narrow.add("Third.", user_id="a", infer=False)
    assert [r.context for r in narrow.db.list(Scope(user_id="a"))] == [[], ["First."], ["Second."]]


AGENT_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "What's the weather in Porto?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 24C"},
    {"role": "assistant", "content": "It is sunny in Porto."},
    {"role": "user", "content": [{"type": "text", "text": "I am"}, {"type": "text", "text": "vegan."}]},
]


def test_a_verbatim_adds_results_carry_the_speaker_as_mem0s(m: ClientAdapter) -> None:
    """Mem0's ``add(infer=False)`` results carry each message's ``actor_id`` (``None`` without a name) and ``role``."""
    said = [{"role": "user", "name": "Maya", "content": "I like tea."}, {"role": "assistant", "content": "Noted."}]
    results = m.add(said, user_id="alice", infer=False)["results"]
    assert [(r["memory"], r["actor_id"], r["role"], r["event"]) for r in results] == [
        ("I like tea.", "Maya", "user", "ADD"),
        ("Noted.", None, "assistant", "ADD"),
    ]


def test_an_agents_conversation_with_tool_calls_is_added_as_mem0_adds_it(m: ClientAdapter) -> None:
    """The whole add was refused (a None content, the tool role, content parts), so an agent could not store its
    conversation: Mem0 skips the tool-call turn, stores the tool result and joins the text parts."""
    added = m.add(AGENT_TURNS, user_id="alice", infer=False)["results"]
    assert [r["memory"] for r in added] == [
        "What's the weather in Porto?",
        "Sunny, 24C",
        "It is sunny in Porto.",
        "I am vegan.",
    ]
    stored = {r["memory"]: r["role"] for r in m.get_all(user_id="alice")["results"]}
    assert stored["Sunny, 24C"] == "tool" and stored["I am vegan."] == "user"
    assert m.add(AGENT_TURNS[1:2], user_id="alice", infer=False) == {"results": []}  # nothing with text
    older = [
        {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": "{}"}},
        {"role": "function", "name": "weather", "content": "Rain in Lisbon"},
    ]
    assert [(r["memory"], r["role"]) for r in m.add(older, user_id="alice", infer=False)["results"]] == [
        ("Rain in Lisbon", "function")
    ]
    with pytest.raises(InvalidInputError, match=r"messages\[0\] has role 'bot'"):
        m.add([{"role": "bot", "content": "42"}], user_id="alice", infer=False)


def test_developer_instructions_and_empty_turns_are_left_out_of_a_verbatim_add(m: ClientAdapter) -> None:
    """A ``developer`` message (OpenAI's system role for its newer models) and a turn whose content is None made
    the whole add a refusal; the first is an instruction (not stored, as a system message), the second has nothing
    to store (Mem0 skips it)."""
    turns = [
        {"role": "developer", "content": "Answer in one sentence."},
        {"role": "user", "content": "I moved to Porto."},
        {"role": "assistant", "content": None},
    ]
    assert [(r["memory"], r["role"]) for r in m.add(turns, user_id="alice", infer=False)["results"]] == [
        ("I moved to Porto.", "user")
    ]
    assert [r["memory"] for r in m.get_all(user_id="alice")["results"]] == ["I moved to Porto."]
    assert m.add({"role": "user", "content": None}, user_id="alice", infer=False) == {"results": []}
