"""``kv.encode_on_add="background"``: ``add`` returns before its memories' K/V are encoded, and one background
thread encodes them (issue 16, item 1). Every test holds the background thread at a gate inside its forward pass
(:class:`Gate`), so what ``add``, ``chat``, ``update``, ``delete`` and ``close`` do while an encoding is pending is
checked without timing: chat right after add injects the new memories with the K/V (and the answer) of an eager
client; close waits for the queue; a full queue blocks add and loses or repeats nothing; a memory changed while it
waits gets no stale K/V; a failing encoder loses nothing.

On a tiny float32 model with a byte-level tokenizer (fast, real encoding), on both databases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from client_adapter import ClientAdapter, ClientKind, open_client
from mem0_fakes import HashEmbedder
from served_kv import context_free_request
from tiny_models import tiny_engine

from inferscale import ConfigError, InvalidInputError, MemoryConfig
from inferscale.config import KVConfig
from inferscale.encode_queue import ENCODER_NICENESS, THREAD_NAME, _lower_priority
from inferscale.fact_kv import CONTEXT_FREE, IN_CONTEXT, Encoding
from inferscale.kv import FactKV, KVStore
from inferscale.mem0_config import config_from_dict
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara teaches in Madrid."]
QUESTION = "What is my dog called?"
GATE_TIMEOUT_S = 60.0
"""How long the background thread waits at a closed gate before it gives up (a test that forgot to open it)."""


class Gate:
    """Stands in for the engine's ``encode_facts``: on the background encoder's thread, each call first says it
    arrived and waits until the gate is opened (then raises if ``fail``); every other thread passes at once. Counts
    the facts the background thread encoded."""

    def __init__(self, engine: Any) -> None:
        self._encode = engine.encode_facts
        self.arrived = threading.Event()
        self.opened = threading.Event()
        self.fail = False
        self.background_facts = 0
        self.niceness: int | None = None  # the background thread's, on Linux

    def __call__(self, requests: Sequence[Any]) -> list[FactKV]:
        if threading.current_thread().name == THREAD_NAME:
            if sys.platform.startswith("linux"):
                self.niceness = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            self.arrived.set()
            if not self.opened.wait(GATE_TIMEOUT_S):
                raise TimeoutError("the test never opened the gate")
            if self.fail:
                raise RuntimeError("the encoder failed (test)")
            self.background_facts += len(requests)
        return self._encode(requests)

    def open_later(self, delay_s: float = 0.3) -> None:
        """Open the gate from another thread after ``delay_s`` (while this one is blocked in ``close``)."""
        threading.Timer(delay_s, self.opened.set).start()


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


@pytest.fixture
def gate(engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    closed = Gate(engine)
    monkeypatch.setattr(engine, "encode_facts", closed)
    yield closed
    closed.opened.set()


def _config(data_dir: Path, db_url: str | None, **kv: Any) -> MemoryConfig:
    """One encoding per memory (``kv.first_memory_context_free`` off), so the queue's counts below are memories;
    the second encoding on this path: tests/api/test_first_memory_context_free.py."""
    return MemoryConfig(
        data_dir=str(data_dir), db_url=db_url, kv=KVConfig(**{"first_memory_context_free": False, **kv})
    )


def _client(kind: ClientKind, config: MemoryConfig, engine: Any) -> ClientAdapter:
    if kind in ("remote", "remote-async"):
        pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install 'inferscale-memory[server]')")
    return open_client(kind, config, engine=engine, embedder=HashEmbedder())


def _add_each(client: ClientAdapter, facts: Sequence[str], **kwargs: Any) -> list[str]:
    """Add each fact on its own call (so each is encoded after the ones before it); their ids."""
    return [client.add(fact, user_id="maya", infer=False, **kwargs)["results"][0]["id"] for fact in facts]


def _record(client: ClientAdapter, memory_id: str) -> MemoryRecord:
    record = client.db.get(memory_id)
    assert record is not None
    return record


def _stored(client: ClientAdapter, memory_id: str, encoding: Encoding = IN_CONTEXT) -> FactKV | None:
    """The K/V of ``memory_id``'s current text and context (its ``encoding``) in the client's disk tier (read with a
    store of its own), or ``None``; a stored entry must have its ``kv_entries`` row."""
    record = _record(client, memory_id)
    key = client.fact_kv.key(record, encoding)
    fact = KVStore(Path(client.config.data_path()) / "kv").get(key)
    if fact is not None:
        row = client.db.get_kv_entry(memory_id, key.fingerprint, key.encoding_key)
        assert row is not None and row.text_hash == record.hash
    return fact


def _kv_files(client: ClientAdapter, memory_id: str) -> list[Path]:
    return sorted((Path(client.config.data_path()) / "kv" / memory_id).glob("*.safetensors"))


def _assert_fresh(client: ClientAdapter, engine: Any, memory_id: str, encoding: Encoding = IN_CONTEXT) -> None:
    """The stored K/V of ``memory_id`` (its ``encoding``) are, bit for bit, what the engine encodes for it now: after
    its context turns, or for :data:`CONTEXT_FREE` after the system prefix alone."""
    stored = _stored(client, memory_id, encoding)
    assert stored is not None, f"no K/V stored for {memory_id}"
    record = _record(client, memory_id)
    request = (
        context_free_request(engine, record.text) if encoding.context_free else client.fact_kv.encode_request(record)
    )
    (fresh,) = engine.encode_facts([request])
    assert torch.equal(stored.token_ids, fresh.token_ids) and stored.encoded_at == fresh.encoded_at
    assert torch.equal(stored.keys, fresh.keys) and torch.equal(stored.values, fresh.values)


def _assert_encoded(client: ClientAdapter, engine: Any, memory_id: str) -> None:
    """As :func:`_assert_fresh`, for a memory encoded in a chunk beside others: the same tokens and positions, and
    K/V equal up to the rounding of another batch shape (padding beside longer facts: docs/api.md, ~1e-5)."""
    stored = _stored(client, memory_id)
    assert stored is not None, f"no K/V stored for {memory_id}"
    (fresh,) = engine.encode_facts([client.fact_kv.encode_request(_record(client, memory_id))])
    assert torch.equal(stored.token_ids, fresh.token_ids) and stored.encoded_at == fresh.encoded_at
    assert torch.allclose(stored.keys, fresh.keys, rtol=0, atol=1e-4)
    assert torch.allclose(stored.values, fresh.values, rtol=0, atol=1e-4)


def _kv_rows(client: ClientAdapter) -> list[tuple[str, str]]:
    return sorted((row.memory_id, row.text_hash) for row in client.db.all_kv_entries())


# ---- chat right after add ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_chat_right_after_add_injects_the_new_memories_as_an_eager_client_does(
    kind: ClientKind, tmp_path: Path, db_url: str, engine: Any, gate: Gate
) -> None:
    eager = _client("sync", _config(tmp_path / "eager", None), engine)
    _add_each(eager, FACTS, encode_kv=True)
    expected = eager.chat(QUESTION, user_id="maya", limit=3, max_new_tokens=12)

    client = _client(kind, _config(tmp_path / "background", db_url), engine)
    try:
        ids = _add_each(client, FACTS)
        assert gate.arrived.wait(GATE_TIMEOUT_S)  # the background thread holds the first add's memory
        assert [_stored(client, memory_id) for memory_id in ids] == [None] * 3  # add returned before encoding
        assert client.search(QUESTION, user_id="maya", limit=1)["results"][0]["id"] == ids[0]  # searchable at once

        result = client.chat(QUESTION, user_id="maya", limit=3, max_new_tokens=12)
        assert sorted(result.memory_ids) == sorted(ids)
        assert result.memories == expected.memories
        assert (result.answer, result.memory_tokens, result.prompt_tokens) == (
            expected.answer,
            expected.memory_tokens,
            expected.prompt_tokens,
        )
        by_text = {_record(client, memory_id).text: memory_id for memory_id in ids}
        for text, want in zip(FACTS, eager.client.memory_kv(_eager_ids(eager)), strict=True):  # type: ignore[arg-type]
            got = _stored(client, by_text[text])  # chat stored what it encoded
            assert got is not None and torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)
        rows = {row.memory_id: row.created_at for row in client.db.all_kv_entries()}

        gate.opened.set()
        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        assert {row.memory_id: row.created_at for row in client.db.all_kv_entries()} == rows  # the thread skipped them
    finally:
        gate.opened.set()
        client.close()
        eager.close()


def _eager_ids(eager: ClientAdapter) -> list[str]:
    """The eager client's memory ids in :data:`FACTS` order."""
    by_text = {m["memory"]: m["id"] for m in eager.get_all(user_id="maya")["results"]}
    return [by_text[text] for text in FACTS]


