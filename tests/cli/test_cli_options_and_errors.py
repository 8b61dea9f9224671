"""The command line's shape: every command, the shared options on each memory command, positional arguments from
settings fields, the client each run builds (local or ``--host``), and typed errors printed as one line with exit
code 2 (bad input) or 1 (any other failure)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_runner import Fakes, Ran, make_store

from inferscale import MemoryClient
from inferscale.apps_extra import exit_code
from inferscale.cli import build_parser, main
from inferscale.cli_options import add_options, cli, from_args
from inferscale.commands import client as clients
from inferscale.commands.options import ModelOptions, StoreOptions
from inferscale.config import EngineConfig
from inferscale.errors import (
    AuthenticationError,
    ConfigError,
    ExtractionError,
    InvalidInputError,
    MemoryNotFoundError,
    ScopeError,
    ServerError,
)

COMMANDS = [
    "add",
    "search",
    "list",
    "delete",
    "history",
    "chat",
    "prepare-kv",
    "prune-kv",
    "import-mem0",
    "export",
    "serve",
    "keys",
    "bench",
    "eval",
    "demo",
]
MEMORY_COMMANDS = {
    "add": ["some text"],
    "search": ["query"],
    "list": [],
    "delete": ["some-id"],
    "history": ["some-id"],
    "chat": ["a question?"],
}


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_every_command_is_there_in_order() -> None:
    assert _subcommands(build_parser()) == COMMANDS


@pytest.mark.parametrize("command", list(MEMORY_COMMANDS))
def test_each_memory_command_takes_the_shared_options(command: str) -> None:
    argv = [command, *MEMORY_COMMANDS[command], "--user", "u", "--agent", "a", "--run", "r", "--json"]
    args = build_parser().parse_args([*argv, "--data-dir", "/d", "--db-url", "sqlite:///x.db", "--dtype", "float32"])
    assert (args.user_id, args.agent_id, args.run_id, args.as_json) == ("u", "a", "r", True)
    assert (args.data_dir, args.db_url, args.model, args.dtype) == ("/d", "sqlite:///x.db", None, "float32")
    remote = build_parser().parse_args([command, *MEMORY_COMMANDS[command], "--host", "http://h:1", "--api-key", "k"])
    assert (remote.host, remote.api_key) == ("http://h:1", "k")


def test_keys_commands_take_the_store_and_output_options() -> None:
    args = build_parser().parse_args(
        ["keys", "create", "n", "--user", "a", "--user", "b", "--data-dir", "/d", "--json"]
    )
    assert (args.name, args.user_ids, args.agent_ids, args.data_dir, args.as_json) == (
        "n",
        ["a", "b"],
        None,
        "/d",
        True,
    )
    with pytest.raises(SystemExit):  # keys live in the local database: no --host
        build_parser().parse_args(["keys", "list", "--host", "http://h:1"])


DEEP_JSON = '{"a": ' * 100_000 + "1" + "}" * 100_000
"""Nested past the JSON parser's recursion limit: it raised a bare RecursionError, a traceback."""


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", DEEP_JSON], ids=["not-json", "a-list", "nested-too-deep"])
def test_a_json_option_that_is_not_an_object_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["search", "q", "--user", "u", "--filters", bad])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "expected a JSON object" in err
    # a tester's 40,000-level object came back whole: 120 KB of stderr; the word is quoted to 200 characters
    assert len(err) < 1_000
    if bad == DEEP_JSON:
        assert f"got {DEEP_JSON[:199]!r}"[:-1] + " (it nests" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "ttft", "--ks", "x" * 50_000],
        ["bench", "ttft", "--repeats", "-" + "9" * 4_000],
        # a review's finds: argparse's own message for type=int echoed the word whole
        ["bench", "ttft", "--repeats", "y" * 5_000],
        ["search", "q", "--user", "u", "--limit", "x" * 5_000],
        ["serve", "--port", "p" * 5_000],
        ["serve", "--shutdown-grace", "s" * 5_000],
    ],
    ids=["int-list", "positive-int", "positive-int-not-a-number", "plain-int", "serve-int", "serve-float"],
)
def test_a_refused_long_word_is_quoted_short(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    error = err.strip().splitlines()[-1]  # after the usage lines
    assert exited.value.code == 2 and "expected" in error and f"got {argv[-1][:199]!r}"[:-1] in error
    assert len(error) < 400


@dataclass(frozen=True)
class _Positional:
    name: str = field(metadata=cli("NAME", help="required"))
    maybe: str | None = field(default=None, metadata=cli("OTHER", nargs="?", help="optional"))
    count: int = field(default=1, metadata=cli("--count", help="a flag"))


def test_settings_fields_make_positional_arguments() -> None:
    parser = add_options(argparse.ArgumentParser(), _Positional)
    assert from_args(_Positional, parser.parse_args(["x"])) == _Positional("x", None, 1)
    assert from_args(_Positional, parser.parse_args(["x", "y", "--count", "3"])) == _Positional("x", "y", 3)
    assert "NAME" in parser.format_usage() and "[OTHER]" in parser.format_usage()
    with pytest.raises(SystemExit):
        parser.parse_args([])


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidInputError("x"), 2),
        (ScopeError("x"), 2),
        (ConfigError("x"), 2),
        (MemoryNotFoundError("x"), 1),
        (AuthenticationError("x"), 1),
        (ServerError("x"), 1),
        (ExtractionError("x"), 1),
    ],
)
def test_exit_codes(error: Exception, code: int) -> None:
    assert exit_code(error) == code


