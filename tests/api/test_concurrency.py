"""Two threads and, separately, two processes share one SQLite file: 50 adds and 200 reads run concurrently.
No "database is locked", every memory present with its ADD history row, and each client finds the others'."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config

from inferscale import MemoryClient

ADDS_PER_WORKER = 25
READS_PER_WORKER = 100


def work(client: MemoryClient, tag: str) -> None:
    """25 adds interleaved with 100 reads (search, get_all, get, history)."""
    last_id = None
    for i in range(ADDS_PER_WORKER):
        out = client.add(f"{tag} fact number {i} about chess", user_id="shared", infer=False)
        last_id = out["results"][0]["id"]
        for j in range(READS_PER_WORKER // ADDS_PER_WORKER):
            if j == 0:
                client.search(f"{tag} chess {i}", user_id="shared", limit=3)
            elif j == 1:
                client.get_all(user_id="shared", limit=5)
            elif j == 2:
                client.get(last_id)
            else:
                client.history(last_id)


def check_complete(db_url: str, tmp_path: Path) -> None:
    client = MemoryClient(fake_config(tmp_path / "check", db_url), embedder=HashEmbedder())
    stored = client.get_all(user_id="shared", limit=1000)["results"]
    assert len(stored) == 2 * ADDS_PER_WORKER
    assert len({m["memory"] for m in stored}) == 2 * ADDS_PER_WORKER
    for memory in stored:
        assert [row["event"] for row in client.history(memory["id"])] == ["ADD"]
    hits = client.search("worker-b fact number 7", user_id="shared", limit=1)["results"]
    assert hits[0]["memory"] == "worker-b fact number 7 about chess"
    client.close()


@pytest.mark.parametrize("shared_client", [False, True], ids=["two-clients", "one-client"])
def test_two_threads_share_one_sqlite_file(tmp_path: Path, shared_client: bool) -> None:
    db_url = f"sqlite:///{tmp_path}/memory.db"
    one = MemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=ScriptedGenerator())
    clients = (
        [one, one] if shared_client else [one, MemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder())]
    )
    errors: list[BaseException] = []

    def run(client: MemoryClient, tag: str) -> None:
        try:
            work(client, tag)
        except BaseException as exc:  # reported below; a thread cannot raise into the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c, f"worker-{t}")) for c, t in zip(clients, "ab", strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    for client in clients:
        client.close()
    check_complete(db_url, tmp_path)


WORKER = """
import sys
sys.path[:0] = {paths!r}
from inferscale import MemoryClient
from mem0_fakes import HashEmbedder, fake_config
from test_concurrency import work
from pathlib import Path
client = MemoryClient(fake_config(Path({data!r}), {url!r}), embedder=HashEmbedder())
work(client, sys.argv[1])
client.close()
"""


@pytest.mark.slow  # two Python processes that import torch: seconds of CPU each
def test_two_processes_share_one_sqlite_file(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path}/memory.db"
    script = tmp_path / "worker.py"
    paths = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # this file's folder, the helpers'
    script.write_text(WORKER.format(paths=paths, data=str(tmp_path), url=db_url))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen([sys.executable, str(script), f"worker-{t}"], env=env, stderr=subprocess.PIPE, text=True)
        for t in "ab"
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        assert "database is locked" not in err
    check_complete(db_url, tmp_path)


def test_add_with_inference_and_search_at_once_both_finish(tmp_path: Path) -> None:
    """An ``add(infer=True)`` whose similar-memory step runs while a search holds the client: the two threads once
    took the client's lock and the derived stores' lock in opposite orders and hung for good. The scope read of the
    add waits until the search is inside its own scope read; the search's read then holds on until the add's step
    has gone on (or a second has passed). Both must finish."""
    add_reading, search_reading = threading.Event(), threading.Event()
    generator = ScriptedGenerator(facts("alice likes green tea"), '{"memory": []}')
    client = MemoryClient(fake_config(tmp_path), embedder=HashEmbedder(), generator=generator)
    client.add("alice likes tea", user_id="a", infer=False)
    read_scope = client.db.versions

    def timed_read(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "add":
            add_reading.set()
            search_reading.wait(5)
        elif threading.current_thread().name == "search":
            search_reading.set()
            time.sleep(1.0)  # the add's step, now past its read, computes meanwhile
        return read_scope(*args, **kwargs)

    client.db.versions = timed_read  # type: ignore[method-assign]  # a spy on the store's read
    results: dict[str, Any] = {}
    adder = threading.Thread(
        target=lambda: results.update(add=client.add("I like green tea", user_id="a")), name="add", daemon=True
    )
    adder.start()
    add_reading.wait(5)
    searcher = threading.Thread(
        target=lambda: results.update(search=client.search("tea", user_id="a")), name="search", daemon=True
    )
    searcher.start()
    adder.join(30)
    searcher.join(30)
    assert not adder.is_alive() and not searcher.is_alive(), "add and search deadlocked"
    assert [r["memory"] for r in results["add"]["results"]] == ["alice likes green tea"]
    assert results["search"]["results"][0]["memory"] in ("alice likes tea", "alice likes green tea")
    client.close()


class _Decoding(Exception):
    """Ends the stand-in answer below once released."""


def test_a_search_on_another_thread_runs_while_a_chat_decodes(tmp_path: Path) -> None:
    """A non-streamed chat held the client's lock through its whole answer, so a search on another thread of a web
    app waited for it to end (11 s behind a 64-token answer, a review). The lock covers choosing the memories and
    opening the answer; decoding runs outside it, as a stream's does."""
    decoding, released = threading.Event(), threading.Event()

    class LoadedEngine:
        def load(self) -> None:
            return None

    def answer(*args: Any) -> Any:
        def chunks() -> Any:
            decoding.set()
            released.wait(30)
            raise _Decoding
            yield

        return chunks()

    config = fake_config(tmp_path)
    with MemoryClient(config, embedder=HashEmbedder()) as writer:  # the model's tokenizer checks the fact fits
        writer.add("Maya lives in Porto.", user_id="maya", infer=False)
    engine: Any = LoadedEngine()
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        client._chunks = answer  # type: ignore[method-assign]  # stands for an answer decoding for seconds
        outcome: list[BaseException] = []

        def chat() -> None:
            try:
                client.chat("Where does Maya live?", user_id="maya")
            except _Decoding as exc:
                outcome.append(exc)

        chatting = threading.Thread(target=chat)
        chatting.start()
        try:
            assert decoding.wait(30)
            found: list[str] = []
            searching = threading.Thread(
                target=lambda: found.extend(r["memory"] for r in client.search("Porto", user_id="maya")["results"])
            )
            searching.start()
            searching.join(10)
            assert found == ["Maya lives in Porto."]  # answered while the chat was still decoding
        finally:
            released.set()
            chatting.join(30)
    assert len(outcome) == 1
