"""SQL reads written once for both clients: steps that yield a :class:`StoreRead` and receive its result.

The derived stores' steps (search, similar memories, reconciliation) need SQL between their computations. They are
generators that yield a :class:`StoreRead` and receive its result: :func:`run_steps` drives them over the sync
:class:`~inferscale.storage.MemoryStore`, and :func:`arun_steps` over the async store, with SQL awaited on the event
loop and every computation (embedding, FAISS; LLM extraction in an add's steps) run in a worker thread.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from inferscale.filters import Filter
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord, MemoryStore
from inferscale.storage.queries import held_ids
from inferscale.storage.records import HeldId, MemoryVersions
from inferscale.storage.validation import check_ids
from inferscale.worker_threads import ProcessThreads, on_threads

if TYPE_CHECKING:
    from inferscale.storage.async_store import AsyncMemoryStore

R = TypeVar("R")
T_co = TypeVar("T_co", covariant=True)


class StoreRead(Protocol[T_co]):
    """One SQL read a step needs, runnable on either store."""

    def run(self, store: MemoryStore) -> T_co:
        """The result, read through the sync store."""
        ...

    async def arun(self, store: AsyncMemoryStore) -> T_co:
        """The same result, read through the async store."""
        ...


@dataclass(frozen=True, slots=True)
class Versions:
    """Vector ids, ids and text hashes of the memories of ``scope`` matching ``node`` (every memory for ``None``),
    ascending by vector id."""

    scope: Scope | None = None
    node: Filter | None = None

    def run(self, store: MemoryStore) -> MemoryVersions:
        return store.versions(self.scope, self.node)

    async def arun(self, store: AsyncMemoryStore) -> MemoryVersions:
        return await store.versions(self.scope, self.node)


@dataclass(frozen=True, slots=True)
class RecordsByVectorId:
    """The memories whose vector id is in ``ids``, keyed by vector id (unknown ids left out)."""

    ids: tuple[int, ...]

    def run(self, store: MemoryStore) -> dict[int, MemoryRecord]:
        return store.by_vector_ids(self.ids)

    async def arun(self, store: AsyncMemoryStore) -> dict[int, MemoryRecord]:
        return await store.by_vector_ids(self.ids)


@dataclass(frozen=True, slots=True)
class MemoryById:
    """The memory with id ``memory_id``, in any scope, or ``None`` (:meth:`MemoryStore.get`)."""

    memory_id: str

    def run(self, store: MemoryStore) -> MemoryRecord | None:
        return store.get(self.memory_id)

    async def arun(self, store: AsyncMemoryStore) -> MemoryRecord | None:
        return await store.get(self.memory_id)


@dataclass(frozen=True, slots=True)
class StoredText:
    """The oldest memory of exactly ``scope`` whose text hashes to ``text_hash``, or ``None``
    (:meth:`MemoryStore.memories_with_hash`, ``limit=1``)."""

    scope: Scope
    text_hash: str

    def run(self, store: MemoryStore) -> MemoryRecord | None:
        return next(iter(store.memories_with_hash(self.text_hash, self.scope, limit=1)), None)

    async def arun(self, store: AsyncMemoryStore) -> MemoryRecord | None:
        return next(iter(await store.memories_with_hash(self.text_hash, self.scope, limit=1)), None)


@dataclass(frozen=True, slots=True)
class LatestMemories:
    """The ``limit`` memories of exactly ``scope`` stored last, oldest first (:meth:`MemoryStore.latest`)."""

    scope: Scope
    limit: int

    def run(self, store: MemoryStore) -> list[MemoryRecord]:
        return store.latest(self.scope, self.limit)

    async def arun(self, store: AsyncMemoryStore) -> list[MemoryRecord]:
        return await store.latest(self.scope, self.limit)


@dataclass(frozen=True, slots=True)
class IdsHeld:
    """What holds each of ``ids``, by id, in any scope: the scope and text hash of the live memory with it, or only
    a deleted memory's history (:func:`inferscale.storage.queries.held_ids`; no text or metadata is read).

    Raises:
        InvalidInputError: when an id is not a non-empty str.
    """

    ids: tuple[str, ...]

    def run(self, store: MemoryStore) -> dict[str, HeldId]:
        return store.run_read(held_ids, check_ids(self.ids))

    async def arun(self, store: AsyncMemoryStore) -> dict[str, HeldId]:
        return await store.run_read(held_ids, check_ids(self.ids))


Steps = Generator[StoreRead[Any], Any, R]
"""A step that yields the SQL reads it needs and returns ``R``."""


def run_steps(steps: Steps[R], store: MemoryStore) -> R:
    """Drive ``steps`` over the sync store (in the caller's thread)."""
    try:
        read = next(steps)
        while True:
            read = steps.send(read.run(store))
    except StopIteration as done:
        result: R = done.value
        return result


@dataclass(frozen=True, slots=True)
class _Done(Generic[R]):
    """A finished step's result."""

    value: R


def _advance(steps: Steps[R], value: Any) -> StoreRead[Any] | _Done[R]:
    """One step forward: the next read, or the result when the step is done."""
    try:
        return steps.send(value)
    except StopIteration as done:
        return _Done(done.value)


async def arun_steps(steps: Steps[R], store: AsyncMemoryStore, threads: ProcessThreads | None = None) -> R:
    """Drive ``steps`` over the async store: SQL awaited on the event loop, computations on a worker thread, one of
    ``threads`` (steps that hold a thread for seconds: :data:`~inferscale.worker_threads.MODEL_WORK`) or of the
    loop's default executor (``None``: milliseconds of embedding and index search)."""
    state = await on_threads(threads, _advance, steps, None)
    while not isinstance(state, _Done):
        value = await state.arun(store)
        state = await on_threads(threads, _advance, steps, value)
    return state.value


__all__ = [
    "IdsHeld",
    "LatestMemories",
    "MemoryById",
    "RecordsByVectorId",
    "Steps",
    "StoreRead",
    "StoredText",
    "Versions",
    "arun_steps",
    "run_steps",
]
