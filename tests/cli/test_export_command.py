"""``inferscale export DIR``: a local store's memories and history as JSON that ``import-mem0`` reads back into
another store (SQLite to PostgreSQL, say), with ids, scopes, metadata, times and history; there was no way to move a
store with its history (portability tester)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cli_runner import Fakes, Ran
from mem0_fakes import HashEmbedder

from inferscale import MemoryClient

FIELDS = ("id", "memory", "metadata", "created_at", "updated_at", "user_id", "agent_id", "run_id")


def _fill(client: MemoryClient) -> None:
    car = client.add("I drive a blue Volvo.", user_id="maya", metadata={"topic": "cars"}, infer=False)
    client.update(car["results"][0]["id"], "I drive a red Volvo now.")
    client.add("I like tea.", user_id="maya", agent_id="helper", infer=False)
    gone = client.add("I hate mornings.", user_id="ben", infer=False)
    client.delete(gone["results"][0]["id"])
    client.add("I play the cello.", user_id="ben", run_id="r1", infer=False)


def _state(client: MemoryClient, user: str) -> list[tuple[object, ...]]:
    found = client.get_all(user_id=user)["results"]
    return [
        (*(m.get(k) for k in FIELDS), tuple(tuple(sorted(h.items())) for h in client.history(m["id"]))) for m in found
    ]


def test_an_export_imports_into_another_store_as_it_was(
    cli: Callable[..., Ran], fakes: Fakes, tmp_path: Path, db_url: str
) -> None:
    source = fakes.client()
    _fill(source)
    before = {user: _state(source, user) for user in ("maya", "ben")}
    source.close()
    out = tmp_path / "export"
    ran = cli("export", str(out), "--json")
    assert ran.code == 0, ran.err
    assert ran.json() == {"memories": 3, "history_rows": 4, "folder": str(out)}  # the deleted memory stays behind
    target = tmp_path / "target"
    moved = cli(
        "import-mem0",
        str(out / "memories.json"),
        "--history",
        str(out / "history.json"),
        "--db-url",
        db_url,
        "--data-dir",
        str(target),
        "--no-encode-kv",
        local=False,
    )
    assert moved.code == 0, moved.err
    with MemoryClient({"db_url": db_url, "data_dir": str(target)}, embedder=HashEmbedder()) as other:
        assert {user: _state(other, user) for user in ("maya", "ben")} == before


def test_export_with_a_scope_flag_writes_that_scope_and_never_overwrites(
    cli: Callable[..., Ran], fakes: Fakes, tmp_path: Path
) -> None:
    source = fakes.client()
    _fill(source)
    source.close()
    out = tmp_path / "export"
    ran = cli("export", str(out), "--user", "ben")
    assert ran.code == 0, ran.err
    assert "exported 1 memory (user=ben) and 1 history row" in ran.out
    assert [m["memory"] for m in json.loads((out / "memories.json").read_text())] == ["I play the cello."]
    again = cli("export", str(out))
    assert again.code == 2 and "holds memories.json, history.json already" in again.err
    assert [m["memory"] for m in json.loads((out / "memories.json").read_text())] == ["I play the cello."]
