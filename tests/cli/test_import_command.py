"""``inferscale import-mem0`` on a real MemoryClient (fake models): it stores the memories of a Mem0 faiss folder or
of a JSON file of Mem0's ``get_all`` results, with their ids, only the scope the flags name when they name one,
skips what it stored before, and offers no server options (``--host``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_runner import Ran

from inferscale import MemoryClient
from inferscale.cli import build_parser

ALICE_ID = "5c1f3c52-7e0e-4c55-9a43-7c1d1f6b2a01"
BOB_ID = "0b6e2d0a-2f1b-4f0e-8a43-0d9b6c1e3a02"
RESULTS = [
    {
        "id": ALICE_ID,
        "memory": "Has a beagle named Biscuit.",
        "created_at": "2026-03-01T09:30:00+00:00",
        "user_id": "alice",
    },
    {"id": BOB_ID, "memory": "Plays the cello.", "created_at": "2026-03-02T09:30:00+00:00", "user_id": "bob"},
]


def test_a_get_all_file_is_imported_then_skipped_the_second_time(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient], tmp_path: Path
) -> None:
    exported = tmp_path / "mem0.json"
    exported.write_text(json.dumps({"results": RESULTS}))
    ran = cli("import-mem0", str(exported), "--json")
    assert ran.code == 0, ran.err
    assert [(r["id"], r["event"]) for r in ran.json()["results"]] == [(ALICE_ID, "ADD"), (BOB_ID, "ADD")]
    again = cli("import-mem0", str(exported))
    assert again.code == 0, again.err
    assert "imported 0 memories" in again.out and "skipped 2 memories: imported before" in again.out
    client = reference()
    assert [m["id"] for m in client.get_all(user_id="alice")["results"]] == [ALICE_ID]
    assert [m["id"] for m in client.get_all(user_id="bob")["results"]] == [BOB_ID]


def test_a_faiss_folder_is_read_and_the_scope_flags_pick_whose_memories(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient], tmp_path: Path
) -> None:
    folder = tmp_path / "faiss"
    folder.mkdir()
    docstore = {r["id"]: {"data": r["memory"], **{k: r[k] for k in ("created_at", "user_id")}} for r in RESULTS}
    (folder / "people.json").write_text(json.dumps({"docstore": docstore, "index_to_id": {}}))
    ran = cli("import-mem0", str(folder), "--collection", "people", "--user", "bob")
    assert ran.code == 0, ran.err
    assert "imported 1 memory from" in ran.out
    assert [m["id"] for m in reference().get_all(user_id="bob")["results"]] == [BOB_ID]
    assert reference().get_all(user_id="alice")["results"] == []


def test_with_a_scope_flag_a_bad_record_is_named_by_its_place_in_the_file(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient], tmp_path: Path
) -> None:
    """A review's find: the records were filtered by scope first, so an error counted the filtered list."""
    exported = tmp_path / "mem0.json"
    exported.write_text(json.dumps([RESULTS[0], {**RESULTS[1], "id": "mem-2"}]))
    ran = cli("import-mem0", str(exported), "--user", "bob")
    assert ran.code == 2
    assert "record 1 (id 'mem-2')" in ran.err
    assert reference().db.all_memories() == []


def test_a_bad_record_exits_2_and_stores_nothing(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient], tmp_path: Path
) -> None:
    exported = tmp_path / "mem0.json"
    exported.write_text(json.dumps([*RESULTS, {"id": "mem-3", "memory": "x", "user_id": "bob"}]))
    ran = cli("import-mem0", str(exported))
    assert ran.code == 2
    assert "record 2 (id 'mem-3')" in ran.err and "canonical form" in ran.err
    assert reference().get_all(user_id="alice")["results"] == []


def test_history_reads_mem0s_rows_for_the_memories_imported(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient], tmp_path: Path
) -> None:
    exported, history = tmp_path / "mem0.json", tmp_path / "history.json"
    exported.write_text(json.dumps(RESULTS))
    added = {"memory_id": ALICE_ID, "event": "ADD", "old_memory": None, "created_at": "2026-03-01T09:30:00+00:00"}
    updated = {
        "memory_id": ALICE_ID,
        "event": "UPDATE",
        "old_memory": "Has a dog.",
        "new_memory": "Has a beagle named Biscuit.",
        "created_at": "2026-03-01T09:30:00+00:00",
        "updated_at": "2026-03-04T10:00:00+00:00",
    }
    history.write_text(json.dumps([{**added, "new_memory": "Has a dog."}, updated]))
    ran = cli("import-mem0", str(exported), "--history", str(history))
    assert ran.code == 0, ran.err
    assert [(h["event"], h["new_memory"]) for h in reference().history(ALICE_ID)] == [
        ("ADD", "Has a dog."),
        ("UPDATE", "Has a beagle named Biscuit."),
    ]
    assert [h["event"] for h in reference().history(BOB_ID)] == ["ADD"]
    missing = cli("import-mem0", str(exported), "--history", str(tmp_path / "none.db"))
    assert missing.code == 2 and "none.db cannot be read as Mem0's history" in missing.err


def test_import_offers_no_server_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["import-mem0", "x.json", "--host", "http://127.0.0.1:9"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --host" in capsys.readouterr().err
