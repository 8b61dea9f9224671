"""A memory's history keeps its scope after the memory is deleted (schema revision 0004_history_scope).

It used to be read from the live row: once the memory was deleted, ``history(memory_id, user_id=...)`` answered
``[]`` to its own user, and a server key bound to that user got 404. Each history row now records the scope, so a
deleted memory's history is read under exactly the ids that would have found it alive, and under no others, on
every client kind and both backends. Its rows also carry the ``actor_id`` and ``role`` the memory was stored with on
every event, as Mem0's do (an UPDATE's and a DELETE's row had ``actor_id`` ``None``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from client_adapter import ClientKind, open_client
from mem0_fakes import HashEmbedder, fake_config

SCOPES = (
    {"user_id": "alice"},
    {"user_id": "alice", "agent_id": "travel"},
    {"agent_id": "travel"},
    {"user_id": "bob"},
)
"""The scopes memories are stored in: one memory each."""


def sees(query: dict[str, str], scope: dict[str, str]) -> bool:
    """Whether ``query``'s ids find a memory of ``scope`` (every id named equals the memory's)."""
    return all(scope.get(key) == value for key, value in query.items())


QUERIES = (
    {},
    {"user_id": "alice"},
    {"user_id": "bob"},
    {"agent_id": "travel"},
    {"user_id": "alice", "agent_id": "travel"},
    {"run_id": "r1"},
)


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_a_deleted_memorys_history_is_read_under_the_ids_that_found_it_alive(
    kind: ClientKind, db_url: str, tmp_path: Path
) -> None:
    c = open_client(kind, fake_config(tmp_path, db_url), embedder=HashEmbedder())
    try:
        ids = []
        for i, scope in enumerate(SCOPES):
            added = c.add(f"fact {i} of {sorted(scope.items())}", infer=False, **scope)
            ids.append(added["results"][0]["id"])
        alive = {(i, tuple(q.items())): c.history(i, **q) for i in ids for q in QUERIES}
        for memory_id in ids:
            c.delete(memory_id)
        for memory_id, scope in zip(ids, SCOPES, strict=True):
            for query in QUERIES:
                rows = c.history(memory_id, **query)
                expected = [("ADD", memory_id), ("DELETE", memory_id)] if sees(query, scope) else []
                assert [(h["event"], h["memory_id"]) for h in rows] == expected, (scope, query)
                assert [h["event"] for h in alive[memory_id, tuple(query.items())]] == [e for e, _ in expected[:1]]
                for row in rows:
                    assert {key: row.get(key) for key in ("user_id", "agent_id", "run_id") if key in row} == scope
    finally:
        c.close()


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_every_event_carries_the_actor_and_role_the_memory_was_stored_with(
    kind: ClientKind, db_url: str, tmp_path: Path
) -> None:
    c = open_client(kind, fake_config(tmp_path, db_url), embedder=HashEmbedder())
    try:
        added = c.add(
            [{"role": "user", "content": "I fly to Lisbon.", "name": "Maya"}, {"role": "assistant", "content": "Ok!"}],
            user_id="maya",
            infer=False,
        )
        said, reply = (r["id"] for r in added["results"])
        c.update(said, "I fly to Porto.")
        c.update(said, metadata={"trip": "spring"})
        c.delete(said)
        rows = c.history(said, user_id="maya")
        assert [(h["event"], h["actor_id"], h["role"]) for h in rows] == [
            ("ADD", "Maya", "user"),
            ("UPDATE", "Maya", "user"),
            ("UPDATE", "Maya", "user"),
            ("DELETE", "Maya", "user"),
        ]
        assert [(h["old_memory"], h["new_memory"]) for h in rows] == [
            (None, "I fly to Lisbon."),
            ("I fly to Lisbon.", "I fly to Porto."),
            ("I fly to Porto.", "I fly to Porto."),
            ("I fly to Porto.", None),
        ]
        # the assistant's turn had no name: no actor, as in Mem0 (not Maya, who made the change)
        assert [(h["event"], h["actor_id"], h["role"]) for h in c.history(reply)] == [("ADD", None, "assistant")]
    finally:
        c.close()


@pytest.mark.parametrize(
    ("old", "new", "shown"),
    [
        # an update of a store from before metadata updates kept the attribution (5 Dec 2026): the old side has it
        ({"role": "user", "actor_id": "alice"}, {"topic": "x"}, ("user", "alice")),
        # a row imported from Mem0: the change's own role and speaker, not the ones before it
        ({"role": "user", "actor_id": "alice"}, {"role": "assistant"}, ("assistant", None)),
        ({"role": "user", "actor_id": "alice"}, None, ("user", "alice")),  # a DELETE
    ],
)
def test_a_history_rows_role_and_speaker_come_from_its_metadata_after_the_change_where_it_names_them(
    old: dict[str, Any], new: dict[str, Any] | None, shown: tuple[str | None, str | None]
) -> None:
    from datetime import UTC, datetime

    from inferscale.results import history_to_dict
    from inferscale.scope import Scope
    from inferscale.storage import HistoryRecord

    event = "UPDATE" if new is not None else "DELETE"
    row = HistoryRecord(1, "h", "m", event, "a", "b", old, new, "the caller", Scope(user_id="u"), datetime.now(UTC))
    as_dict = history_to_dict(row)
    assert (as_dict["role"], as_dict["actor_id"]) == shown
