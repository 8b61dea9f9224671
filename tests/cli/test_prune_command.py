"""``inferscale prune-kv`` on a real MemoryClient (fake models): it removes the K/V entries another configuration
stored (here int8 ones) for the scope given or for every scope, keeps those the command's configuration serves, and
offers no server options (``--host``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Fakes, Ran

from inferscale import MemoryClient
from inferscale.cli import build_parser
from inferscale.commands.options import StoreOptions
from inferscale.storage import KVEntryRecord
from inferscale.storage.queries import kv_entries_of

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto."]


def _add(cli: Callable[..., Ran], user: str, fact: str) -> str:
    ran = cli("add", fact, "--user", user, "--no-infer", "--json")
    assert ran.code == 0, ran.err
    memory_id: str = ran.json()["results"][0]["id"]
    return memory_id


def _prepare_int8_and_model(fakes: Fakes, reference: Callable[[], MemoryClient]) -> list[KVEntryRecord]:
    """K/V of every memory in int8 (another configuration's) and in the model's dtype (the commands'); the int8
    rows."""
    base = StoreOptions(data_dir=str(fakes.data_dir)).config()
    int8 = base.model_copy(update={"kv": base.kv.model_copy(update={"storage_format": "int8"})})
    with fakes.client(int8) as other:
        other.prepare_kv()
    client = reference()
    client.prepare_kv()
    return [row for row in client.db.all_kv_entries() if ";kv=int8:" in row.encoding_key]


def test_prune_kv_json_removes_the_other_formats_entries_of_the_scope_then_of_every_scope(
    cli: Callable[..., Ran], fakes: Fakes, reference: Callable[[], MemoryClient]
) -> None:
    alice, bob = _add(cli, "alice", FACTS[0]), _add(cli, "bob", FACTS[1])
    int8 = _prepare_int8_and_model(fakes, reference)
    of_alice = [row for row in int8 if row.memory_id == alice]
    assert of_alice and len(of_alice) < len(int8)

    ran = cli("prune-kv", "--user", "alice", "--json")
    assert ran.code == 0, ran.err
    removed = len(of_alice)
    assert ran.json() == {
        "memories": 1,
        "entries_removed": removed,
        "rows_removed": removed,
        "bytes_removed": sum(row.nbytes for row in of_alice),
        "dry_run": False,
    }
    left = [row for row in reference().db.all_kv_entries() if ";kv=int8:" in row.encoding_key]
    assert left == [row for row in int8 if row.memory_id == bob]
    assert cli("prune-kv", "--json").json()["rows_removed"] == len(int8) - removed
    assert reference().derived.missing_kv([alice, bob]) == []  # what the commands' configuration serves is kept


def test_prune_kv_table_names_the_count_the_bytes_and_the_scope(
    cli: Callable[..., Ran], fakes: Fakes, reference: Callable[[], MemoryClient]
) -> None:
    _add(cli, "alice", FACTS[0])
    int8 = _prepare_int8_and_model(fakes, reference)
    ran = cli("prune-kv", "--user", "alice")
    assert ran.code == 0, ran.err
    megabytes = sum(row.nbytes for row in int8) / 1e6
    entries = f"{len(int8)} K/V entries" if len(int8) > 1 else "1 K/V entry"
    assert f"removed {entries}, {megabytes:.1f} MB, that no chat looks up (1 memory of user=alice)" in ran.out
    assert "removed 0 K/V entries, 0.0 MB, that no chat looks up (1 memory of every scope)" in cli("prune-kv").out


def test_prune_kv_dry_run_reports_what_the_prune_then_removes_and_removes_nothing(
    cli: Callable[..., Ran], fakes: Fakes, reference: Callable[[], MemoryClient]
) -> None:
    _add(cli, "alice", FACTS[0])
    int8 = _prepare_int8_and_model(fakes, reference)
    kv_dir = fakes.data_dir / "kv"
    files = sorted(path for path in kv_dir.rglob("*.safetensors"))
    dry = cli("prune-kv", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert reference().db.all_kv_entries() and sorted(kv_dir.rglob("*.safetensors")) == files
    table = cli("prune-kv", "--dry-run")
    entries = f"{len(int8)} K/V entries" if len(int8) > 1 else "1 K/V entry"
    assert f"would remove (dry run: nothing removed) {entries}" in table.out
    done = cli("prune-kv", "--json")
    assert done.json()["rows_removed"] == len(int8) > 0
    assert dry.json() == {**done.json(), "dry_run": True}


def test_prune_kv_offers_no_server_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["prune-kv", "--host", "http://127.0.0.1:9"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --host" in capsys.readouterr().err


def test_prune_kv_takes_the_scope_store_model_and_output_options() -> None:
    argv = ["prune-kv", "--user", "u", "--agent", "a", "--run", "r", "--json", "--data-dir", "/d"]
    args: Any = build_parser().parse_args([*argv, "--db-url", "sqlite:///x.db", "--model", "m", "--dtype", "float32"])
    assert (args.user_id, args.agent_id, args.run_id, args.as_json) == ("u", "a", "r", True)
    assert (args.data_dir, args.db_url, args.model, args.dtype) == ("/d", "sqlite:///x.db", "m", "float32")


def test_prune_kv_keeps_what_the_apps_config_file_serves(
    cli: Callable[..., Ran], fakes: Fakes, reference: Callable[[], MemoryClient], tmp_path: Path
) -> None:
    """Under the app's int8 configuration (``--config``) it is the model-dtype entries that go."""
    config_file = tmp_path / "app.json"
    config_file.write_text(json.dumps({"kv": {"storage_format": "int8"}}))
    memory_id = _add(cli, "alice", FACTS[0])
    int8 = _prepare_int8_and_model(fakes, reference)
    model_dtype = [row for row in reference().db.all_kv_entries() if row not in int8]
    ran = cli("prune-kv", "--config", str(config_file), "--json")
    assert ran.code == 0, ran.err
    assert ran.json()["rows_removed"] == len(model_dtype) > 0
    assert reference().db.run_read(kv_entries_of, [memory_id]) == int8
