"""``inferscale prepare-kv`` on a real MemoryClient (fake models, K/V encoded lazily): it encodes what chats would
encode on first use, for the scope given or for every scope, and offers no server options (``--host``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Ran

from inferscale import MemoryClient
from inferscale.cli import build_parser
from inferscale.commands.options import StoreOptions

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


def test_prepare_kv_offers_no_server_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["prepare-kv", "--host", "http://127.0.0.1:9"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --host" in capsys.readouterr().err


def test_prepare_kv_takes_the_scope_store_model_and_output_options() -> None:
    argv = ["prepare-kv", "--user", "u", "--agent", "a", "--run", "r", "--json", "--data-dir", "/d"]
    args = build_parser().parse_args([*argv, "--db-url", "sqlite:///x.db", "--model", "m", "--dtype", "float32"])
    assert (args.user_id, args.agent_id, args.run_id, args.as_json) == ("u", "a", "r", True)
    assert (args.data_dir, args.db_url, args.model, args.dtype) == ("/d", "sqlite:///x.db", "m", "float32")
    assert (args.host, args.api_key) == (None, None)  # set by the parser: a local store


def test_prepare_kv_encodes_under_the_apps_config_file(
    cli: Callable[..., Ran], fakes: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command could only take --model and --dtype, so after a kv settings change (which the docs send users
    to it for) it encoded under the default settings: the app encoded everything again."""
    settings = {"kv": {"storage_format": "int8", "context_window": 2}, "system_prompt": "Answer briefly."}
    config_file = tmp_path / "app.json"
    config_file.write_text(json.dumps(settings))
    ids = _add(cli, "alice", FACTS)
    app = fakes.client(StoreOptions(config_file=str(config_file), data_dir=str(fakes.data_dir)).config())
    assert app.config.kv.storage_format == "int8" and app.config.system_prompt == "Answer briefly."
    assert cli("prepare-kv", "--json").json()["encoded"] == 2  # the default settings: not the app's K/V
    assert app.derived.missing_kv(ids) == ids
    ran = cli("prepare-kv", "--config", str(config_file), "--json")
    assert ran.code == 0, ran.err
    assert ran.json() == {"memories": 2, "encoded": 2, "left": []}
    assert app.derived.missing_kv(ids) == []  # what the app's chats will read
    app.close()
    config_file.write_text("[1, 2]")
    ran = cli("prepare-kv", "--config", str(config_file))
    assert ran.code != 0 and "must hold a JSON object" in ran.err
    ran = cli("search", "dog", "--user", "alice", "--config", str(config_file), "--host", "http://h", local=False)
    assert ran.code != 0 and "--config, --data-dir" in ran.err
