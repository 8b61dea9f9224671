"""``inferscale serve``: the transformers engine is the default, and a server without API keys refuses any host
but loopback (before loading a model or binding a port) and says it is open when it runs on loopback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import ConfigError
from inferscale.serve_cli import add_serve_parser, run_serve
from inferscale.server.keys import KeyStore
from inferscale.server.options import ServerOptions
from inferscale.server.run import check_listen_address, memory_config, serve_transformers


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferscale")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def test_serve_defaults_to_the_transformers_engine_on_loopback() -> None:
    args = _parse()
    assert (args.engine, args.host, args.port, args.dtype, args.device, args.max_request_bytes) == (
        "transformers",
        "127.0.0.1",
        8000,
        None,
        None,  # unset: ServerOptions' default; set, refused for --engine vllm
        None,
    )
    assert _parse("--engine", "vllm").engine == "vllm"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::"])
def test_a_public_host_without_keys_is_refused_before_anything_loads(tmp_path: Path, host: str) -> None:
    with pytest.raises(ConfigError, match=rf"refusing to listen on '{host}' without API keys.*inferscale keys create"):
        serve_transformers(ServerOptions(host=host, data_dir=str(tmp_path), model=str(tmp_path / "no-model")))


def test_the_command_reports_the_refusal_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("--host", "0.0.0.0", "--data-dir", str(tmp_path))
    assert run_serve(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: refusing to listen on '0.0.0.0' without API keys")


def test_a_database_it_cannot_reach_is_one_error_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """It was a traceback, under a prefix (``inferscale serve:``) that no other command printed."""
    args = _parse("--db-url", "postgresql+psycopg://nobody@127.0.0.1:1/memories")
    assert run_serve(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot connect to the database postgresql+psycopg://nobody@127.0.0.1:1/memories")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_loopback_without_keys_runs_open_and_says_so_and_a_key_allows_any_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = KeyStore.for_config(memory_config(ServerOptions(data_dir=str(tmp_path))))
    assert keys.url == f"sqlite:///{tmp_path / 'memory.db'}"  # the memory database's own file
    with caplog.at_level("WARNING", logger="inferscale.server.run"):
        assert check_listen_address("127.0.0.1", keys) is True
    assert "the server is OPEN (no authentication) and listens on loopback (127.0.0.1) only" in caplog.text
    keys.create("ops", admin=True)
    assert check_listen_address("0.0.0.0", keys) is False
    keys.close()


def test_server_options_become_the_memory_config(tmp_path: Path) -> None:
    config = memory_config(ServerOptions(data_dir=str(tmp_path), model="/models/m", dtype="float32", device="cpu"))
    assert (config.engine.provider, config.engine.model, config.engine.dtype, config.engine.device) == (
        "transformers",
        "/models/m",
        "float32",
        "cpu",
    )
    assert config.database_url() == f"sqlite:///{tmp_path / 'memory.db'}"
    with pytest.raises(ConfigError, match="invalid options"):
        memory_config(ServerOptions(dtype="float8"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-model-len", "2048"], "--engine transformers does not use --max-model-len (--engine vllm only); leave"),
        (
            ["--kv-cache-bytes", "1", "--max-model-len", "8"],
            "--engine transformers does not use --max-model-len, --kv-cache-bytes (--engine vllm only); leave them out",
        ),
        (["--engine", "vllm", "--device", "cpu"], "--engine vllm does not use --device (--engine transformers only)"),
        (["--engine", "vllm", "--max-request-bytes", str(1 << 20)], "--engine vllm does not use --max-request-bytes"),
    ],
)
def test_a_flag_of_the_other_engine_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Even a value equal to the default: the flag was given, and the chosen engine would ignore it."""
    assert run_serve(_parse("--data-dir", str(tmp_path), *argv)) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_unset_engine_flags_keep_the_options_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    assert run_serve(_parse("--data-dir", str(tmp_path))) == 0
    assert run_serve(_parse("--data-dir", str(tmp_path), "--device", "cpu", "--max-request-bytes", "10")) == 0
    assert [(o.device, o.max_request_bytes, o.data_dir) for o in seen] == [
        (None, 1 << 20, str(tmp_path)),  # not given: the config file's engine.device, else EngineConfig's "auto"
        ("cpu", 10, str(tmp_path)),
    ]
    assert [memory_config(o).engine.device for o in seen] == ["auto", "cpu"]


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "app.json"
    path.write_text(
        json.dumps(
            {
                "llm": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "extractor"},
                "system_prompt": "Be terse.\nMemories:\n",
                "kv": {"recompute": "tail:4", "encode_on_add": "lazy"},
                "engine": {"provider": "vllm", "device": "cpu", "dtype": "float32", "model": "/models/from-file"},
                "data_dir": str(tmp_path / "from-file"),
            }
        )
    )
    return path