# ---- close drains ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async", "remote"])
def test_close_waits_until_every_queued_memory_is_encoded(
    kind: ClientKind, tmp_path: Path, db_url: str, engine: Any, gate: Gate
) -> None:
    config = _config(tmp_path, db_url)
    client = _client(kind, config, engine)
    ids = _add_each(client, FACTS)
    assert gate.arrived.wait(GATE_TIMEOUT_S)
    served = client._local  # a remote client's server's client: the server's shutdown drains it
    assert served.derived.pending_encoding() == ids
    gate.open_later()
    client.close()
    assert served.derived.pending_encoding() == []
    assert gate.background_facts == 3  # the background thread encoded them all, nothing else did

    reopened = _client("sync", config, engine)
    try:
        for memory_id in ids:
            _assert_fresh(reopened, engine, memory_id)
        reopened.client.memory_kv(ids)  # type: ignore[union-attr]
        stats = reopened.client.derived.kv_stats()  # type: ignore[union-attr]
        assert stats is not None and stats.misses == 0  # all found on disk, none encoded again
    finally:
        reopened.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_add_after_close_is_left_to_chat_and_starts_no_encoder(
    kind: ClientKind, tmp_path: Path, engine: Any, gate: Gate
) -> None:
    client = _client(kind, _config(tmp_path, None), engine)
    try:
        (first,) = _add_each(client, FACTS[:1])
        gate.opened.set()
        client._call(client.client.close)  # the client's close, keeping the adapter's event loop
        (late,) = _add_each(client, FACTS[1:2])  # the client reopens its database for it, not the encoder
        assert client.client.derived.pending_encoding() == []  # type: ignore[union-attr]
        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        assert gate.background_facts == 1  # only the memory added before close
        _assert_fresh(client, engine, first)
        assert _stored(client, late) is None  # left to chat, as in lazy mode
        result = client.chat(QUESTION, user_id="maya", memory_ids=[late], max_new_tokens=4)
        assert result.memories == [FACTS[1]]
        _assert_fresh(client, engine, late)  # the chat encoded it
    finally:
        client.close()


