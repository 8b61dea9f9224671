"""Random sequences of ``add(infer=False)``, ``update``, ``delete``, ``delete_all``, ``reset`` and ``search`` across
scopes, on SQLite and PostgreSQL, checked after every step against a plain in-memory model of what must be stored
(issue 15, Tests: the property-based suite).

The model holds the live memories (text, metadata, scope, creation order) and every memory's history. After each
step the client must agree with it:

- the call's own result: the ids and events ``add`` returns (a text already stored in exactly the scope, or twice in one
  call, is skipped), ``update``'s memory dict, ``delete_all``'s count, ``MemoryNotFoundError`` for an id that is gone
  or outside the given scope;
- ``get_all`` of every scope (ids ANDed, unset ids unconstrained): the same memories, texts, metadata and scope ids,
  oldest first;
- ``get`` and ``history`` (events, texts and metadata, oldest first) of every memory the step touched, and of every
  memory ever made at the end of an example;
- ``search``: only live memories of the scope, as many as the limit allows, the query's own text scoring highest.

The clients run on the suite's fakes (a hashed bag-of-words embedder, a generator that is never asked): no model
loads. K/V are not encoded (``encode_on_add`` off).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config
from property_support import backend_of, count_case, suite_settings, timed

from inferscale import MemoryClient
from inferscale.errors import MemoryNotFoundError, ScopeError

EXAMPLES = 60
"""Sequences per backend in CI (each up to :data:`STEPS` calls)."""

STEPS = 25
"""The most calls in one sequence."""

ScopeIds = tuple[str | None, str | None, str | None]
SCOPE_KEYS = ("user_id", "agent_id", "run_id")

# Every combination of two users, one agent and one run with at least one id set: writes go to any of them and reads
# see through the unset ids, so a write in ("u1", "a1", None) is read by ("u1", None, None) and (None, "a1", None).
SCOPES: list[ScopeIds] = [
    ids for ids in itertools.product((None, "u1", "u2"), (None, "a1"), (None, "r1")) if any(i is not None for i in ids)
]

# Few texts, sharing words, so that adds often repeat a stored text (skipped) and searches have close candidates.
TEXTS = [
    "I like green tea",
    "I like black coffee",
    "My dog is called Biscuit",
    "My cat is called Miso",
    "Lives in Lisbon",
    "Étoile café is my favourite bakery",
    "東京に住んでいる",
    "Loves 😀 and chess",
]
texts = st.one_of(
    st.sampled_from(TEXTS),
    st.text(st.sampled_from("abcxyz éЖ東😀 "), min_size=1, max_size=12).filter(lambda s: s.strip() != ""),
)
metadata = st.dictionaries(
    st.sampled_from(["topic", "n", "flag", "ключ", "role"]),
    st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", "ü"]), st.booleans(), st.none()),
    max_size=3,
)
scopes = st.sampled_from(SCOPES)


def scope_kwargs(ids: ScopeIds) -> dict[str, str]:
    """The keyword arguments naming ``ids`` (unset ids left out)."""
    return {k: v for k, v in zip(SCOPE_KEYS, ids, strict=True) if v is not None}


def visible(memory_ids: ScopeIds, scope: ScopeIds) -> bool:
    """Whether a memory stored under ``memory_ids`` is in ``scope``: each id the scope sets equals the memory's."""
    return all(want is None or want == have for want, have in zip(scope, memory_ids, strict=True))


@dataclass
class Memory:
    """A live memory as the model knows it."""

    id: str
    text: str
    metadata: dict[str, Any]
    scope: ScopeIds


@dataclass
class Model:
    """What the store must hold: live memories in creation order, and every change to every memory ever made."""

    live: dict[str, Memory] = field(default_factory=dict)
    history: dict[str, list[tuple[str, str | None, str | None, Any, Any]]] = field(default_factory=dict)

    def in_scope(self, scope: ScopeIds) -> list[Memory]:
        """The live memories of ``scope``, oldest first."""
        return [m for m in self.live.values() if visible(m.scope, scope)]

    def record(self, memory_id: str, event: str, before: Memory | None, after: Memory | None) -> None:
        """Append one history row (event, old text, new text, old metadata, new metadata)."""
        self.history.setdefault(memory_id, []).append(
            (
                event,
                before.text if before else None,
                after.text if after else None,
                before.metadata if before else None,
                after.metadata if after else None,
            )
        )