def test_a_config_file_is_the_servers_memory_config_and_flags_override_it(tmp_path: Path) -> None:
    """A tester's find: ``inferscale serve`` had no way to name the extraction LLM (or the embedder, the kv settings,
    the system prompt): a server always extracted with its chat model. ``--config FILE`` takes the app's config."""
    path = str(_config_file(tmp_path))
    config = memory_config(ServerOptions(config_file=path))
    assert (config.llm.provider, config.llm.base_url, config.llm.model) == (
        "openai",
        "http://127.0.0.1:9/v1",
        "extractor",
    )
    assert (config.system_prompt, config.kv.recompute, config.kv.encode_on_add) == (
        "Be terse.\nMemories:\n",
        "tail:4",
        "lazy",
    )
    engine = config.engine
    assert (engine.provider, engine.device, engine.dtype, engine.model) == (
        "transformers",
        "cpu",
        "float32",
        "/models/from-file",
    )
    assert config.data_path() == tmp_path / "from-file"
    given = ServerOptions(
        config_file=path, data_dir=str(tmp_path), model="/models/m", dtype="bfloat16", device="auto", recompute="none"
    )
    config = memory_config(given)
    assert (config.engine.model, config.engine.dtype, config.engine.device) == ("/models/m", "bfloat16", "auto")
    assert (config.data_path(), config.kv.recompute, config.kv.encode_on_add) == (tmp_path, "none", "lazy")
    assert config.llm.model == "extractor"


def test_data_dir_moves_the_database_index_and_kv_a_config_file_names(tmp_path: Path) -> None:
    """A review's find: with a file that names db_url (a Mem0 file's faiss path sets it and index_path), --data-dir
    moved nothing, and keys made with `inferscale keys create --data-dir` were not found by the server."""
    path = tmp_path / "app.json"
    named = {"db_url": f"sqlite:///{tmp_path / 'elsewhere.db'}", "index_path": str(tmp_path / "elsewhere.faiss")}
    path.write_text(json.dumps({**named, "kv": {"store_dir": str(tmp_path / "elsewhere-kv")}}))
    data = tmp_path / "data"
    config = memory_config(ServerOptions(config_file=str(path), data_dir=str(data)))
    assert (config.database_url(), config.index_path, config.kv.store_dir) == (
        f"sqlite:///{data / 'memory.db'}",
        None,
        None,
    )
    both = memory_config(ServerOptions(config_file=str(path), data_dir=str(data), db_url="sqlite:///other.db"))
    assert both.database_url() == "sqlite:///other.db"
    kept = memory_config(ServerOptions(config_file=str(path)))  # no flag: the file's
    assert (kept.db_url, kept.index_path) == (named["db_url"], named["index_path"])


def test_a_vllm_client_config_file_serves_on_the_transformers_server(tmp_path: Path) -> None:
    """A review's find: the file's vLLM limits made the forced transformers engine refuse the whole file."""
    path = tmp_path / "app.json"
    path.write_text(json.dumps({"engine": {"provider": "vllm", "model": "/m", "max_model_len": 8192}}))
    engine = memory_config(ServerOptions(config_file=str(path))).engine
    assert (engine.provider, engine.model, engine.max_model_len) == ("transformers", "/m", None)


