"""The worker that the multi-process storage test starts, and the helper that runs several: multiprocessing's
``forkserver`` (a fresh interpreter, started once per test session, that imports only the storage layer and the key
store, no torch, and forks each worker from that clean state: a worker starts in well under a second).
Each worker opens its own stores on the shared database, waits at a barrier so the workers' calls start together,
and reports through a queue: ``("ok", result)`` or ``("error", "<type>: <message>\n<traceback>")``. Also what the
schema tests read back: the version tables' rows."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, MetaData, inspect, text

from inferscale.scope import Scope
from inferscale.storage import Base, ChangeSet, MemoryStore, NewMemory, hash_text
from inferscale.storage.schema import MEMORY_SCHEMA, SchemaChain

FIRST_SCOPE = Scope(user_id="u0")
SCOPE = Scope(user_id="u1")

HEADS = {"inferscale_schema_version": ["0005_kv_store_id"], "inferscale_keys_schema_version": ["0001_api_keys"]}
"""The version tables of a database at both chains' heads, and their rows."""


def chains() -> list[tuple[SchemaChain, MetaData]]:
    """Both schema chains with the models their head must equal: the memory store's and the API keys'."""
    from inferscale.server.keys import KEYS_SCHEMA, _Base

    return [(MEMORY_SCHEMA, Base.metadata), (KEYS_SCHEMA, _Base.metadata)]


def revisions(engine: Engine) -> dict[str, list[str]]:
    """The revision rows of both version tables, by table (absent tables left out)."""
    found: dict[str, list[str]] = {}
    with engine.connect() as conn:
        for chain, _ in chains():
            if inspect(conn).has_table(chain.version_table):
                rows = conn.execute(text(f"select version_num from {chain.version_table}"))
                found[chain.version_table] = [row[0] for row in rows]
    return found


def report(results: Any, barrier: Any, work: Callable[[], Any]) -> None:
    """Put ``("ok", work())`` on ``results``, or ``("error", ...)`` with the exception's type, text and traceback
    (and break the barrier, so the other workers stop waiting at once)."""
    try:
        results.put(("ok", work()))
    except BaseException as exc:  # reported to the test, which names it
        barrier.abort()
        results.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def share_new_database(url: str, barrier: Any, results: Any, worker: int, texts: list[str], n_updates: int) -> None:
    """One of several processes sharing one new database, in three phases, each started at once in every worker:

    1. first use: open a memory store and a key store, add ``"worker W opened the database"`` to scope ``u0`` and
       list the keys (both schema chains are created or found);
    2. duplicates: for each of ``texts`` in turn, add it to scope ``u1`` as ``add(infer=...)`` does (a change set
       that skips a text already stored in the scope);
    3. updates: update the memory of ``texts[0]`` ``n_updates`` times with texts ``"worker W update I"``.

    Reports ``{"first": id, "stored": how many of texts this worker stored, "memory_id": the updated memory's id,
    "acknowledged": the update texts acknowledged, in order}``.
    """

    def work() -> dict[str, Any]:
        from inferscale.server.keys import KeyStore

        store, keys = MemoryStore(url), KeyStore(url)
        try:
            barrier.wait()
            first = store.add(f"worker {worker} opened the database", FIRST_SCOPE).id
            keys.list()
            stored = 0
            for text in texts:
                barrier.wait()
                stored += len(store.apply(ChangeSet(SCOPE, adds=(NewMemory(text),))).added)
            barrier.wait()
            found = store.memories_with_hash(hash_text(texts[0]), SCOPE)
            assert found, f"{texts[0]!r} was not stored"
            target = found[0]
            barrier.wait()  # every worker has found the memory before any update re-words it
            acknowledged = []
            for i in range(n_updates):
                update = f"worker {worker} update {i}"
                store.update(target.id, update)
                acknowledged.append(update)
            return {"first": first, "stored": stored, "memory_id": target.id, "acknowledged": acknowledged}
        finally:
            store.close()
            keys.close()

    report(results, barrier, work)


def run_workers(target: Callable[..., None], n: int, args: Callable[[int], tuple[Any, ...]], url: str) -> list[Any]:
    """Start ``n`` processes (forked from the forkserver) running ``target(url, barrier, results, *args(i))`` and
    return their results, in the order they arrived.

    Raises:
        AssertionError: when a worker reported an error, or did not report within 120 seconds.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["store_workers", "inferscale.server.keys"])
    barrier, results = ctx.Barrier(n, timeout=60), ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, barrier, results, *args(i))) for i in range(n)]
    for proc in procs:
        proc.start()
    try:
        reports = [results.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    errors = [text for status, text in reports if status == "error"]
    assert errors == [], "\n".join(errors)
    return [value for _, value in reports]
