"""The background K/V encoder of ``add``: a bounded queue of memory ids and the one thread that serves it.

``add`` in ``kv.encode_on_add="background"`` mode puts the ids of the memories it created or re-worded here and
returns; the thread takes up to ``batch_size`` of them at a time, oldest first, and hands them to an ``encode``
callback (:meth:`inferscale.derived.DerivedStores.encode_queued`), which reads them from SQL, encodes the ones whose
K/V are missing and stores them. The queue knows nothing of SQL, models or K/V: it is the scheduling alone.

- Bounded: at most ``capacity`` ids wait; :meth:`EncodeQueue.submit` blocks while the queue is full
  (back-pressure), so a writer faster than the encoder cannot grow it without limit.
- De-duplicated: an id already waiting is not queued twice (the callback reads the memory's current text when its
  turn comes, so one encode serves every change queued before it).
- One thread, at a lower scheduling priority (:data:`ENCODER_NICENESS`), started on demand and ended when the
  queue is empty (a client that never writes in background mode never starts one; many short-lived clients leave
  no idle threads behind). At interpreter exit (the main thread has ended, :func:`interpreter_exiting`) it finishes
  the chunk it is encoding, stores it and ends; what waits then is left to the first ``chat`` that retrieves it.
  It is not a daemon thread: one killed inside a forward pass at exit aborted the process ("terminate called
  without an active exception", exit code 134, in a script that exited within a second of an ``add``).
- A callback that raises is logged, never fatal: the memories are in SQL already, and a ``chat`` that retrieves one
  encodes what is missing. A failed batch is retried one memory at a time, so one bad memory does not leave the
  others of its batch to ``chat``.
- Closed for good by :meth:`EncodeQueue.close` (the client's ``close``): ids submitted afterwards, or still waiting
  for room then, are not queued but left to the first ``chat`` that retrieves them, so no encoder thread starts
  after ``close`` and reopens what it released (the engine, the database).
- A close may bound its drain (``close(timeout)``, the server's shutdown grace): once the timeout is spent the
  encoder starts no further batch or chunk (the ``encode`` callback is told so by its ``stop`` argument), the
  chunk running finishes and is stored, and what was not encoded is logged and left to the first ``chat`` that
  retrieves it (or to ``prepare_kv``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TypeAlias

from inferscale.errors import InvalidInputError

log = logging.getLogger(__name__)

THREAD_NAME = "inferscale-kv-encoder"
"""The name of the encoder thread (one per client while it has work)."""

ENCODER_NICENESS = 10
"""How much lower the encoder thread's scheduling priority is than its process's (Linux ``nice`` increment): where
the CPU is short, ``add``, ``search`` and ``chat`` run first and the encoding takes the cores they leave idle. The
threads torch starts for its forward passes inherit it. Measured with ``benchmarks/add_modes.py`` (20 facts,
``OMP_NUM_THREADS=1``, 2 cores shared with other jobs, load average ~5): a background ``add``'s p50 was 60 ms
without it against 29 ms for a lazy one (which encodes nothing), and 27 against 20 ms, then 36 against 38 ms,
with it."""


StopCheck: TypeAlias = Callable[[], bool]
"""Says whether the encoder must start no further chunk (a bounded close's timeout is spent, or the interpreter is
exiting); an ``encode`` callback calls it before each chunk."""

Encode: TypeAlias = Callable[[list[str], StopCheck], Sequence[str]]
"""The queue's ``encode`` callback: encodes and stores the K/V of its ids (oldest first), asks its
:data:`StopCheck` before each chunk, and returns the ids it left unencoded because the check said stop (``[]``
when it finished them)."""


def interpreter_exiting() -> bool:
    """Whether the interpreter is exiting: its main thread has ended (Python stops it before it joins the other
    threads), so the encoder should finish its chunk and stop rather than start another."""
    return not threading.main_thread().is_alive()


def _lower_priority() -> None:
    """Set the calling thread's priority :data:`ENCODER_NICENESS` below its process's, on Linux (where ``nice`` is
    per thread; on other systems ``setpriority`` would address a process, so nothing is done there). It is set from
    the process's priority, not the thread's own: an encoder thread started by the one before it inherits that
    thread's lowered priority, and lowering again would sink each restart further. A refusal is ignored: the
    priority is a preference, never a requirement."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            process = os.getpriority(os.PRIO_PROCESS, os.getpid())
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), process + ENCODER_NICENESS)


