"""The same fact added to the same scope at the same moment is stored once, on SQLite and PostgreSQL: adds gathered
on one async client (``infer=False`` and ``infer=True``; five rounds, each on a fresh client, whose first adds open
the engine together as in the issue's report), and two sync clients in threads. Before the adds took an advisory
lock on (scope, text) on PostgreSQL, four gathered adds stored 2 to 4 copies in 7 of 10 rounds."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config

from inferscale import AsyncMemoryClient, MemoryClient

COFFEE = "I really like coffee"
ROUNDS = 5
ADDS = 4


def generator() -> ScriptedGenerator:
    """Extraction finds the fact; a reconcile that sees it stored already says ADD anyway (the worst case)."""
    decision = {"memory": [{"id": "new", "text": COFFEE, "event": "ADD"}]}
    return ScriptedGenerator(facts(COFFEE), json.dumps(decision))


@pytest.mark.parametrize("infer", [False, True], ids=["infer-false", "infer-true"])
def test_gathered_async_adds_of_one_fact_store_it_once(db_url: str, tmp_path: Path, infer: bool) -> None:
    async def round_(user_id: str) -> tuple[int, int]:
        client = AsyncMemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=generator())
        try:
            outs = await asyncio.gather(*(client.add(COFFEE, user_id=user_id, infer=infer) for _ in range(ADDS)))
            stored = (await client.get_all(user_id=user_id))["results"]
            return len(stored), sum(len(out["results"]) for out in outs)
        finally:
            await client.close()

    copies = [asyncio.run(round_(f"u{r}")) for r in range(ROUNDS)]
    assert copies == [(1, 1)] * ROUNDS  # (copies stored, ADD results reported) per round


SYNC_ROUNDS = 10


def test_two_sync_clients_in_threads_store_one_fact_once(db_url: str, tmp_path: Path) -> None:
    """Two sync clients, engines open, add one fact in two threads at once, ten rounds (a scope each). Before the
    lock, 9 of 20 such rounds stored two copies on PostgreSQL."""
    clients = [
        MemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=ScriptedGenerator())
        for _ in range(2)
    ]
    for client in clients:
        client.get_all(user_id="warm-up")  # open each engine first: the adds race, not the first use
    copies = []
    errors: list[BaseException] = []
    for r in range(SYNC_ROUNDS):
        barrier = threading.Barrier(2)

        def add(client: MemoryClient, user_id: str = f"u{r}", barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                client.add(COFFEE, user_id=user_id, infer=False)
            except BaseException as exc:  # reported below; a thread cannot raise into the test
                errors.append(exc)

        threads = [threading.Thread(target=add, args=(client,)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        copies.append(len(clients[0].get_all(user_id=f"u{r}")["results"]))
    for client in clients:
        client.close()
    assert copies == [1] * SYNC_ROUNDS
