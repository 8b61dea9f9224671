"""An InferScale store moved to another database (SQLite to PostgreSQL, say) with `get_all` and `history()`:
`import_memories(history=...)` refused InferScale's own history rows by their `old_metadata`, `new_metadata` and
scope keys, so every memory started over at one ADD of its current text (portability tester)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, fake_config

from inferscale import MemoryClient
from inferscale.errors import InvalidInputError

HISTORY_FIELDS = ("id", "memory_id", "event", "old_memory", "new_memory", "old_metadata", "new_metadata", "actor_id")


def _history_shape(client: MemoryClient, memory_id: str) -> list[tuple[Any, ...]]:
    rows = client.history(memory_id)
    return [(*(row[k] for k in HISTORY_FIELDS), row.get("role"), row.get("user_id"), row["created_at"]) for row in rows]


def _source(tmp_path: Path) -> tuple[MemoryClient, list[dict[str, Any]], list[dict[str, Any]]]:
    source = MemoryClient(fake_config(tmp_path / "source"), embedder=HashEmbedder())
    said = source.add(
        [{"role": "user", "content": "I drive a blue Volvo.", "name": "maya"}],
        user_id="maya",
        metadata={"topic": "cars", "tags": ["ü", None, True]},
        infer=False,
    )
    car = said["results"][0]["id"]
    source.update(car, "I drive a red Volvo now.")
    source.update(car, metadata={"topic": "vehicles"})
    source.add("I like tea.", user_id="maya", agent_id="helper", infer=False)
    records = [*source.get_all(user_id="maya")["results"]]
    rows = [row for record in records for row in source.history(record["id"])]
    return source, records, rows


def test_a_store_moves_to_another_database_with_its_history(tmp_path: Path, db_url: str) -> None:
    source, records, rows = _source(tmp_path)
    with MemoryClient(fake_config(tmp_path / "target", db_url), embedder=HashEmbedder()) as target:
        result = target.import_memories(records, history=rows)
        assert len(result["results"]) == len(records) and result["skipped"] == []
        for record in records:
            assert _history_shape(target, record["id"]) == _history_shape(source, record["id"])
            moved = target.get(record["id"])
            assert moved is not None
            assert {k: moved[k] for k in ("memory", "metadata", "created_at", "updated_at")} == {
                k: record[k] for k in ("memory", "metadata", "created_at", "updated_at")
            }
    car = next(r for r in records if r["memory"] == "I drive a red Volvo now.")
    events = [(row["event"], row["new_memory"], row["new_metadata"]["topic"]) for row in source.history(car["id"])]
    assert events == [
        ("ADD", "I drive a blue Volvo.", "cars"),
        ("UPDATE", "I drive a red Volvo now.", "cars"),
        ("UPDATE", "I drive a red Volvo now.", "vehicles"),
    ]
    source.close()


@pytest.mark.parametrize("key", ["user_id", "agent_id"])
def test_a_history_row_of_another_scope_is_refused_by_name(tmp_path: Path, key: str) -> None:
    source, records, rows = _source(tmp_path)
    source.close()
    stray = {**rows[0], key: "somebody-else"}
    with MemoryClient(fake_config(tmp_path / "target"), embedder=HashEmbedder()) as target:
        with pytest.raises(InvalidInputError, match=f"history row 0 of memory .*its {key} is 'somebody-else'"):
            target.import_memories(records, history=[stray, *rows[1:]])
        assert target.get_all(user_id="maya")["results"] == []  # refused before anything was written


def _last_row_of(rows: list[dict[str, Any]], memory_id: str) -> int:
    return max(i for i, row in enumerate(rows) if row["memory_id"] == memory_id)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ("last new_metadata", "a history ends at the metadata its memory has"),
        ("old_metadata not an object", "metadata must be a dict, got str"),
        ("old_metadata of another change", "its old_metadata .* is not what the change before it left"),
        ("old_metadata on an ADD", "its old_metadata .* is not what the change before it left"),
        ("role beside another in new_metadata", "its role is 'user', its new_metadata's 'assistant'"),
    ],
)
def test_history_rows_that_disagree_with_themselves_or_their_memory_are_refused(
    tmp_path: Path, change: str, refusal: str
) -> None:
    """Rows a review found accepted: the memory's metadata said one thing and its history's end another, an
    old_metadata that was no object or not the change before's, a role contradicting the row's own metadata."""
    source, records, rows = _source(tmp_path)
    source.close()
    car = next(r for r in records if r["memory"] == "I drive a red Volvo now.")
    first = next(i for i, row in enumerate(rows) if row["memory_id"] == car["id"])
    last = _last_row_of(rows, car["id"])
    edited = [dict(row) for row in rows]
    if change == "last new_metadata":
        edited[last]["new_metadata"] = {**edited[last]["new_metadata"], "topic": "boats"}
    elif change == "old_metadata not an object":
        edited[last]["old_metadata"] = "not a dict at all"
    elif change == "old_metadata of another change":
        edited[last]["old_metadata"] = {"topic": "boats"}
    elif change == "old_metadata on an ADD":
        edited[first]["old_metadata"] = {"topic": "cars"}
    else:
        assert edited[first]["role"] == "user"
        edited[first]["new_metadata"] = {**edited[first]["new_metadata"], "role": "assistant"}
    with MemoryClient(fake_config(tmp_path / "target"), embedder=HashEmbedder()) as target:
        with pytest.raises(InvalidInputError, match=refusal):
            target.import_memories(records, history=edited)
        assert target.get_all(user_id="maya")["results"] == []