class EncodeQueue:
    """A bounded, de-duplicating queue of memory ids served by one background thread, in batches.

    Thread-safe: any thread may :meth:`submit` and :meth:`wait`. Never call them from inside ``encode`` (the
    thread would wait for itself).

    Args:
        encode: called on the encoder thread with 1 to ``batch_size`` ids, oldest first, and a :data:`StopCheck`;
            encodes and stores their K/V and returns those it left when told to stop (:data:`Encode`). What it
            raises is logged (see the module docstring).
        batch_size: the most ids handed to one ``encode`` call (>= 1).
        capacity: the most ids waiting (>= 1); the batch being encoded is not counted.

    Raises:
        InvalidInputError: when ``batch_size`` or ``capacity`` is below 1.
    """

    def __init__(self, encode: Encode, batch_size: int, capacity: int) -> None:
        if batch_size < 1 or capacity < 1:
            raise InvalidInputError(f"batch_size ({batch_size}) and capacity ({capacity}) must each be >= 1")
        self._encode = encode
        self._batch_size = batch_size
        self._capacity = capacity
        self._waiting: dict[str, None] = {}  # ordered: oldest first
        self._batch: list[str] = []  # being encoded now
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopped = False  # a bounded close ran out of time: no further batch or chunk starts
        self._abandoned: list[str] = []  # ids of the batch running then that it left unencoded
        self._warned_closed = False  # whether a submit after close was logged as a warning yet
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        """The most ids that wait (the back-pressure bound)."""
        return self._capacity

    def pending(self) -> list[str]:
        """The ids not encoded yet: the batch being encoded, then those waiting, oldest first (a snapshot)."""
        with self._cond:
            return [*self._batch, *self._waiting]

    def submit(self, memory_ids: Sequence[str]) -> None:
        """Queue ``memory_ids`` for encoding, in order; one already waiting keeps its place. Blocks while the queue
        holds :attr:`capacity` ids, until the encoder has taken enough of them. Starts the encoder thread if it is
        not running. Once the queue is closed (:meth:`close`, also while this call waits for room) the ids not
        queued yet are left to ``chat`` (logged as a WARNING the first time, then at DEBUG: a closed client stays
        in lazy mode for good, and every later ``add`` would repeat it)."""
        with self._cond:
            for i, memory_id in enumerate(memory_ids):
                if memory_id in self._waiting:
                    continue
                while not self._closed and len(self._waiting) >= self._capacity:
                    self._start()
                    self._cond.wait()
                if self._closed:
                    self._log_closed(len(memory_ids) - i)
                    return
                self._waiting[memory_id] = None
                self._start()

    def _log_closed(self, n_left: int) -> None:
        """Log that ``n_left`` ids of a submit are left to ``chat`` because the queue is closed (the caller holds
        the condition's lock): a WARNING the first time, DEBUG afterwards."""
        level = logging.DEBUG if self._warned_closed else logging.WARNING
        self._warned_closed = True
        log.log(
            level,
            "the client is closed, so its background K/V encoder is too: the K/V of %d memories are left to the "
            "first chat that retrieves them (lazy encoding from now on; open a new client to encode in background)",
            n_left,
        )

    def close(self, timeout: float | None = None) -> list[str]:
        """Queue nothing from now on (:meth:`submit` leaves later ids to ``chat``, and stops a call waiting for room)
        and block until every id queued before was handed to ``encode`` and the call returned, or ``timeout`` runs
        out. Then the encoder starts no further batch or chunk: the waiting ids are dropped, the chunk running (if
        any) finishes and is stored, and the ids not encoded are logged (a WARNING: they are in SQL, and the first
        ``chat`` that retrieves one, or ``prepare_kv``, encodes it). Idempotent.

        Args:
            timeout: the most seconds to wait for the queue to drain before stopping the encoder; ``None`` drains
                it whatever it takes, ``0`` stops at once. The call returns after it plus at most the chunk running
                (``kv.encode_chunk_size`` facts; a forward pass is never interrupted).

        Returns:
            the ids left unencoded, oldest first (``[]`` when the queue drained).
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # a submit waiting for room stops waiting
            if self._cond.wait_for(self._drained, timeout):
                return []
            self._stopped = True  # the encode callback's StopCheck: it starts no further chunk
            waiting = list(self._waiting)
            self._waiting.clear()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._batch)  # the chunk running ends (one chunk at most)
            running = set(self._abandoned)  # an id re-queued while it was being encoded is counted once
            left = [*self._abandoned, *(memory_id for memory_id in waiting if memory_id not in running)]
            self._abandoned = []
        if left:
            log.warning(
                "closing before the background K/V encoder finished (%.1f s drain limit): the K/V of %d memories were "
                "not encoded; they are stored and are encoded by the first chat that retrieves them, or now by "
                "`inferscale prepare-kv`",
                timeout,
                len(left),
            )
        return left

    def _drained(self) -> bool:
        """Whether no id waits and none is being encoded (the caller holds the condition's lock)."""
        return not self._waiting and not self._batch

    def _should_stop(self) -> bool:
        """The :data:`StopCheck` handed to ``encode``: a bounded :meth:`close` ran out of time, or the interpreter
        is exiting."""
        return self._stopped or interpreter_exiting()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued id was handed to ``encode`` and the call returned (or failed and was logged).

        Args:
            timeout: the most seconds to wait; ``None`` waits as long as it takes.

        Returns:
            ``True`` when nothing is pending, ``False`` when ``timeout`` ran out first.
        """
        with self._cond:
            return self._cond.wait_for(self._drained, timeout)

    # ---- the encoder thread ------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the encoder thread when ids wait and none runs (the caller holds the condition's lock); at
        interpreter exit, leave the waiting ids to ``chat`` instead (:meth:`_leave_waiting`)."""
        if self._thread is None and self._waiting:
            if interpreter_exiting():
                self._leave_waiting()
                return
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME)
            self._thread.start()

    def _leave_waiting(self) -> None:
        """At interpreter exit: forget the waiting ids (they are in SQL; the first ``chat`` that retrieves one
        encodes it), so :meth:`close` and :meth:`wait` return. The caller holds the condition's lock."""
        if self._waiting:
            log.info("interpreter exiting: the K/V of %d memories are left to the first chat", len(self._waiting))
            self._waiting.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        """The encoder thread: take a batch, encode it, repeat until the queue is empty, then end."""
        _lower_priority()
        try:
            while True:
                with self._cond:
                    if interpreter_exiting():
                        self._leave_waiting()
                    if not self._waiting:
                        return
                    self._batch = list(self._waiting)[: self._batch_size]
                    for memory_id in self._batch:
                        del self._waiting[memory_id]
                    batch = list(self._batch)
                    self._cond.notify_all()  # room for a blocked submit
                left: Sequence[str] = batch  # a BaseException leaves the whole batch
                try:
                    left = self._encode_batch(batch)
                finally:
                    with self._cond:
                        if self._stopped:  # close reports them
                            self._abandoned = list(left)
                        self._batch = []
                        self._cond.notify_all()
        finally:
            with self._cond:
                self._thread = None
                self._start()  # ids queued while this thread was ending (or a batch that raised BaseException)
                self._cond.notify_all()

    def _encode_batch(self, batch: list[str]) -> Sequence[str]:
        """``encode(batch)``; when it raises, each id again on its own, and what still fails is logged. Returns the
        ids left unencoded because :meth:`_should_stop` said stop (not those that failed: they are logged).

        ``encode`` may raise anything a model, a database or a file system raises (an engine that fails to load, a
        fact longer than the context, a full disk, a lost connection); none of it may end the thread or reach a
        caller that never waits for it, and the memories are safe in SQL. So every ``Exception`` is caught here,
        and logged with its traceback; at interpreter exit a failure is expected (the exit shuts down thread pools a
        model load uses), and the batch is left to ``chat`` without one.
        """
        try:
            return self._encode(batch, self._should_stop)
        except Exception:
            if interpreter_exiting():  # e.g. a model load whose thread pool the exit shut down: expected, not logged
                log.info("interpreter exiting: the K/V of %d memories are left to the first chat", len(batch))
                return batch
            if len(batch) == 1:
                log.warning("background K/V encoding of memory %s failed; chat encodes it", batch[0], exc_info=True)
                return []
            log.warning("background K/V encoding of %d memories failed; retrying one at a time", len(batch))
        for i, memory_id in enumerate(batch):
            if self._should_stop():
                return batch[i:]
            try:
                left = self._encode([memory_id], self._should_stop)
            except Exception:
                log.warning("background K/V encoding of memory %s failed; chat encodes it", memory_id, exc_info=True)
                continue
            if left:
                return [*left, *batch[i + 1 :]]
        return []
