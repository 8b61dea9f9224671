"""The CLI tests run ``inferscale.cli.main`` in process on a temporary data folder, with the client the command
builds made of fakes: :class:`mem0_fakes.HashEmbedder`, a :class:`mem0_fakes.ScriptedGenerator` and a tiny float32
model (no model download, no slow load). Only the constructor the commands call is replaced
(``inferscale.commands.client.MemoryClient``), so the options are parsed and checked as in a real run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Fakes, Ran, make_store
from mem0_fakes import ScriptedGenerator
from tiny_models import tiny_engine

from inferscale import MemoryClient
from inferscale.cli import main
from inferscale.commands import client as clients


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


@pytest.fixture
def fakes(tmp_path: Path, engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fakes]:
    """Every client the commands build is :meth:`Fakes.client`; rich tables are 200 columns wide."""
    make_store(tmp_path / "data")  # an existing store: only `add` and `keys create` may open a folder without one
    made = Fakes(engine, ScriptedGenerator(), [], tmp_path / "data")
    monkeypatch.setattr(clients, "MemoryClient", made.client)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("INFERSCALE_API_KEY", raising=False)
    yield made


@pytest.fixture
def cli(fakes: Fakes, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """``cli("search", "dog", "--user", "alice")``: run the command on the test's data folder (``--data-dir`` is
    added unless ``local=False``)."""

    def run(*argv: str, local: bool = True) -> Ran:
        capsys.readouterr()
        args = [*argv, "--data-dir", str(fakes.data_dir)] if local else list(argv)
        code = main(args)
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run


@pytest.fixture
def reference(fakes: Fakes) -> Iterator[Callable[[], MemoryClient]]:
    """Opens a client on the test's data folder, as the commands build it, to compare their output with; closed
    after the test."""
    opened: list[MemoryClient] = []

    def open_reference() -> MemoryClient:
        client = fakes.client()
        opened.append(client)
        return client

    yield open_reference
    for client in opened:
        client.close()