def _one_error_line(ran: Ran, code: int, *words: str) -> None:
    assert ran.code == code and ran.out == ""
    assert ran.err.startswith("error: ") and ran.err.count("\n") == 1, ran.err
    assert "Traceback" not in ran.err and all(w in ran.err for w in words), ran.err


def test_a_call_without_a_scope_exits_2(cli: Callable[..., Ran]) -> None:
    _one_error_line(cli("search", "dog", "--json"), 2, "user_id")
    _one_error_line(cli("list"), 2, "user_id")


def test_deleting_needs_one_id_or_all_with_a_scope(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    memory_id = cli("add", "I live in Porto.", "--user", "alice", "--no-infer", "--json").json()["results"][0]["id"]
    _one_error_line(cli("delete"), 2, "--all")
    _one_error_line(cli("delete", memory_id, "--all", "--user", "alice"), 2, "--all")
    _one_error_line(cli("delete", "--all"), 2, "user_id")
    _one_error_line(cli("delete", "no-such-id", "--user", "alice"), 1, "no-such-id")
    _one_error_line(cli("delete", memory_id, "--user", "bob"), 1, memory_id)  # another scope's memory
    assert [m["id"] for m in reference().get_all(user_id="alice")["results"]] == [memory_id]


def test_bad_input_the_client_refuses_exits_2(cli: Callable[..., Ran]) -> None:
    _one_error_line(cli("add", "x", "--user", "u", "--no-infer", "--metadata", '{"user_id": "v"}'), 2, "user_id")
    _one_error_line(cli("search", "x", "--user", "u", "--limit", "-1"), 2, "limit")


def test_api_key_without_host_and_host_with_local_options_exit_2(cli: Callable[..., Ran]) -> None:
    _one_error_line(cli("list", "--user", "u", "--api-key", "isk_x"), 2, "--host")
    _one_error_line(cli("list", "--user", "u", "--host", "http://127.0.0.1:9"), 2, "--data-dir")


@pytest.mark.parametrize(
    "local_option",
    [["--dtype", "auto"], ["--dtype", "float32"], ["--model", "SmolLM2"], ["--data-dir", "/d"], ["--db-url", "x"]],
)
def test_host_refuses_every_local_option_given_even_at_its_default(
    cli: Callable[..., Ran], fakes: Fakes, local_option: list[str]
) -> None:
    # auto is EngineConfig's default dtype: given with --host, it must be refused like any other value
    ran = cli("list", "--user", "u", "--host", "http://127.0.0.1:9", *local_option, local=False)
    _one_error_line(ran, 2, "--dtype")
    assert fakes.remote == []


def test_dtype_reaches_the_local_store_config_only_when_given() -> None:
    def engine_dtype(*flags: str) -> str:
        args = build_parser().parse_args(["list", "--user", "u", *flags])
        return StoreOptions().config(from_args(ModelOptions, args)).engine.dtype

    assert (engine_dtype(), engine_dtype("--dtype", "float32"), engine_dtype("--dtype", "float16")) == (
        EngineConfig().dtype,
        "float32",
        "float16",
    )


def test_host_builds_the_remote_client_with_the_key(cli: Callable[..., Ran], fakes: Fakes) -> None:
    assert cli("list", "--user", "u", "--host", "http://h:1", "--json", local=False).json() == {"results": []}
    assert cli("list", "--user", "u", "--host", "http://h:2", "--api-key", "isk_flag", local=False).code == 0
    assert fakes.remote == [  # without --api-key the remote client reads $INFERSCALE_API_KEY itself
        {"host": "http://h:1", "api_key": None},
        {"host": "http://h:2", "api_key": "isk_flag"},
    ]


def test_narrow_tables_keep_the_id_and_text_whole(cli: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch) -> None:
    memory_id = cli("add", "I live in Porto.", "--user", "alice", "--no-infer", "--json").json()["results"][0]["id"]
    monkeypatch.setenv("COLUMNS", "80")
    ran = cli("search", "I live in Porto.", "--user", "alice")
    lines = ran.out.splitlines()
    assert all(len(line) <= 80 for line in lines)
    row = next(i for i, line in enumerate(lines) if memory_id in line)
    assert "I live in Porto." in lines[row] and "user=alice · 1.000 · " in lines[row + 1]


def test_ctrl_c_exits_130_without_a_traceback(cli: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> MemoryClient:
        raise KeyboardInterrupt

    monkeypatch.setattr(clients, "MemoryClient", interrupted)
    ran = cli("list", "--user", "u")
    assert ran.code == 130 and ran.out == "" and "Traceback" not in ran.err


def test_a_reader_that_went_away_ends_the_command_quietly_with_141(tmp_path: Path) -> None:
    """``inferscale chat ... --json | head -c 300``: once ``head`` exits, writes to stdout fail with EPIPE. The
    command must end with 141 (128 + SIGPIPE) and no BrokenPipeError traceback. The pipe's reader is closed before
    the command starts, so its first write (or the final flush) fails whatever the output's size."""
    import os
    import subprocess
    import sys

    make_store(tmp_path)  # the store the command reads
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "inferscale.cli", "keys", "list", "--json", "--data-dir", str(tmp_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == "" and done.returncode == 141, (done.returncode, done.stderr.decode())


@pytest.mark.parametrize(("option", "value"), [("--chain-block", "1"), ("--context-window", "-1")])
def test_k_v_settings_the_config_refuses_fail_with_a_config_error_before_any_model_loads(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", option, value, "--data-dir", str(tmp_path)]) == exit_code(ConfigError("x"))
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the demo's settings:") and option.lstrip("-").replace("-", "_") in err
    assert not (tmp_path / "memory.db").exists()  # no client was built


def test_a_memory_layout_the_config_refuses_is_a_config_error_before_any_client_is_built(tmp_path: Path) -> None:
    from inferscale.demo import demo_client

    with pytest.raises(ConfigError, match="the demo's settings: memory_layout: Input should be 'score' or 'added'"):
        demo_client(tmp_path, 5, 0, "newest")  # type: ignore[arg-type]  # a caller outside the CLI's choices
    assert not (tmp_path / "memory.db").exists()


def test_a_database_that_cannot_be_connected_to_is_one_line_and_exit_1(cli: Callable[..., Ran]) -> None:
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'inferscale-memory[postgres]')")
    ran = cli("list", "--user", "maya", "--db-url", "postgresql+psycopg://inferscale:s3cret@127.0.0.1:1/memories")
    assert ran.code == 1
    assert ran.err.startswith("error: cannot connect to the database postgresql+psycopg://inferscale:***@127.0.0.1:1")
    assert "Traceback" not in ran.err and "s3cret" not in ran.err


def test_ctrl_c_while_the_parser_loads_exits_130_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser imports the bench, eval and demo modules (seconds: torch); a Ctrl-C then gave a traceback and
    the signal's death instead of 130 (a CLI user's report)."""
    from inferscale import cli as cli_module

    def interrupted() -> argparse.ArgumentParser:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "build_parser", interrupted)
    try:
        code = cli_module.main(["list", "--user", "u"])
    except KeyboardInterrupt:  # caught here: one escaping would stop the whole test session
        pytest.fail("the KeyboardInterrupt escaped main()")
    assert code == 130


def test_keys_without_a_subcommand_names_the_subcommands_not_an_internal_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``inferscale keys`` said "the following arguments are required: keys_command" (a CLI user's report)."""
    with pytest.raises(SystemExit) as exited:
        main(["keys"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "required: {create,list,revoke}" in err and "keys_command" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["search", "dog", "--user", "maya"],
        ["list", "--user", "maya"],
        ["delete", "--all", "--user", "maya"],
        ["history", "some-id"],
        ["chat", "What is my dog called?", "--user", "maya"],
        ["chat", "What is my dog called?", "--user", "maya", "--stream"],
        ["prepare-kv", "--user", "maya"],
        ["prune-kv", "--user", "maya"],
        ["keys", "list"],
        ["keys", "revoke", "some-key"],
    ],
)
def test_a_command_on_a_data_dir_that_does_not_exist_fails_without_creating_a_store(
    argv: list[str], cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """A mistyped ``--data-dir`` created a new, empty store there: ``search`` found nothing, ``delete --all``
    deleted nothing, both exit 0, as if the right store were empty (a CLI user's report). The hint names every
    command that creates a store, as docs/cli.md does (it named two of the four: a new user's find)."""
    typo = tmp_path / "dta"
    hint = "`inferscale add`, `inferscale import-mem0`, `inferscale keys create` and `inferscale serve` create a store"
    _one_error_line(cli(*argv, "--data-dir", str(typo), local=False), 2, f"no store at {typo} (--data-dir)", hint)
    assert not typo.exists()


@pytest.mark.parametrize(
    "argv", [["list", "--user", "maya"], ["delete", "--all", "--user", "maya"], ["keys", "list"], ["history", "x"]]
)
def test_a_command_on_a_sqlite_db_url_whose_file_does_not_exist_fails_without_creating_it(
    argv: list[str], cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """A mistyped ``--db-url sqlite:///...`` made the file (and its folder) and answered from the new, empty store:
    ``list`` found nothing, ``keys list`` said "0 API keys", exit 0 (a new user's find)."""
    typo = tmp_path / "nodir" / "nope.db"
    url = f"sqlite:///{typo}"
    _one_error_line(cli(*argv, "--db-url", url, local=False), 2, f"no store at {url} (--db-url): no file {typo}")
    assert not (tmp_path / "nodir").exists()
    config = tmp_path / "app.json"
    config.write_text(json.dumps({"db_url": url}), encoding="utf-8")
    _one_error_line(cli(*argv, "--config", str(config), local=False), 2, f"(db_url in {config}): no file {typo}")
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("argv", [["list", "--user", "maya"], ["delete", "--all", "--user", "maya"], ["keys", "list"]])
def test_a_command_on_a_folder_that_holds_no_store_fails_without_creating_one(
    argv: list[str], cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """``--data-dir .`` (a folder that exists but is not a store) passed the check and opened a new, empty store there:
    ``list`` found nothing and left a memory.db behind."""
    folder = tmp_path / "not-a-store"
    folder.mkdir()
    (folder / "notes.txt").write_text("someone else's folder", encoding="utf-8")
    ran = cli(*argv, "--data-dir", str(folder), local=False)
    _one_error_line(ran, 2, f"no store at {folder} (--data-dir): no memory.db in that folder")
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_a_config_file_nested_too_deep_is_refused_in_one_line(cli: Callable[..., Ran], tmp_path: Path) -> None:
    config = tmp_path / "app.json"
    config.write_text(DEEP_JSON, encoding="utf-8")
    _one_error_line(cli("list", "--user", "maya", "--config", str(config), local=False), 2, "nests deeper")


def test_a_config_files_data_dir_that_does_not_exist_is_refused_too(cli: Callable[..., Ran], tmp_path: Path) -> None:
    typo = tmp_path / "dta"
    config = tmp_path / "app.json"
    config.write_text(f'{{"data_dir": "{typo}"}}', encoding="utf-8")
    _one_error_line(cli("list", "--user", "maya", "--config", str(config), local=False), 2, f"data_dir in {config}")
    assert not typo.exists()


def test_add_and_keys_create_make_the_store_a_new_data_dir_names(
    cli: Callable[..., Ran], fakes: Fakes, tmp_path: Path
) -> None:
    new = tmp_path / "new"
    assert cli("add", "I live in Porto.", "--user", "maya", "--no-infer", "--data-dir", str(new), local=False).code == 0
    fakes.data_dir = new  # the store the commands below read (Fakes.client's default)
    listed = cli("list", "--user", "maya", "--data-dir", str(new), "--json", local=False)
    assert [m["memory"] for m in listed.json()["results"]] == ["I live in Porto."]
    keys = tmp_path / "keys"
    assert cli("keys", "create", "app", "--user", "maya", "--data-dir", str(keys), local=False).code == 0
    assert (keys / "memory.db").is_file()


def test_a_missing_data_dir_beside_a_db_url_is_not_refused(tmp_path: Path) -> None:
    """With ``--db-url`` the memories are in that database; the data folder only holds the index and K/V, which
    are rebuilt from it (a second host's first start)."""
    (tmp_path / "elsewhere.db").touch()  # the database exists: only the data folder is missing
    options = StoreOptions(data_dir="/nonexistent/inferscale-data", db_url=f"sqlite:///{tmp_path}/elsewhere.db")
    assert options.existing_config().data_path() == Path("/nonexistent/inferscale-data")
    for memory_url in ("sqlite://", "sqlite:///x.db?mode=memory&cache=shared&uri=true"):  # in memory: no file
        in_memory = StoreOptions(data_dir="/nonexistent/inferscale-data", db_url=memory_url)
        assert in_memory.existing_config().db_url == memory_url
    postgres = StoreOptions(db_url="postgresql+psycopg://localhost/nonexistent")  # its server reports a missing one
    assert postgres.existing_config().db_url == "postgresql+psycopg://localhost/nonexistent"


@pytest.mark.parametrize(
    ("missing", "engine"), [("uvicorn", "transformers"), ("fastapi", "transformers"), ("asgi_correlation_id", "vllm")]
)
def test_serve_without_the_server_extra_is_one_error_line_naming_it(
    missing: str, engine: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A core install (no `server` extra) has `inferscale serve`, whose import of uvicorn was a traceback, exit 1
    (packaging tester)."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else find_spec(name, *a))
    import inferscale.serve_cli

    for start in ("_serve_transformers", "_serve_vllm"):
        monkeypatch.setattr(inferscale.serve_cli, start, lambda args: pytest.fail("the server started"))
    status = main(["serve", "--engine", engine, "--data-dir", str(tmp_path / "data"), "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("error: inferscale serve needs the 'server' extra") and "Traceback" not in err
    assert f"missing: {missing}" in err and "pip install 'inferscale-memory[server]'" in err
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_a_missing_rich_names_the_apps_extra_for_any_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The message said the demo, bench and eval commands need it, when `list` and `keys list` asked (tester)."""
    import sys

    from inferscale.apps_extra import require

    monkeypatch.setitem(sys.modules, "rich.table", None)  # as if not installed: its import raises ImportError
    with pytest.raises(ConfigError, match=r"tables and plots \(every command's output without --json") as raised:
        require("rich.table")
    assert "pip install 'inferscale-memory[apps]'" in str(raised.value)


def test_building_the_parser_imports_neither_nltk_nor_scipy() -> None:
    """`inferscale --help` imported torch, nltk and scipy for the bench and eval parsers: 17-39 s on a loaded 2-core
    machine (packaging tester). Their settings now live apart from the benchmarks. (torch is still imported, through
    the store's modules.)"""
    import subprocess
    import sys

    probe = (
        "import sys; from inferscale.cli import build_parser; build_parser(); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'nltk', 'scipy', 'matplotlib'}))"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert ran.stdout.strip() == "[]"
