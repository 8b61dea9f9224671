"""What the CLI tests (tests/cli) share: the outcome of one command and the fake models its clients are built
with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem0_fakes import HashEmbedder, ScriptedGenerator

from inferscale import MemoryClient, MemoryConfig
from inferscale.commands.options import StoreOptions
from inferscale.storage import MemoryStore


def make_store(data_dir: Path) -> None:
    """Create an empty store in ``data_dir`` (its SQLite database with the schema): what every command but ``add`` and
    ``keys create`` needs to find there."""
    with MemoryStore(MemoryConfig(data_dir=str(data_dir)).database_url()) as store:
        assert store.dialect == "sqlite"  # the engine opened: the file and its schema exist


@dataclass(frozen=True)
class Ran:
    """What one command did: its exit code, stdout and stderr."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """stdout parsed as one JSON document (fails when anything else was printed there)."""
        return json.loads(self.out)


@dataclass
class Fakes:
    """The models every client a command builds gets; ``generator`` may be replaced by a test before a run.
    ``remote`` records the keyword arguments of ``MemoryClient(host=..., api_key=...)`` calls."""

    engine: Any
    generator: ScriptedGenerator
    remote: list[dict[str, Any]]
    data_dir: Path

    def client(self, config: MemoryConfig | None = None, **remote: Any) -> MemoryClient:
        """A client on ``config`` (default: the test's data folder) with the fakes; K/V encoded lazily, by chat."""
        if remote:
            self.remote.append(remote)
            config = None
        base = config or StoreOptions(data_dir=str(self.data_dir)).config()
        lazy = base.model_copy(update={"kv": base.kv.model_copy(update={"encode_on_add": False})})
        return MemoryClient(lazy, engine=self.engine, embedder=HashEmbedder(), generator=self.generator)