def test_the_config_flag_reaches_the_server_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    path = str(_config_file(tmp_path))
    assert run_serve(_parse("--config", path)) == 0
    assert seen[0].config_file == path and memory_config(seen[0]).llm.model == "extractor"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read the config file"),
        ("[1]", "must hold a JSON object"),
        ('{"kv": {"recompute": "x"}}', "recompute"),
    ],
)
def test_a_config_file_that_does_not_serve_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "app.json"
    path.write_text(content)
    assert run_serve(_parse("--config", str(path), "--data-dir", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match=message):
        memory_config(ServerOptions(config_file=str(path)))
    assert run_serve(_parse("--config", str(tmp_path / "missing.json"))) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_the_recompute_flag_reaches_the_memory_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--recompute tail:16`` becomes ``kv.recompute`` of the server's memory client; unset, KVConfig's default
    holds; an unknown policy is refused before anything loads."""
    from inferscale.config import KVConfig
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    assert run_serve(_parse("--data-dir", str(tmp_path), "--recompute", "tail:16")) == 0
    assert run_serve(_parse("--data-dir", str(tmp_path))) == 0
    assert [o.recompute for o in seen] == ["tail:16", None]
    assert memory_config(seen[0]).kv.recompute == "tail:16"
    assert memory_config(seen[1]).kv.recompute == KVConfig().recompute
    with pytest.raises(ConfigError, match="recompute"):
        memory_config(ServerOptions(recompute="tail"))


def test_the_memory_layout_flag_reaches_the_memory_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--memory-layout added`` becomes the server's ``MemoryConfig.memory_layout``; unset, the config's default
    holds; a value the config refuses is a ``ConfigError`` before anything loads."""
    from inferscale.config import MemoryConfig
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    assert run_serve(_parse("--data-dir", str(tmp_path), "--memory-layout", "added")) == 0
    assert run_serve(_parse("--data-dir", str(tmp_path))) == 0
    assert [o.memory_layout for o in seen] == ["added", None]
    assert memory_config(seen[0]).memory_layout == "added"
    assert memory_config(seen[1]).memory_layout == MemoryConfig().memory_layout == "score"
    with pytest.raises(ConfigError, match="memory_layout"):
        memory_config(ServerOptions(memory_layout="newest"))
    with pytest.raises(SystemExit):  # argparse refuses a choice it does not list
        _parse("--memory-layout", "newest")


def test_the_shutdown_grace_flag_reaches_the_server_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--shutdown-grace`` becomes ``shutdown_grace_s`` (whole seconds for uvicorn, rounded up); unset, 30 s. The
    vLLM server reads the same flag (tests/engines/test_vllm_server.py)."""
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    assert run_serve(_parse("--data-dir", str(tmp_path), "--shutdown-grace", "2.5")) == 0
    assert run_serve(_parse("--data-dir", str(tmp_path))) == 0
    assert [(o.shutdown_grace_s, o.shutdown_grace_whole_s) for o in seen] == [(2.5, 3), (30.0, 30)]


def test_the_failed_key_check_flags_reach_the_servers_key_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--failed-key-checks-per-s`` and ``--failed-key-check-burst`` become the budget of the key store the server
    checks keys with; unset, 5 per second and 10."""
    from inferscale.server import run
    from inferscale.server.key_checks import KeyCheckLimits

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    flags = ("--failed-key-checks-per-s", "0.5", "--failed-key-check-burst", "3")
    assert run_serve(_parse("--data-dir", str(tmp_path), *flags)) == 0
    assert run_serve(_parse("--data-dir", str(tmp_path))) == 0
    assert [o.key_check_limits for o in seen] == [KeyCheckLimits(0.5, 3), KeyCheckLimits(5.0, 10)]
    assert run_serve(_parse("--data-dir", str(tmp_path), "--failed-key-check-burst", "0")) == 2
    assert "--failed-key-check-burst) must be a whole number from 1 to 1,000,000, got 0" in capsys.readouterr().err
    built: list[KeyStore] = []
    close = KeyStore.close

    def noting_close(store: KeyStore) -> None:  # the store serve_transformers built
        built.append(store)
        close(store)

    monkeypatch.setattr(KeyStore, "close", noting_close)
    with pytest.raises(ConfigError, match="without API keys"):  # refused after the store is built, before loading
        serve_transformers(ServerOptions(host="0.0.0.0", data_dir=str(tmp_path), failed_key_check_burst=3))
    assert [store._checks.limits for store in built] == [KeyCheckLimits(5.0, 3)]


@pytest.mark.parametrize("grace", ["-1", "nan", "inf", "1e10", "86400.5"])
def test_a_shutdown_grace_that_is_not_a_finite_number_of_seconds_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grace: str
) -> None:
    assert run_serve(_parse("--data-dir", str(tmp_path), "--shutdown-grace", grace)) == 2
    assert capsys.readouterr().err.startswith(
        f"error: shutdown grace must be a finite number of seconds >= 0 (at most 86,400), got {float(grace)}"
    )