def typed(value: Any) -> Any:
    """``value`` with each bool and float tagged with its type, so that comparisons tell JSON ``true`` from ``1`` and
    ``1.0`` from ``1`` (Python's ``==`` does not)."""
    if isinstance(value, bool | float):
        return (type(value).__name__, value)
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [typed(v) for v in value]
    return value


def look_alikes(value: Any) -> list[Any]:
    """Values of another JSON type that Python's ``==`` calls equal to ``value`` (``1`` → ``True``, ``1.0``)."""
    if isinstance(value, bool):
        return [int(value), float(value)]
    if isinstance(value, int):
        return [float(value), *([bool(value)] if value in (0, 1) else [])]
    if isinstance(value, float) and value.is_integer():
        return [int(value)]
    return []


ATTRIBUTION = ("role", "actor_id")
"""Stored in a memory's metadata, shown beside the scope ids (as Mem0 shows them)."""


def expected_dict(m: Memory) -> dict[str, Any]:
    """The fields of a memory dict the model predicts (ids, text, metadata, scope ids, role), typed."""
    shown = {k: v for k, v in m.metadata.items() if k not in ATTRIBUTION}
    promoted = {k: m.metadata[k] for k in ATTRIBUTION if k in m.metadata}
    return typed({"id": m.id, "memory": m.text, "metadata": shown, **scope_kwargs(m.scope), **promoted})


def observed_dict(d: dict[str, Any]) -> dict[str, Any]:
    """The same fields of a memory dict the client returned, typed."""
    return typed({k: d[k] for k in ("id", "memory", "metadata", *SCOPE_KEYS, *ATTRIBUTION) if k in d})


def updated_metadata(before: dict[str, Any], given: dict[str, Any] | None) -> dict[str, Any]:
    """A memory's metadata after an update: ``given``'s keys set over ``before``'s, the others kept, the role and
    actor among them (Mem0 2.2.1's rule: ``new_metadata.update(metadata)`` over the stored payload)."""
    if given is None:
        return before
    return {**before, **given}


