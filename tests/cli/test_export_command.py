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


def test_a_memory_changed_or_deleted_during_the_export_is_read_again_or_left_out(fakes: Fakes) -> None:
    """The memories and their histories were separate reads: a change in between wrote files that import-mem0
    refuses (second review)."""
    from inferscale.commands.export import export_store

    client = fakes.client()
    kept = client.add("I drive a blue Volvo.", user_id="maya", infer=False)["results"][0]["id"]
    gone = client.add("I hate mornings.", user_id="maya", infer=False)["results"][0]["id"]
    history = client.history
    meanwhile = {kept: lambda: client.update(kept, "I drive a red Volvo now."), gone: lambda: client.delete(gone)}

    def changed_meanwhile(memory_id: str, **scope: str) -> list[dict[str, object]]:
        rows = history(memory_id, **scope)
        change = meanwhile.pop(memory_id, None)
        if change is not None:  # another process writes between this read and the next
            change()
        return rows

    client.history = changed_meanwhile  # type: ignore[method-assign]
    memories, rows = export_store(client, None)
    assert [m["memory"] for m in memories] == ["I drive a red Volvo now."]
    assert [(r["event"], r["new_memory"]) for r in rows] == [
        ("ADD", "I drive a blue Volvo."),
        ("UPDATE", "I drive a red Volvo now."),
    ]
    client.close()


def test_an_empty_scope_flag_is_refused(cli: Callable[..., Ran], fakes: Fakes, tmp_path: Path) -> None:
    """`--user ""` exported every scope's memories while saying so (second review)."""
    fakes.client().close()
    ran = cli("export", str(tmp_path / "out"), "--user", "")
    assert ran.code == 2 and "user_id" in ran.err
    assert not (tmp_path / "out").exists()


def test_history_rows_keep_their_listed_order_whatever_their_times_say(
    cli: Callable[..., Ran], fakes: Fakes, tmp_path: Path
) -> None:
    """Two metadata-only updates written by hosts whose clocks disagree: their times run backwards. The import
    ordered them by time and then refused the old_metadata chain (second review); InferScale's rows are listed in
    the order written."""
    source = fakes.client()
    memory = source.add("I drive a Volvo.", user_id="maya", infer=False)["results"][0]["id"]
    source.update(memory, metadata={"v": 1})
    source.update(memory, metadata={"v": 2, "role": None})  # a role of None: the import leaves it out
    before = source.history(memory)
    source.close()
    out = tmp_path / "export"
    assert cli("export", str(out)).code == 0
    rows = json.loads((out / "history.json").read_text())
    rows[1]["created_at"], rows[2]["created_at"] = rows[2]["created_at"], rows[1]["created_at"]
    (out / "history.json").write_text(json.dumps(rows))
    target = tmp_path / "target"
    moved = cli(
        "import-mem0", str(out / "memories.json"), "--history", str(out / "history.json"),
        "--data-dir", str(target), "--no-encode-kv", local=False,
    )  # fmt: skip
    assert moved.code == 0, moved.err
    with MemoryClient({"data_dir": str(target)}, embedder=HashEmbedder()) as other:
        after = other.history(memory)
    assert [r["new_metadata"] for r in after] == [r["new_metadata"] for r in before]