@pytest.mark.parametrize("grace", ["5", None, True])
def test_a_shutdown_grace_given_in_code_that_is_not_a_number_is_a_config_error(grace: object) -> None:
    """From Python, ``ServerOptions(shutdown_grace_s="5")`` raised a bare ``TypeError`` from the comparison."""
    with pytest.raises(ConfigError, match="shutdown grace must be a finite number of seconds >= 0"):
        ServerOptions(shutdown_grace_s=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize("extra", [(), ("--recompute", "structure")])
def test_the_vllm_engine_without_vllm_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]
) -> None:
    """``serve --engine vllm`` in an environment without vLLM printed an import traceback and exited 1 (tester
    report), where ``bench --engine vllm`` says what to install and exits 2."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert run_serve(_parse("--engine", "vllm", "--data-dir", str(tmp_path), *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --engine vllm: vLLM is not installed") and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--max-request-bytes", "0"],
            "the request size limit (--max-request-bytes) must be a whole number of at least 1",
        ),
        (["--max-request-bytes", "-5"], "the request size limit (--max-request-bytes) must be a whole number"),
        (["--limit", "-3"], "the chat limit (--limit) must be a whole number from 0 to 1,000,000, got -3"),
        (["--port", "70000"], "port (--port) must be a whole number from 0 to 65,535, got 70000"),
        (["--port", "-1"], "port (--port) must be a whole number from 0 to 65,535, got -1"),
        (["--device", "tpu"], "device: String should match pattern '^(auto|cpu|cuda(:\\d+)?)$' (got 'tpu')"),
        # a review's finds: a 4,000-digit value was echoed whole, and a burst that large overflowed a float
        (["--port", "9" * 4000], "from 0 to 65,535, got an integer of 4,000 digits"),
        (["--failed-key-check-burst", "9" * 4000], "from 1 to 1,000,000, got an integer of 4,000 digits"),
    ],
)
def test_a_server_setting_out_of_range_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    """An SRE's report: ``--max-request-bytes -5`` started a server whose every request, ``/health`` included, got
    413; ``--limit -3`` one whose every chat got 400, blamed on the client; ``--port 70000`` and ``--device tpu``
    loaded the model and then died with a traceback (exit 1). Each is refused with one line and exit 2, before the
    model loads."""

    def load(self: TransformersEngine) -> TransformersEngine:
        raise AssertionError("the model was loaded: the setting was not checked first")

    monkeypatch.setattr(TransformersEngine, "load", load)
    assert run_serve(_parse("--data-dir", str(tmp_path), *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1  # one line
    assert len(err) < 300


def test_a_port_another_process_has_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new user's find: the server loaded the whole model, then uvicorn found the port taken and exited with its
    own status 3, which cli.md does not list."""
    import socket

    def must_not_load(options: ServerOptions) -> None:
        raise AssertionError("the model was about to load")

    monkeypatch.setattr("inferscale.server.run.serve_transformers", must_not_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert run_serve(_parse("--port", str(port), "--data-dir", str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot listen on 127.0.0.1:{port}: Address already in use") and "--port" in err
    for host, says in [("192.0.2.1", "give an address of this machine"), ("a\x00b", "cannot listen on 'a\\x00b'")]:
        assert run_serve(_parse("--host", host, "--port", str(port), "--data-dir", str(tmp_path))) == 2
        assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "level", "server_level"),
    [
        (["serve"], "warning", "info"),  # the access log stays on by default
        (["serve", "-v"], "info", "info"),  # refused after the command before (an operator tester's find)
        (["-v", "serve"], "info", "info"),
        (["serve", "--log-level", "error"], "error", "error"),  # keeps memory text (in warnings) out of the log
        (["--log-level", "debug", "serve", "-v"], "debug", "debug"),  # a level given wins over -v, wherever
    ],
)
def test_the_log_level_is_taken_before_or_after_the_command_and_reaches_uvicorn(
    argv: list[str], level: str, server_level: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferscale.cli import build_parser
    from inferscale.cli_options import log_level
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    args = build_parser().parse_args([*argv, "--data-dir", str(tmp_path)])
    assert log_level(args) == level
    assert run_serve(args) == 0 and seen[0].log_level == server_level


def test_every_command_takes_the_log_level_after_it() -> None:
    from inferscale.cli import build_parser
    from inferscale.cli_options import log_level

    for argv in (["list", "--user", "u"], ["keys", "create", "n", "--admin"], ["bench", "ttft"], ["eval", "fidelity"]):
        assert log_level(build_parser().parse_args([*argv, "--log-level", "error"])) == "error", argv


def test_the_serve_modules_own_entry_point_takes_the_log_level(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review's find: ``python -m inferscale.serve_cli serve`` (a parser built without the top level's options)
    failed on every start with an AttributeError once serve read the log level."""
    from inferscale import serve_cli
    from inferscale.server import run

    seen: list[ServerOptions] = []
    monkeypatch.setattr(run, "serve_transformers", seen.append)
    assert serve_cli.main(["serve", "--data-dir", str(tmp_path)]) == 0
    assert serve_cli.main(["serve", "--data-dir", str(tmp_path), "--log-level", "error"]) == 0
    assert run_serve(_parse("--data-dir", str(tmp_path))) == 0  # a bare parser, with no logging options at all
    assert [o.log_level for o in seen] == ["info", "error", "info"]


def test_verbose_is_taken_after_a_nested_command() -> None:
    from inferscale.cli import build_parser
    from inferscale.cli_options import log_level

    assert log_level(build_parser().parse_args(["keys", "create", "n", "--admin", "-v"])) == "info"
    assert log_level(build_parser().parse_args(["-v", "keys", "list"])) == "info"
    assert log_level(build_parser().parse_args(["keys", "list"])) == "warning"