class WatchedCondition(threading.Condition):
    """A condition that sets :attr:`waiting` when ``watched`` (a thread) is about to wait on it: says, without
    timing, that a thread has reached a blocking wait (the queue's full-queue wait, the encoder's yield)."""

    def __init__(self, watched: threading.Thread | str) -> None:
        super().__init__()
        self._watched = watched
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        current = threading.current_thread()
        if current is self._watched or current.name == self._watched:
            self.waiting.set()
        return super().wait(timeout)


def test_adds_after_close_warn_once_that_their_kv_are_left_to_chat(
    tmp_path: Path, engine: Any, gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    """Review: every add after close() logged at INFO that its K/V were left to chat; the first now warns, the
    later ones log at DEBUG."""
    client = _client("sync", _config(tmp_path, None), engine)
    try:
        client.client.close()  # type: ignore[union-attr]
        with caplog.at_level(logging.DEBUG, logger="inferscale.encode_queue"):
            _add_each(client, FACTS)
        records = [r for r in caplog.records if r.name == "inferscale.encode_queue"]
        assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
        assert "left to the first chat" in records[0].getMessage()
    finally:
        client.close()


def test_close_stops_an_add_waiting_for_room_and_leaves_its_memory_to_chat(
    tmp_path: Path, engine: Any, gate: Gate
) -> None:
    """An add blocked on a full queue while close() drains it does not queue its memory once close has begun (the
    old queue took it when room came, and its thread then ran on a client close() had released)."""
    client = _client("sync", _config(tmp_path, None, encode_queue_size=1, encode_batch_size=1), engine)
    try:
        first, second = _add_each(client, FACTS[:2])  # the thread holds the first; the second fills the queue
        assert gate.arrived.wait(GATE_TIMEOUT_S)
        third: list[str] = []
        adder = threading.Thread(target=lambda: third.extend(_add_each(client, FACTS[2:])))
        queue = client.client.derived._encoder  # type: ignore[union-attr]
        queue._cond = WatchedCondition(adder)
        adder.start()
        assert queue._cond.waiting.wait(GATE_TIMEOUT_S)  # blocked in submit: no room in the queue
        closer = threading.Thread(target=client.close)
        closer.start()
        adder.join(GATE_TIMEOUT_S)  # close() stops its wait while the thread still holds the first memory
        assert not adder.is_alive() and not gate.opened.is_set()
        gate.opened.set()
        closer.join(GATE_TIMEOUT_S)
        assert not closer.is_alive()
        assert gate.background_facts == 2
        for memory_id in (first, second):
            _assert_fresh(client, engine, memory_id)
        assert _stored(client, third[0]) is None  # its memory is in SQL; chat encodes it
        assert [m["id"] for m in client.get_all(user_id="maya")["results"]] == [first, second, *third]
    finally:
        gate.opened.set()
        client.close()


MANY = [f"Locker {i} holds my spare key number {i * 7}." for i in range(12)]
"""Twelve memories: the first batch's memory, then three batches of four."""


class Turnstile(Gate):
    """A :class:`Gate` that holds each background encode call on its own: the call signals :attr:`arrivals` and
    waits for one :attr:`permits` release, so a test lets the encoder through chunk by chunk. Counts the calls."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.arrivals = threading.Semaphore(0)
        self.permits = threading.Semaphore(0)
        self.background_calls = 0

    def __call__(self, requests: Sequence[Any]) -> list[FactKV]:
        if threading.current_thread().name == THREAD_NAME and not self.opened.is_set():
            self.background_calls += 1
            self.arrivals.release()
            if not self.permits.acquire(timeout=GATE_TIMEOUT_S):
                raise TimeoutError("the test never let the call through")
            self.background_facts += len(requests)
            return self._encode(requests)
        return super().__call__(requests)


@pytest.fixture
def turnstile(engine: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Turnstile]:
    held = Turnstile(engine)
    monkeypatch.setattr(engine, "encode_facts", held)
    yield held
    held.opened.set()
    for _ in range(len(MANY)):
        held.permits.release()


class UntimedWaitCondition(threading.Condition):
    """Sets :attr:`stopped` when a thread other than the encoder waits on it with no timeout: in a bounded
    ``close``, the wait for the chunk running once the timeout is spent (the encoder is told to stop by then)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None and threading.current_thread().name != THREAD_NAME:
            self.stopped.set()
        return super().wait(timeout)


def _run_held_then_close(
    client: ClientAdapter, turnstile: Turnstile, close: Any, caplog: pytest.LogCaptureFixture
) -> list[str]:
    """Add :data:`MANY` one by one, the encoder held on the first memory's call; let that call through, hold the
    second (the first chunk of the batch of memories 1-4), then run ``close`` on a thread: once it has stopped the
    encoder and waits for that chunk, let the chunk through. Returns the memories' ids."""
    (first,) = _add_each(client, MANY[:1])
    assert turnstile.arrivals.acquire(timeout=GATE_TIMEOUT_S)  # the thread holds [first]
    ids = [first, *_add_each(client, MANY[1:])]  # all waiting behind it
    turnstile.permits.release()
    assert turnstile.arrivals.acquire(timeout=GATE_TIMEOUT_S)  # its next batch's first chunk is held
    queue = client._local.derived._encoder
    assert queue.pending() == ids[1:]
    queue._cond = UntimedWaitCondition()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            close()
        except BaseException as exc:
            errors.append(exc)

    closer = threading.Thread(target=run)
    with caplog.at_level(logging.WARNING, logger="inferscale.encode_queue"):
        closer.start()
        assert queue._cond.stopped.wait(GATE_TIMEOUT_S)  # the timeout is spent: close waits for the chunk
        assert closer.is_alive()  # the forward pass running is never cut
        turnstile.permits.release()
        closer.join(GATE_TIMEOUT_S)
    assert not closer.is_alive() and errors == []
    return ids


@pytest.mark.parametrize(("kind", "timeout"), [("sync", 0.0), ("async", 0.05)])
def test_a_bounded_close_stops_the_encoder_after_its_running_chunk_and_loses_nothing(
    kind: ClientKind,
    timeout: float,
    tmp_path: Path,
    db_url: str,
    engine: Any,
    turnstile: Turnstile,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tester: ``inferscale serve --shutdown-grace 8`` exited 67.6 s after SIGTERM, the encoder draining 69
    memories at close. ``close(encoding_timeout=...)`` stops it once the timeout is spent: the chunk running is
    stored, no later chunk (of its batch or the next) starts, the memories left are counted in a WARNING, and every
    one is in SQL and encoded later by ``prepare_kv`` (or the first chat)."""
    client = _client(kind, _config(tmp_path, db_url, encode_batch_size=4, encode_chunk_size=2), engine)
    try:
        ids = _run_held_then_close(
            client, turnstile, lambda: client._call(client.client.close, encoding_timeout=timeout), caplog
        )
        assert turnstile.background_calls == 2  # [first], then memories 1-2; memories 3-4's chunk never started
        assert turnstile.background_facts == 3
        assert client._local.derived.pending_encoding() == []
        warnings = [r.getMessage() for r in caplog.records if r.name == "inferscale.encode_queue"]
        assert len(warnings) == 1 and "the K/V of 9 memories were not encoded" in warnings[0], warnings
        assert "inferscale prepare-kv" in warnings[0]
        for memory_id in ids[:3]:
            _assert_encoded(client, engine, memory_id)
        assert [_stored(client, memory_id) for memory_id in ids[3:]] == [None] * 9
        assert [m["id"] for m in client.get_all(user_id="maya", limit=100)["results"]] == ids  # all in SQL

        turnstile.opened.set()
        report = client._call(client.client.prepare_kv, user_id="maya")
        assert (report.memories, report.encoded, report.left) == (12, 9, ())
        for memory_id in ids:
            _assert_encoded(client, engine, memory_id)
        assert turnstile.background_calls == 2  # prepare_kv encoded them on its own thread
    finally:
        turnstile.opened.set()
        client.close()


def test_a_close_without_a_timeout_still_drains_the_whole_queue(
    tmp_path: Path, engine: Any, turnstile: Turnstile
) -> None:
    client = _client("sync", _config(tmp_path, None, encode_batch_size=4, encode_chunk_size=2), engine)
    try:
        (first,) = _add_each(client, MANY[:1])
        assert turnstile.arrivals.acquire(timeout=GATE_TIMEOUT_S)
        ids = [first, *_add_each(client, MANY[1:])]
        for _ in range(len(MANY)):  # more permits than the calls need
            turnstile.permits.release()
        client.client.close()  # type: ignore[union-attr]
        assert turnstile.background_facts == 12
        for memory_id in ids:
            _assert_encoded(client, engine, memory_id)
    finally:
        client.close()


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), "1", True])
def test_a_bad_encoding_timeout_is_refused_before_anything_is_closed(
    tmp_path: Path, engine: Any, gate: Gate, timeout: object
) -> None:
    client = _client("sync", _config(tmp_path, None), engine)
    try:
        with pytest.raises(InvalidInputError, match="encoding_timeout must be None or a finite number of seconds"):
            client.client.close(encoding_timeout=timeout)  # type: ignore[union-attr, arg-type]
        (memory_id,) = _add_each(client, FACTS[:1])
        assert client.client.derived.pending_encoding() == [memory_id]  # type: ignore[union-attr]  # still open
    finally:
        gate.opened.set()
        client.close()


def test_the_server_gives_the_encoder_what_is_left_of_its_shutdown_grace(
    tmp_path: Path, engine: Any, turnstile: Turnstile, caplog: pytest.LogCaptureFixture
) -> None:
    """The app's lifespan closes its client with ``encoding_timeout`` = the grace minus the time since the server
    began stopping (:class:`ShutdownClock`): here the requests used all of it, so the encoder stops at once."""
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install 'inferscale-memory[server]')")
    from server_fixture import running_server

    import inferscale.server.shutdown as shutdown
    from inferscale import AsyncMemoryClient, MemoryClient
    from inferscale.server.app import create_app
    from inferscale.server.options import ServerOptions

    now = [1000.0]
    clock = shutdown.ShutdownClock(lambda: now[0])
    config = _config(tmp_path, None, encode_batch_size=4, encode_chunk_size=2)
    served = AsyncMemoryClient(config, engine=engine, embedder=HashEmbedder())
    server = contextlib.ExitStack()
    app = create_app(served, keys=None, options=ServerOptions(shutdown_grace_s=30), shutdown_clock=clock)
    client = ClientAdapter(MemoryClient(host=server.enter_context(running_server(app))), served, server)

    def stop_server() -> None:
        clock.begin()  # the signal, at 1000 s
        now[0] += 30  # the running requests took the whole grace
        server.close()  # the lifespan's shutdown: closes the client

    try:
        ids = _run_held_then_close(client, turnstile, stop_server, caplog)
        assert (turnstile.background_calls, turnstile.background_facts) == (2, 3)
        warnings = [r.getMessage() for r in caplog.records if r.name == "inferscale.encode_queue"]
        assert len(warnings) == 1 and "(0.0 s drain limit)" in warnings[0] and "of 9 memories" in warnings[0]
        assert [_stored(client, memory_id) for memory_id in ids[3:]] == [None] * 9
    finally:
        turnstile.opened.set()
        client.close()  # the remote client, then the server (closed already)


def test_the_async_close_counts_its_encoding_timeout_from_the_call_not_from_a_free_model_thread(
    tmp_path: Path, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's find: the async close computed the encoder's timeout before waiting for a model thread, so with
    every model thread busy the timeout started late and a server's grace was overrun. The thread now gets what is
    left of the timeout when it starts: here the clock moves 5 s past a 2 s timeout before it does, so 0."""
    import inferscale.async_client as async_client
    from inferscale import AsyncMemoryClient

    client = AsyncMemoryClient(_config(tmp_path, None), engine=engine, embedder=HashEmbedder())
    real_monotonic, skipped = time.monotonic, [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + skipped[0])  # the clock, jumped ahead below
    given: list[float | None] = []
    close_encoding = client.derived.close_encoding

    def noting(timeout: float | None = None) -> list[str]:
        given.append(timeout)
        return close_encoding(timeout)

    monkeypatch.setattr(client.derived, "close_encoding", noting)
    real_on_threads = async_client.on_threads

    async def late_thread(pool: Any, fn: Any, *args: Any) -> Any:
        skipped[0] += 5.0  # every model thread was busy for 5 s
        return await real_on_threads(pool, fn, *args)

    monkeypatch.setattr(async_client, "on_threads", late_thread)
    asyncio.run(client.close(encoding_timeout=2.0))
    assert given == [0.0]  # was [2.0]


def test_the_shutdown_clock_counts_the_grace_from_its_first_begin() -> None:
    import inferscale.server.shutdown as shutdown

    now = [50.0]
    clock = shutdown.ShutdownClock(lambda: now[0])
    clock.begin()
    now[0] = 53.5
    clock.begin()  # a second signal does not restart it
    assert clock.left(8) == 4.5
    now[0] = 60.0
    assert clock.left(8) == 0.0  # spent: never negative
    unbegun = shutdown.ShutdownClock(lambda: now[0])
    assert unbegun.left(8) == 8.0  # begun by the first look


def test_the_server_metrics_count_the_memories_waiting_for_the_encoder(tmp_path: Path, engine: Any, gate: Gate) -> None:
    pytest.importorskip("prometheus_client", reason="the server's metrics need prometheus-client")
    from prometheus_client.parser import text_string_to_metric_families

    from inferscale.server.metrics import Metrics

    client = _client("async", _config(tmp_path, None), engine)
    metrics = Metrics(client.client)  # type: ignore[arg-type]

    def pending() -> float:
        families = text_string_to_metric_families(metrics.render().decode())
        (value,) = [s.value for f in families for s in f.samples if s.name == "inferscale_kv_encode_pending"]
        return value

    try:
        assert pending() == 0
        _add_each(client, FACTS)
        assert gate.arrived.wait(GATE_TIMEOUT_S)
        assert pending() == 3  # the first being encoded, two waiting
        gate.opened.set()
        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        assert pending() == 0
    finally:
        gate.opened.set()
        client.close()


# ---- back-pressure -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_full_queue_blocks_add_until_there_is_room_and_loses_or_repeats_nothing(
    kind: ClientKind, tmp_path: Path, db_url: str, engine: Any, gate: Gate
) -> None:
    client = _client(kind, _config(tmp_path, db_url, encode_queue_size=1, encode_batch_size=1), engine)
    try:
        first, second = _add_each(client, FACTS[:2])  # the thread holds the first; the second fills the queue
        assert gate.arrived.wait(GATE_TIMEOUT_S)
        assert client.client.derived.pending_encoding() == [first, second]  # type: ignore[union-attr]

        third: list[str] = []
        adder = threading.Thread(target=lambda: third.extend(_add_each(client, FACTS[2:])))
        adder.start()
        adder.join(0.5)
        assert adder.is_alive()  # blocked: no room in the queue
        assert len(client.db.list(Scope(user_id="maya"), limit=10)) == 3  # its memory is committed all the same

        gate.opened.set()
        adder.join(GATE_TIMEOUT_S)
        assert not adder.is_alive()
        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        ids = [first, second, *third]
        assert gate.background_facts == 3  # each memory encoded once
        assert _kv_rows(client) == sorted((memory_id, _record(client, memory_id).hash) for memory_id in ids)
        for memory_id in ids:
            _assert_fresh(client, engine, memory_id)
    finally:
        gate.opened.set()
        client.close()


# ---- a chat waits for one chunk at most ----------------------------------------------------------------------------


class ModelGate(Gate):
    """A :class:`Gate` whose background calls wait at the gate holding the engine's model lock, as a forward pass
    does. A call on any other thread (a chat's encoding) records how many facts the background thread had encoded
    when it got the model. :meth:`watch` says when a chat has marked its use of the model (then it waits for the
    model, in the engine's ``load``)."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self._model_lock = engine.model_lock
        self.foreground_arrived = threading.Event()
        self.background_done = 0
        self.done_when_foreground_ran: list[int] = []

    def watch(self, derived: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """Set :attr:`foreground_arrived` when a foreground use of ``derived``'s model begins."""
        mark = derived.foreground

        @contextlib.contextmanager
        def marked() -> Iterator[None]:
            with mark():
                self.foreground_arrived.set()
                yield

        monkeypatch.setattr(derived, "foreground", marked)

    def __call__(self, requests: Sequence[Any]) -> list[FactKV]:
        if threading.current_thread().name != THREAD_NAME:
            with self._model_lock:
                self.done_when_foreground_ran.append(self.background_done)
                return self._encode(requests)
        with self._model_lock:
            encoded = super().__call__(requests)
            self.background_done += len(requests)
            return encoded


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_chat_arriving_during_a_background_batch_waits_for_one_chunk_only(
    kind: ClientKind, tmp_path: Path, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = ModelGate(engine)
    monkeypatch.setattr(engine, "encode_facts", gate)
    client = _client(kind, _config(tmp_path, None, encode_chunk_size=1), engine)
    gate.watch(client.client.derived, monkeypatch)  # type: ignore[union-attr]
    try:
        messages = [{"role": "user", "content": fact} for fact in FACTS]
        ids = [m["id"] for m in client.add(messages, user_id="maya", infer=False)["results"]]  # one batch of 3
        assert gate.arrived.wait(GATE_TIMEOUT_S)  # the thread holds the model, encoding its first chunk
        answers: list[Any] = []
        chat = threading.Thread(target=lambda: answers.append(client.chat(QUESTION, user_id="maya", limit=3)))
        chat.start()
        assert gate.foreground_arrived.wait(GATE_TIMEOUT_S)  # the chat marked its use and waits for the model
        gate.opened.set()
        chat.join(GATE_TIMEOUT_S)
        assert not chat.is_alive()
        assert gate.done_when_foreground_ran == [1]  # the old encoder held the model for all 3 facts
        assert sorted(answers[0].memory_ids) == sorted(ids)

        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        assert gate.background_done == 1  # the thread dropped the two facts the chat had stored meanwhile
        for memory_id in ids:
            _assert_fresh(client, engine, memory_id)
    finally:
        gate.opened.set()
        client.close()


def test_the_background_encoder_waits_while_a_chat_uses_the_model(tmp_path: Path, engine: Any, gate: Gate) -> None:
    """A chat marks its use of the model; the encoder starts no chunk until it ends (a streamed chat: its steps)."""
    client = _client("sync", _config(tmp_path, None), engine)
    try:
        derived = client.client.derived  # type: ignore[union-attr]
        gate.opened.set()
        with derived.foreground():
            _add_each(client, FACTS[:1])
            assert client.wait_for_encoding(0.2) is False  # the encoder waits for the foreground use to end
            assert gate.background_facts == 0 and not gate.arrived.is_set()
        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        assert gate.background_facts == 1
    finally:
        client.close()


def test_chats_that_keep_overlapping_do_not_starve_the_background_encoder(
    tmp_path: Path, engine: Any, gate: Gate
) -> None:
    """Review: the encoder waited until no chat used the model at all, so chats that kept overlapping (each one
    beginning before the one before it ended) held it off for good. It waits only for the uses it found running."""
    client = _client("sync", _config(tmp_path, None), engine)
    derived = client.client.derived  # type: ignore[union-attr]
    derived._foreground_idle = yielding = WatchedCondition(THREAD_NAME)
    running: list[contextlib.AbstractContextManager[None]] = []

    def begin_chat() -> None:
        running.append(derived.foreground())
        running[-1].__enter__()

    try:
        gate.opened.set()
        begin_chat()
        _add_each(client, FACTS[:1])
        assert yielding.waiting.wait(GATE_TIMEOUT_S)  # the encoder found the first chat and waits for it
        for _ in range(3):
            begin_chat()  # each chat begins before the one before it ends: the model is never idle
            running.pop(0).__exit__(None, None, None)
        assert len(running) == 1
        assert client.wait_for_encoding(GATE_TIMEOUT_S)  # the old encoder waited here while the last chat ran
        assert gate.background_facts == 1
    finally:
        while running:
            running.pop().__exit__(None, None, None)
        client.close()


def test_an_async_chat_marks_its_use_of_the_model_on_its_worker_thread_only(
    tmp_path: Path, engine: Any, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: the async chat held its foreground mark across its awaits, so the mark covered the wait for a free
    worker thread; with the pool's threads blocked in a full encode queue and the encoder waiting for the mark to
    end, nothing progressed. Every mark now begins on the worker thread that runs the model, never on the loop."""
    client = _client("async", _config(tmp_path, None), engine)
    derived = client.client.derived  # type: ignore[union-attr]
    mark = derived.foreground
    on_the_loop: list[bool] = []

    @contextlib.contextmanager
    def recorded() -> Iterator[None]:
        try:
            asyncio.get_running_loop()
            on_the_loop.append(True)
        except RuntimeError:  # no loop runs on this thread: a worker thread
            on_the_loop.append(False)
        with mark():
            yield

    monkeypatch.setattr(derived, "foreground", recorded)
    try:
        gate.opened.set()
        _add_each(client, FACTS[:1])
        assert client.chat(QUESTION, user_id="maya", max_new_tokens=2).memories == FACTS[:1]
        chunks = client.chat_stream(QUESTION, user_id="maya", max_new_tokens=2)
        assert chunks[-1].result is not None
        assert on_the_loop and not any(on_the_loop)
    finally:
        client.close()


def test_the_background_encoder_reads_a_batch_in_one_query_and_each_chunk_again_in_one(
    tmp_path: Path, engine: Any, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = _client("sync", _config(tmp_path, None, encode_chunk_size=2), engine)
    db = client.client.db  # type: ignore[union-attr]
    reads: list[tuple[str, int]] = []  # (method, ids asked for) on the encoder thread
    for name in ("get", "get_many"):
        method = getattr(db, name)

        def spy(ids: Any, *args: Any, _name: str = name, _method: Any = method) -> Any:
            if threading.current_thread().name == THREAD_NAME:
                reads.append((_name, 1 if isinstance(ids, str) else len(ids)))
            return _method(ids, *args)

        monkeypatch.setattr(db, name, spy)
    try:
        gate.opened.set()
        messages = [{"role": "user", "content": fact} for fact in FACTS]
        ids = [m["id"] for m in client.add(messages, user_id="maya", infer=False)["results"]]  # one batch of 3
        assert client.wait_for_encoding(GATE_TIMEOUT_S)
        assert reads == [("get_many", 3), ("get_many", 2), ("get_many", 1)]  # the batch, then each chunk's check
        for memory_id in ids:
            _assert_fresh(client, engine, memory_id)
    finally:
        client.close()


# ---- changes while queued ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("first_free", [False, True], ids=["one encoding", "first memory context-free"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_memory_changed_while_its_encoding_waits_gets_no_stale_kv(
    kind: ClientKind, tmp_path: Path, db_url: str, engine: Any, gate: Gate, first_free: bool
) -> None:
    config = _config(tmp_path, db_url, encode_batch_size=1, first_memory_context_free=first_free)
    client = _client(kind, config, engine)
    try:
        running, reworded, deleted = _add_each(client, FACTS)
        assert gate.arrived.wait(GATE_TIMEOUT_S)  # the thread read `running` from SQL and is encoding it
        client.update(running, text="My dog is a poodle named Rex.")  # during its forward pass
        client.update(reworded, text="I live in Lisbon now.")  # while it waits
        client.delete(deleted)
        gate.opened.set()
        assert client.wait_for_encoding(GATE_TIMEOUT_S)

        assert _kv_files(client, running) == []  # the old text's K/V were dropped, not stored
        assert _kv_files(client, deleted) == []
        _assert_fresh(client, engine, reworded)  # encoded from its text as it is now
        # The first memory's old text left the scope and its context with it: no turn is left before it, so with the
        # setting on too one encoding, its context-free one, serves both ways.
        assert _record(client, reworded).context == []
        _assert_fresh(client, engine, reworded, CONTEXT_FREE)
        assert len(_kv_files(client, reworded)) == 1
        assert _kv_rows(client) == [(reworded, _record(client, reworded).hash)]
        result = client.chat(QUESTION, user_id="maya", memory_ids=[running, reworded], max_new_tokens=4)
        assert result.memories == ["My dog is a poodle named Rex.", "I live in Lisbon now."]
        _assert_fresh(client, engine, running)  # chat encoded the new text (it has no turns: one encoding)
    finally:
        gate.opened.set()
        client.close()


# ---- failures ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_failing_background_encoder_loses_nothing_and_chat_still_answers(
    kind: ClientKind, tmp_path: Path, db_url: str, engine: Any, gate: Gate, caplog: pytest.LogCaptureFixture
) -> None:
    eager = _client("sync", _config(tmp_path / "eager", None), engine)
    client = _client(kind, _config(tmp_path / "background", db_url), engine)
    try:
        _add_each(eager, FACTS, encode_kv=True)
        expected = eager.chat(QUESTION, user_id="maya", limit=3, max_new_tokens=12)
        gate.fail = True
        gate.opened.set()
        with caplog.at_level(logging.WARNING, logger="inferscale.encode_queue"):
            ids = _add_each(client, FACTS)
            assert client.wait_for_encoding(GATE_TIMEOUT_S)
        failed = {r.args[0] for r in caplog.records if r.args and "chat encodes it" in r.getMessage()}
        assert failed == set(ids)  # each memory's failure logged (a failed batch is retried one by one)
        assert _kv_rows(client) == []  # nothing stored, nothing half-stored
        assert [m["id"] for m in client.get_all(user_id="maya")["results"]] == ids

        result = client.chat(QUESTION, user_id="maya", limit=3, max_new_tokens=12)
        assert sorted(result.memory_ids) == sorted(ids)
        assert (result.memories, result.answer) == (expected.memories, expected.answer)
        for memory_id in ids:
            _assert_fresh(client, engine, memory_id)
    finally:
        client.close()
        eager.close()


# ---- the per-call choice and the config ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_encode_kv_true_encodes_in_the_call_and_false_never_on_add(
    kind: ClientKind, tmp_path: Path, engine: Any, gate: Gate
) -> None:
    client = _client(kind, _config(tmp_path, None), engine)
    try:
        (eager,) = _add_each(client, FACTS[:1], encode_kv=True)
        _assert_fresh(client, engine, eager)  # before add returned, on the caller's thread
        (lazy,) = _add_each(client, FACTS[1:2], encode_kv=False)
        assert client.client.derived.pending_encoding() == []  # type: ignore[union-attr]
        assert client.wait_for_encoding(0)
        assert _stored(client, lazy) is None
        assert gate.background_facts == 0 and not gate.arrived.is_set()
        with pytest.raises(InvalidInputError, match="timeout"):
            client.wait_for_encoding(-1)
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["sync", "remote", "remote-async"])
def test_wait_for_encoding_reports_a_timeout(kind: ClientKind, tmp_path: Path, engine: Any, gate: Gate) -> None:
    """Also on the remote clients, which ask the server (``POST /v1/encoding/wait/``)."""
    client = _client(kind, _config(tmp_path, None), engine)
    try:
        _add_each(client, FACTS[:1])
        assert gate.arrived.wait(GATE_TIMEOUT_S)
        assert client.wait_for_encoding(0.05) is False
        gate.opened.set()
        assert client.wait_for_encoding(GATE_TIMEOUT_S) is True
    finally:
        client.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_async_wait_for_encoding_holds_no_worker_thread(
    tmp_path: Path, engine: Any, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: the async wait (the server's ``/v1/encoding/wait/``) blocked a worker thread for as long as it
    waited, so a few waits filled the pool every other request needs. It now waits on the event loop."""
    client = _client("async", _config(tmp_path, None), engine)
    derived = client.client.derived  # type: ignore[union-attr]

    def blocking_wait(timeout: float | None = None) -> bool:
        raise AssertionError("the async wait blocked a thread in the encoder's wait")

    monkeypatch.setattr(derived, "wait_for_encoding", blocking_wait)
    try:
        (memory_id,) = _add_each(client, FACTS[:1])
        assert gate.arrived.wait(GATE_TIMEOUT_S)
        assert client.wait_for_encoding(0) is False  # the encoder holds it at the gate
        assert derived.pending_encoding() == [memory_id]
        gate.opened.set()
        assert client.wait_for_encoding(GATE_TIMEOUT_S) is True
        assert derived.pending_encoding() == [] and gate.background_facts == 1
    finally:
        gate.opened.set()
        client.close()


def test_the_encoder_thread_runs_at_a_lower_priority(tmp_path: Path, engine: Any, gate: Gate) -> None:
    client = _client("sync", _config(tmp_path, None), engine)
    try:
        _add_each(client, FACTS[:1])
        assert gate.arrived.wait(GATE_TIMEOUT_S)
        assert gate.niceness == min(19, os.getpriority(os.PRIO_PROCESS, 0) + ENCODER_NICENESS)
    finally:
        gate.opened.set()
        client.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_a_restarted_encoder_thread_does_not_sink_further() -> None:
    """A thread started by an encoder thread inherits its lowered priority; lowering again must not add another
    ENCODER_NICENESS (the old code reached process + 20, capped at 19)."""
    process = os.getpriority(os.PRIO_PROCESS, os.getpid())
    if process + ENCODER_NICENESS > 18:
        pytest.skip(f"the process already runs at nice {process}: the cap of 19 would hide a second lowering")
    seen: list[int] = []

    def twice() -> None:
        _lower_priority()
        _lower_priority()  # what a thread started from the lowered thread's ``finally`` does
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    thread = threading.Thread(target=twice)
    thread.start()
    thread.join()
    assert seen == [process + ENCODER_NICENESS]


@pytest.mark.parametrize("timeout", [1e10, threading.TIMEOUT_MAX * 2])
def test_a_wait_longer_than_a_wait_can_take_is_invalid_input(tmp_path: Path, engine: Any, timeout: float) -> None:
    """threading's waits raise OverflowError past TIMEOUT_MAX: refused up front with the library's own error."""
    client = _client("sync", _config(tmp_path, None), engine)
    try:
        with pytest.raises(InvalidInputError, match="seconds from 0 to"):
            client.wait_for_encoding(timeout)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("value", "mode"), [(True, "eager"), (False, "lazy"), ("background", "background"), ("lazy", "lazy")]
)
def test_encode_on_add_reads_the_modes_and_the_older_bools(value: object, mode: str) -> None:
    assert KVConfig(encode_on_add=value).encode_on_add == mode  # type: ignore[arg-type]
    assert config_from_dict({"kv": {"encode_on_add": value}}).kv.encode_on_add == mode
    assert KVConfig().encode_on_add == "background"


@pytest.mark.parametrize("value", ["sometimes", 1, None, {"mode": "eager"}])
def test_an_unknown_encode_on_add_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="encode_on_add"):
        config_from_dict({"kv": {"encode_on_add": value}})
    with pytest.raises(ConfigError, match="encode_queue_size"):
        config_from_dict({"kv": {"encode_queue_size": 0}})