class MemoryMachine(RuleBasedStateMachine):
    """One client, reset at the start of every example, driven by random calls and compared with :class:`Model`."""

    def __init__(self, client: MemoryClient, steps: Callable[[], None]) -> None:
        super().__init__()
        self.client = client
        self.model = Model()
        self.touched: set[str] = set()
        self.steps = steps

    @initialize(seed=st.lists(st.tuples(scopes, texts), max_size=6))
    def start(self, seed: list[tuple[ScopeIds, str]]) -> None:
        """Empty the store, add a few memories, and check that ``delete_all`` without a scope is refused (the
        invariant then finds every memory still there)."""
        assert self.client.reset() is None
        self.model = Model()
        for scope, text in seed:
            self._add(scope, [("user", text)], None, as_string=True)
        with pytest.raises(ScopeError):
            self.client.delete_all()

    # ---- picking ids ---------------------------------------------------------------------------------------
    def _pick_id(self, data: st.DataObject) -> str:
        """A live id (two times in three), the id of a deleted memory, or one that never existed."""
        known = list(self.model.history)  # creation order: uuid4 ids sort differently on every run
        live = [i for i in known if i in self.model.live]
        kind = data.draw(st.integers(0, 5), label="id kind")
        if live and kind < 4:
            return data.draw(st.sampled_from(live), label="live id")
        if kind < 5:
            return data.draw(st.sampled_from(known), label="known id")
        return "00000000-0000-4000-8000-000000000000"

    def _pick_scope(self, data: st.DataObject, memory_id: str) -> ScopeIds | None:
        """No scope (the id alone), a scope that holds the memory, or any scope."""
        own = self.model.live[memory_id].scope if memory_id in self.model.live else None
        kind = data.draw(st.integers(0, 3), label="scope kind")
        if kind == 0:
            return None
        if own is not None and kind < 3:
            return data.draw(st.sampled_from([s for s in SCOPES if visible(own, s)]), label="holding scope")
        return data.draw(scopes, label="any scope")

    # ---- writes --------------------------------------------------------------------------------------------
    @rule(
        scope=scopes,
        turns=st.lists(st.tuples(st.sampled_from(["user", "assistant"]), texts), min_size=1, max_size=3),
        meta=st.none() | metadata,
        as_string=st.booleans(),
    )
    def add(self, scope: ScopeIds, turns: list[tuple[str, str]], meta: dict[str, Any] | None, as_string: bool) -> None:
        self.steps()
        self._add(scope, turns, meta, as_string)

    @precondition(lambda self: bool(self.model.live))
    @rule(data=st.data(), role=st.sampled_from(["user", "assistant"]))
    def add_a_stored_text(self, data: st.DataObject, role: str) -> None:
        """Add the text of a live memory again, in any scope: skipped where a memory of exactly that scope holds it."""
        self.steps()
        text = data.draw(st.sampled_from(sorted({m.text for m in self.model.live.values()})), label="text")
        self._add(data.draw(scopes, label="scope"), [(role, text)], None, as_string=False)

    def _add(self, scope: ScopeIds, turns: list[tuple[str, str]], meta: dict[str, Any] | None, as_string: bool) -> None:
        messages: str | list[dict[str, str]]
        if as_string:
            turns = [("user", turns[0][1])]
            messages = turns[0][1]
        else:
            messages = [{"role": role, "content": text} for role, text in turns]
        out = self.client.add(messages, metadata=meta, infer=False, **scope_kwargs(scope))["results"]
        stored = {m.text for m in self.model.live.values() if m.scope == scope}  # duplicates: exactly this scope
        expected: list[tuple[str, str]] = []
        for role, text in turns:
            if text not in stored:
                stored.add(text)
                expected.append((text, role))
        assert [(r["memory"], r["event"]) for r in out] == [(text, "ADD") for text, _ in expected]
        assert len({r["id"] for r in out} | set(self.model.history)) == len(out) + len(self.model.history)
        for r, (text, role) in zip(out, expected, strict=True):
            memory = Memory(r["id"], text, {**(meta or {}), "role": role}, scope)  # the message's role wins
            self.model.live[memory.id] = memory
            self.model.record(memory.id, "ADD", None, memory)
            self.touched.add(memory.id)

    @precondition(lambda self: bool(self.model.history))
    @rule(data=st.data(), text=st.none() | texts, meta=st.none() | metadata, as_data=st.booleans())
    def update(self, data: st.DataObject, text: str | None, meta: dict[str, Any] | None, as_data: bool) -> None:
        self.steps()
        if text is None and meta is None:
            text = TEXTS[0]
        memory_id = self._pick_id(data)
        self._update(memory_id, self._pick_scope(data, memory_id), text, meta, as_data)

    @precondition(lambda self: bool(self.model.live))
    @rule(data=st.data(), same_text=st.booleans())
    def update_with_look_alike_metadata(self, data: st.DataObject, same_text: bool) -> None:
        """Update a memory's metadata to values Python calls equal but JSON does not (``True`` for ``1``, ``1.0``
        for ``1``), keys reordered: stored exactly as given, with an UPDATE row."""
        self.steps()
        memory = self.model.live[data.draw(st.sampled_from(list(self.model.live)), label="memory_id")]
        meta = {k: data.draw(st.sampled_from([v, *look_alikes(v)]), label=k) for k, v in memory.metadata.items()}
        meta = dict(reversed(meta.items())) if data.draw(st.booleans(), label="reorder") else meta
        self._update(memory.id, None, memory.text if same_text else None, meta, as_data=False)

    def _update(
        self, memory_id: str, scope: ScopeIds | None, text: str | None, meta: dict[str, Any] | None, as_data: bool
    ) -> None:
        before = self.model.live.get(memory_id)
        kwargs: dict[str, Any] = {"metadata": meta, **scope_kwargs(scope or (None, None, None))}
        kwargs["data" if as_data else "text"] = text
        if before is None or (scope is not None and not visible(before.scope, scope)):
            with pytest.raises(MemoryNotFoundError):
                self.client.update(memory_id, **kwargs)
            return
        out = self.client.update(memory_id, **kwargs)
        after = Memory(
            memory_id,
            text if text is not None else before.text,
            updated_metadata(before.metadata, meta),
            before.scope,
        )
        assert out["message"] == "Memory updated successfully!"
        assert observed_dict(out["result"]) == expected_dict(after)
        if typed((after.text, after.metadata)) != typed((before.text, before.metadata)):
            self.model.record(memory_id, "UPDATE", before, after)
            self.model.live[memory_id] = after
        self.touched.add(memory_id)

    @precondition(lambda self: bool(self.model.history))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        self.steps()
        memory_id = self._pick_id(data)
        scope = self._pick_scope(data, memory_id)
        before = self.model.live.get(memory_id)
        kwargs = scope_kwargs(scope or (None, None, None))
        if before is None or (scope is not None and not visible(before.scope, scope)):
            with pytest.raises(MemoryNotFoundError):
                self.client.delete(memory_id, **kwargs)
            return
        assert self.client.delete(memory_id, **kwargs) == {"message": "Memory deleted successfully!"}
        del self.model.live[memory_id]
        self.model.record(memory_id, "DELETE", before, None)
        self.touched.add(memory_id)

    @precondition(lambda self: bool(self.model.live))
    @rule(scope=scopes)
    def delete_all(self, scope: ScopeIds) -> None:
        self.steps()
        gone = self.model.in_scope(scope)
        out = self.client.delete_all(**scope_kwargs(scope))
        assert out == {"message": "Memories deleted successfully!", "deleted": len(gone)}
        for m in gone:
            del self.model.live[m.id]
            self.model.record(m.id, "DELETE", m, None)
            self.touched.add(m.id)

    @precondition(lambda self: len(self.model.live) >= 3)  # wipes everything: only once there is something to wipe
    @rule()
    def reset(self) -> None:
        self.steps()
        assert self.client.reset() is None
        self.model = Model()

    # ---- reads ---------------------------------------------------------------------------------------------
    @rule(scope=scopes, query=texts, limit=st.integers(1, 6))
    def search(self, scope: ScopeIds, query: str, limit: int) -> None:
        self.steps()
        hits = self.client.search(query, limit=limit, **scope_kwargs(scope))["results"]
        candidates = {m.id: m for m in self.model.in_scope(scope)}
        assert len(hits) == min(limit, len(candidates))
        assert len({h["id"] for h in hits}) == len(hits)
        for hit in hits:
            assert hit["id"] in candidates, "search returned a memory that is deleted or outside the scope"
            assert observed_dict(hit) == expected_dict(candidates[hit["id"]])
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
        exact = {m.id for m in candidates.values() if m.text == query}
        if exact:  # a memory holding the query's own text scores 1 (cosine), so the best hit does
            assert scores[0] == pytest.approx(1.0, abs=1e-5)
            if len(hits) == len(candidates):  # all returned: each such memory is among the best (ties aside)
                assert exact <= {h["id"] for h in hits if h["score"] >= 1.0 - 1e-5}

    # ---- checks --------------------------------------------------------------------------------------------
    @invariant()
    def every_scope_lists_its_memories(self) -> None:
        for scope in SCOPES:
            got = [observed_dict(d) for d in self.client.get_all(limit=1000, **scope_kwargs(scope))["results"]]
            assert got == [expected_dict(m) for m in self.model.in_scope(scope)], f"get_all{scope_kwargs(scope)}"
        self._check_ids(self.touched)
        self.touched = set()

    def _check_ids(self, memory_ids: set[str]) -> None:
        for memory_id in sorted(memory_ids):
            live = self.model.live.get(memory_id)
            got = self.client.get(memory_id)
            assert (observed_dict(got) if got else None) == (expected_dict(live) if live else None)
            rows = self.client.history(memory_id)
            assert typed(
                [(r["event"], r["old_memory"], r["new_memory"], r["old_metadata"], r["new_metadata"]) for r in rows]
            ) == typed(self.model.history.get(memory_id, []))
            assert all(r["memory_id"] == memory_id and r["is_deleted"] == (r["event"] == "DELETE") for r in rows)

    def teardown(self) -> None:
        self._check_ids(set(self.model.history))


@pytest.fixture
def client(tmp_path: Path, db_url: str) -> Iterator[MemoryClient]:
    """One client on the test's database for every example (each starts with ``reset``)."""
    c = MemoryClient(fake_config(tmp_path, db_url), embedder=HashEmbedder(), generator=ScriptedGenerator())
    yield c
    c.close()


def test_random_call_sequences_match_the_model(client: MemoryClient, db_url: str) -> None:
    backend = backend_of(db_url)

    def machine() -> MemoryMachine:
        count_case("state machine: sequences", backend)
        return MemoryMachine(client, lambda: count_case("state machine: calls", backend))

    with timed("state machine", backend):
        run_state_machine_as_test(machine, settings=suite_settings(EXAMPLES, stateful_step_count=STEPS))
