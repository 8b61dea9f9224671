"""Tenant isolation across every read path, each answer compared with a reference rule (not only "no leak").

The store is filled with 3 users x 2 agents x 2 runs: one memory in every scope Mem0 allows (user only, agent only,
run only and every combination: 35 scopes), each text naming its own scope ("u1/a2/- secret note 17"), plus two
twins: the same text in two users' scopes. Then every combination of ids is asked on every read path:

- ``search`` and ``get_all``: v1 keyword ids; v2 filters flat, under ``AND``, and mixed with a keyword id;
- ``get`` and ``history`` of every memory, without ids and under every v1 query as it relates to that memory (each
  id left out, its own, or another: :func:`relative_queries`);
- ``chat`` in ``mode="kv"`` and ``mode="prompt"``: the memories it used (``ChatResult.memory_ids``), and what the
  engine was handed: the K/V injected (tokens and tensors, against a fresh encoding of that memory), or the memory
  tokens pasted into the prompt; the tenant salt of the engine's cache; explicit ``memory_ids`` in and out of scope;
- the K/V store: the entries each chat read and wrote, each entry's memory, and what each memory's K/V were encoded
  after (the memories stored before it in exactly its scope, never a narrower scope's);
- a remote client with a key bound to one user, on a keyed server (SQLite; the key's rules are the server's, above
  the store).

All on the sync and async clients, each on SQLite and PostgreSQL, one fill per store read by every test.

The reference rule (:meth:`Query.sees`), as ``inferscale.scope``, ``inferscale.filters`` and ``docs/api.md`` define
it and as Mem0 does: a memory is visible to a query iff, for each of ``user_id``/``agent_id``/``run_id``,

- the query names a value: the memory's id equals it;
- the query gives the wildcard ``"*"`` (v2 filters only): the memory has that id (present, not null);
- the query leaves it out: no constraint; memories without that id are included.

A query must pin at least one id to a value; one that pins none (only wildcards, or nothing) is a ``ScopeError``,
never "every tenant". ``get`` and ``history`` without ids address a memory by id alone (Mem0's behaviour); with ids,
the same rule decides. A key bound to one user (remote client, keyed server) sees exactly what the rule gives for the
query with that user filled in where it names none; naming another user is ``PermissionDeniedError``.

The engine's generation is replaced by a recorder that answers at once: a chat's isolation is decided before the
engine runs, and what the engine is handed is what it injects (exactness of injection itself:
tests/kv/test_kv_injection.py). Facts are still encoded by the real tiny model. Each test collects every mismatch
and reports them all at once.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import pytest
import torch
from client_adapter import ClientAdapter, ClientKind, open_client
from databases import Backend, database_url
from mem0_fakes import HashEmbedder, fake_config
from served_kv import context_free_request
from sqlalchemy import create_engine, select
from tiny_models import tiny_engine

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.engines.base import Engine, Generation
from inferscale.errors import InvalidInputError, MemoryNotFoundError, PermissionDeniedError, ScopeError
from inferscale.fact_kv import CONTEXT_FREE, IN_CONTEXT
from inferscale.kv.fact import FactKV
from inferscale.kv.store import KVKey, KVStore
from inferscale.scope import SCOPE_KEYS, Scope
from inferscale.storage.models import KVEntryRow

USERS = ("u1", "u2", "u3")
AGENTS = ("a1", "a2")
RUNS = ("r1", "r2")
UNKNOWN_USER = "u9"
"""A user with no memories: every query naming it sees nothing."""
WILDCARD = "*"
TWIN_TEXT = "twin secret: the shared door code is 4711"
TWIN_SCOPES = (("u1", "a1", "r1"), ("u2", "a1", "r1"))
"""Two users store the same text: each still has a memory, and K/V entries, of its own."""
QUESTION = "Which secret notes do I have?"
LIMIT = 100
"""More than the store holds: a search or chat returns every memory its query may see."""
KEY_USER = "u1"
"""The user the remote test's API key is bound to."""


# ---- the data ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seeded:
    """One stored memory as the test wrote it."""

    id: str
    text: str
    user_id: str | None
    agent_id: str | None
    run_id: str | None

    def ids(self) -> dict[str, str | None]:
        return {"user_id": self.user_id, "agent_id": self.agent_id, "run_id": self.run_id}


def label(user: str | None, agent: str | None, run: str | None) -> str:
    return "/".join(v or "-" for v in (user, agent, run))


def fill(c: ClientAdapter) -> list[Seeded]:
    """One memory per scope Mem0 allows over the test's ids (its text names the scope), the narrowest scopes first
    (user, agent and run; then two ids; then one), then the twins; stored with ``infer=False`` (no LLM), oldest
    first in this order. Narrow first: a broader scope's memory is added after memories it may not be encoded
    after."""
    scopes = [s for s in itertools.product((None, *USERS), (None, *AGENTS), (None, *RUNS)) if any(s)]
    scopes.sort(key=lambda s: -sum(v is not None for v in s))  # stable: each size in product order
    wanted = [(f"{label(*s)} secret note {i}", s) for i, s in enumerate(scopes)]
    wanted += [(TWIN_TEXT, s) for s in TWIN_SCOPES]
    seeded = []
    for text, (user, agent, run) in wanted:
        added = c.add(text, user_id=user, agent_id=agent, run_id=run, infer=False)["results"]
        assert len(added) == 1, added
        seeded.append(Seeded(added[0]["id"], text, user, agent, run))
    return seeded


# ---- the queries and the reference rule -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """A condition per scope field: ``None`` (left out), ``"*"`` (the wildcard) or an id."""

    user_id: str | None
    agent_id: str | None
    run_id: str | None

    def conditions(self) -> dict[str, str | None]:
        return {"user_id": self.user_id, "agent_id": self.agent_id, "run_id": self.run_id}

    def given(self) -> dict[str, str]:
        """The conditions the query states, wildcards included."""
        return {k: v for k, v in self.conditions().items() if v is not None}

    def pinned(self) -> dict[str, str]:
        """The ids the query pins to a value: its scope."""
        return {k: v for k, v in self.given().items() if v != WILDCARD}

    def without_wildcards(self) -> Query:
        """The query of its scope alone."""
        return Query(*(v if v != WILDCARD else None for v in self.conditions().values()))

    @property
    def has_wildcard(self) -> bool:
        return WILDCARD in self.conditions().values()

    def sees(self, memory: Seeded) -> bool:
        """The reference rule (see the module docstring)."""
        for key, condition in self.conditions().items():
            value = memory.ids()[key]
            if condition == WILDCARD and value is None:
                return False
            if condition not in (None, WILDCARD) and value != condition:
                return False
        return True

    def shapes(self) -> dict[str, dict[str, Any]]:
        """Every way a client can ask this query, as keyword arguments: ``v1`` ids (no wildcard), ``v2`` flat
        filters, ``v2-AND`` (one condition per ``AND`` item), ``mixed`` (the user as a keyword, the rest in
        filters). Each must give the same answer."""
        given = self.given()
        shapes: dict[str, dict[str, Any]] = {}
        if not self.has_wildcard:
            shapes["v1"] = dict(given)
        shapes["v2"] = {"filters": dict(given)}
        if len(given) > 1:
            shapes["v2-AND"] = {"filters": {"AND": [{k: v} for k, v in given.items()]}}
        rest = {k: v for k, v in given.items() if k != "user_id"}
        if self.user_id not in (None, WILDCARD) and rest:
            shapes["mixed"] = {"user_id": self.user_id, "filters": rest}
        return shapes

    def one_shape(self) -> dict[str, Any]:
        """The plainest shape: v1 ids, or v2 filters when the query holds a wildcard."""
        return {"filters": self.given()} if self.has_wildcard else self.given()

    def __str__(self) -> str:
        return label(self.user_id, self.agent_id, self.run_id)


V1_QUERIES = [
    Query(*ids) for ids in itertools.product((None, *USERS, UNKNOWN_USER), (None, *AGENTS), (None, *RUNS)) if any(ids)
]
"""Every combination of v1 ids, each given or left out, an unknown user included: 44 queries."""

V2_QUERIES = [
    Query(*ids)
    for ids in itertools.product((None, *USERS, WILDCARD), (None, *AGENTS, WILDCARD), (None, *RUNS, WILDCARD))
]
"""Every combination of v2 conditions (left out, each id, ``"*"``): 80, of which 8 pin no id."""

QUERIES = list(dict.fromkeys([*V1_QUERIES, *V2_QUERIES]))
"""Both sets without repeats: 89 queries, 81 of which pin an id."""


def relative_queries(memory: Seeded) -> list[Query]:
    """Every v1 query as it relates to ``memory``, field by field: left out, naming the memory's own id (when it has
    one), or naming another id (another user, agent or run; any id for a field the memory lacks). The rule decides
    per field from exactly these three cases, so this covers every case of it for the memory, at a fraction of the
    cost of all 44 :data:`V1_QUERIES` (an unknown user is one of the "another id" cases of the full grid)."""
    choices = []
    for key, values in zip(SCOPE_KEYS, (USERS, AGENTS, RUNS), strict=True):
        own = memory.ids()[key]
        other = next(v for v in values if v != own)
        choices.append((None, other) if own is None else (None, own, other))
    return [Query(*ids) for ids in itertools.product(*choices) if any(ids)]


def expected_ids(query: Query, seeded: Sequence[Seeded]) -> list[str]:
    """The ids ``query`` may see, oldest first (``get_all``'s order)."""
    return [m.id for m in seeded if query.sees(m)]


def _short(value: object, limit: int = 300) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[:limit]}..."


@dataclass
class Report:
    """Mismatches between the product and the reference, collected so that a failure lists them all."""

    checks: int = 0
    mismatches: list[str] = field(default_factory=list)

    def equal(self, what: str, expected: object, got: object) -> None:
        self.checks += 1
        if expected != got:
            self.mismatches.append(f"{what}: expected {_short(expected)}, got {_short(got)}")

    def true(self, what: str, ok: bool) -> None:
        self.checks += 1
        if not ok:
            self.mismatches.append(what)

    def raises(self, what: str, error: type[Exception], call: Any, *args: Any, **kwargs: Any) -> None:
        self.checks += 1
        try:
            got = call(*args, **kwargs)
        except error:
            return
        except Exception as exc:  # any other outcome is a mismatch to list, not a reason to stop
            self.mismatches.append(f"{what}: expected {error.__name__}, got {type(exc).__name__}: {exc}")
            return
        self.mismatches.append(f"{what}: expected {error.__name__}, got the answer {_short(got)}")

    def assert_clean(self) -> None:
        shown = "\n  ".join(self.mismatches[:40])
        assert not self.mismatches, f"{len(self.mismatches)} of {self.checks} checks differ:\n  {shown}"


# ---- what the engine is handed -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handed:
    """What one chat handed the engine: the tenant salt, and the K/V (kv mode) or memory tokens (prompt mode)."""

    mode: str
    cache_scope: str
    facts: tuple[FactKV, ...] = ()
    fact_ids: tuple[tuple[int, ...], ...] = ()

    def __repr__(self) -> str:
        n = len(self.facts) if self.mode == "kv" else len(self.fact_ids)
        return f"Handed({self.mode}, {self.cache_scope!r}, {n} memories)"


@dataclass
class Spy:
    """Records what chats hand the engine (generation replaced by an immediate empty answer) and which K/V store
    entries they read and write."""

    handed: list[Handed] = field(default_factory=list)
    reads: list[KVKey] = field(default_factory=list)
    writes: list[KVKey] = field(default_factory=list)

    def take(self) -> tuple[list[Handed], list[KVKey], list[KVKey]]:
        """What was recorded since the last call, then forget it."""
        taken = (self.handed, self.reads, self.writes)
        self.handed, self.reads, self.writes = [], [], []
        return taken


def _answer(memory_tokens: int) -> Iterator[Generation]:
    yield Generation("", [], 0.0, 0.0, 0.0, prompt_tokens=memory_tokens, memory_tokens=memory_tokens)


def spy_on(engine: Engine, store: KVStore, monkeypatch: pytest.MonkeyPatch) -> Spy:
    """Replace ``engine``'s generation with a recorder, and record the reads and writes of the K/V ``store``."""
    spy = Spy()

    def stream_kv(conversation: Any, facts: Sequence[FactKV], *args: Any, cache_scope: str = "", **kw: Any) -> Any:
        spy.handed.append(Handed("kv", cache_scope, facts=tuple(facts)))
        return _answer(sum(f.n_tokens for f in facts))

    def stream_prompt(conversation: Any, fact_ids: Any, *args: Any, cache_scope: str = "", **kw: Any) -> Any:
        ids = tuple(tuple(int(t) for t in f) for f in fact_ids)
        spy.handed.append(Handed("prompt", cache_scope, fact_ids=ids))
        return _answer(sum(len(f) for f in ids))

    get, put = store.get, store.put

    def read(key: KVKey) -> FactKV | None:
        spy.reads.append(key)
        return get(key)

    def write(key: KVKey, fact: FactKV) -> str:
        spy.writes.append(key)
        return put(key, fact)

    monkeypatch.setattr(engine, "stream_kv", stream_kv)
    monkeypatch.setattr(engine, "stream_prompt", stream_prompt)
    monkeypatch.setattr(store, "get", read)
    monkeypatch.setattr(store, "put", write)
    return spy


@dataclass
class Reference:
    """Each memory's fact tokens, and its K/V encoded afresh (one batch, outside the K/V store): after its context
    turns, and after the system prefix alone (how a chat serves the memory it lays out first:
    ``kv.first_memory_context_free``)."""

    tokens: dict[str, list[int]]
    fresh: dict[str, FactKV]
    fresh_first: dict[str, FactKV]

    @classmethod
    def of(cls, c: ClientAdapter, seeded: Sequence[Seeded]) -> Reference:
        records = [c.db.get(m.id) for m in seeded]
        assert all(r is not None for r in records)
        requests = [c.fact_kv.encode_request(r) for r in records if r is not None]
        requests += [context_free_request(c.engine, m.text) for m in seeded]
        fresh = c.engine.encode_facts(requests)
        tokens = {m.id: list(c.engine.fact_token_ids(m.text)) for m in seeded}
        ids = [m.id for m in seeded]
        return cls(
            tokens, dict(zip(ids, fresh[: len(ids)], strict=True)), dict(zip(ids, fresh[len(ids) :], strict=True))
        )

    def matches(self, memory_id: str, fact: FactKV, first: bool = False) -> bool:
        """Whether ``fact`` holds the K/V of ``memory_id``'s own text, as a fresh encoding gives them (float32: to
        rounding, since a batch's padding may change the last bits): after its context turns, or with ``first``,
        after the system prefix alone."""
        want = (self.fresh_first if first else self.fresh)[memory_id]
        return (
            fact.token_ids.tolist() == self.tokens[memory_id]
            and fact.encoded_at == want.encoded_at
            and torch.allclose(fact.keys.float().cpu(), want.keys.float(), atol=1e-5, rtol=1e-4)
            and torch.allclose(fact.values.float().cpu(), want.values.float(), atol=1e-5, rtol=1e-4)
        )


def check_handed(
    report: Report,
    what: str,
    mode: str,
    memory_ids: list[str],
    scope: Scope,
    recorded: tuple[list[Handed], list[KVKey], list[KVKey]],
    ref: Reference,
) -> None:
    """One chat handed the engine exactly ``memory_ids``' own K/V or tokens, salted with ``scope``, and read and wrote
    K/V store entries of those memories only."""
    handed, reads, writes = recorded
    report.equal(f"{what}: engine calls", 1, len(handed))
    if len(handed) != 1:
        return
    call = handed[0]
    report.equal(f"{what}: engine mode", mode, call.mode)
    report.equal(f"{what}: cache salt", scope.key(), call.cache_scope)
    if mode == "kv":
        report.equal(f"{what}: injected facts", len(memory_ids), len(call.facts))
        for slot, (memory_id, fact) in enumerate(zip(memory_ids, call.facts, strict=False)):
            own = ref.matches(memory_id, fact, first=slot == 0)
            report.true(f"{what}: the K/V injected for {memory_id} in slot {slot} are not its own", own)
        report.equal(f"{what}: K/V store reads", memory_ids, [k.memory_id for k in reads])
    else:
        report.equal(
            f"{what}: pasted memory tokens", [ref.tokens[i] for i in memory_ids], [list(f) for f in call.fact_ids]
        )
        report.equal(f"{what}: K/V store reads", [], [k.memory_id for k in reads])
    report.true(f"{what}: wrote K/V of another memory: {writes}", {k.memory_id for k in writes} <= set(memory_ids))


# ---- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _faiss_on_one_thread() -> Iterator[None]:
    """FAISS on one OpenMP thread (the test's thread; the async client's worker threads keep the default): a search
    of a few dozen vectors took ~10 ms with two threads on a busy two-core machine, and this module searches over a
    thousand times."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def engine() -> Any:
    """A tiny float32 Llama with a byte-level tokenizer: real K/V and real token ids, no model download."""
    return tiny_engine("llama")


STORES = [
    pytest.param(("sqlite", "sync"), id="sqlite-sync"),
    pytest.param(("sqlite", "async"), id="sqlite-async"),
    pytest.param(("postgres", "sync"), id="postgres-sync", marks=pytest.mark.postgres),
    pytest.param(("postgres", "async"), id="postgres-async", marks=pytest.mark.postgres),
]


@dataclass
class Tenants:
    """A filled store, its client, and the reference K/V of its memories."""

    client: ClientAdapter
    seeded: list[Seeded]
    url: str

    @property
    def by_id(self) -> dict[str, Seeded]:
        return {m.id: m for m in self.seeded}

    @functools.cached_property
    def reference(self) -> Reference:
        return Reference.of(self.client, self.seeded)


@pytest.fixture(scope="module", params=STORES)
def tenants(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, engine: Any) -> Iterator[Tenants]:
    """A client of each local kind on each backend, filled by :func:`fill` once and only read by the tests."""
    backend: Backend
    backend, kind = request.param
    directory = tmp_path_factory.mktemp(f"{backend}-{kind}")
    with database_url(backend, directory) as url:
        client = open_client(kind, fake_config(directory, url), engine=engine, embedder=HashEmbedder())
        try:
            yield Tenants(client, fill(client), url)
        finally:
            client.close()


# ---- search, get_all, get, history ----------------------------------------------------------------------------


def test_search_and_get_all_see_exactly_the_reference_set_in_every_call_shape(tenants: Tenants) -> None:
    """Every query in every shape: the ids :func:`expected_ids` gives (``get_all`` in its order), each answer the
    memory as stored; a query that pins no id is a ScopeError."""
    c, seeded, by_id = tenants.client, tenants.seeded, tenants.by_id
    report = Report()
    for query in QUERIES:
        expected = expected_ids(query, seeded)
        for shape, kwargs in query.shapes().items():
            what = f"{shape} {query}"
            if not query.pinned():
                report.raises(f"search {what}", ScopeError, c.search, QUESTION, limit=LIMIT, **kwargs)
                report.raises(f"get_all {what}", ScopeError, c.get_all, **kwargs)
                continue
            found = c.search(QUESTION, limit=LIMIT, **kwargs)["results"]
            report.equal(f"search {what}", sorted(expected), sorted(r["id"] for r in found))
            listed = c.get_all(limit=LIMIT, **kwargs)["results"]
            report.equal(f"get_all {what}", expected, [r["id"] for r in listed])
            for r in [*found, *listed]:  # each answer is the memory as stored, with its own scope
                if (m := by_id.get(r["id"])) is not None:
                    shown = (r["memory"], {k: r.get(k) for k in SCOPE_KEYS})
                    report.equal(f"{what}: answer {r['id']}", (m.text, m.ids()), shown)
    report.assert_clean()


def test_get_and_history_by_id_see_exactly_the_reference_set(tenants: Tenants) -> None:
    """Each memory by id, without ids (Mem0: the id alone addresses it) and under every :func:`relative_queries`."""
    c, seeded = tenants.client, tenants.seeded
    report = Report()
    for m in seeded:
        for query in [None, *relative_queries(m)]:
            ids = query.given() if query is not None else {}
            visible = query is None or query.sees(m)
            what = f"{m.id} ({label(*m.ids().values())}) under {query or 'no ids'}"
            got = c.get(m.id, **ids)
            report.equal(f"get {what}", (m.id, m.text) if visible else None, got and (got["id"], got["memory"]))
            rows = c.history(m.id, **ids)
            shown = [(h["memory_id"], h["event"], h["new_memory"]) for h in rows]
            report.equal(f"history {what}", [(m.id, "ADD", m.text)] if visible else [], shown)
    report.assert_clean()


# ---- chat and the K/V store ------------------------------------------------------------------------------------


def test_each_memory_is_encoded_after_memories_of_exactly_its_own_scope(tenants: Tenants) -> None:
    """Context-window encoding: a memory's K/V are encoded after the texts of the memories stored before it in
    exactly its scope (the last ``kv.context_window``). Never a narrower scope's, though the broader scope's reads see
    them: ``-/a1/-`` is the agent's own memory and must not carry a text of u1's, which u1's ``delete_all`` would
    leave behind in the agent's K/V."""
    c, seeded = tenants.client, tenants.seeded
    window = c.config.kv.context_window
    report = Report()
    for i, m in enumerate(seeded):
        record = c.db.get(m.id)
        own = [n.text for n in seeded[:i] if n.ids() == m.ids()][-window:] if window else []
        report.equal(f"context of {label(*m.ids().values())} ({m.id})", own, record and record.context)
    report.assert_clean()


@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_chat_uses_and_hands_the_engine_exactly_the_reference_set(
    tenants: Tenants, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every query (v1 ids, or v2 filters with its wildcards): the memories the chat used are the reference set, in
    search's order; the engine got exactly their own K/V (kv) or tokens (prompt), salted with the query's scope; the
    K/V store was read for them only. A query that pins no id never reaches the engine."""
    c, seeded = tenants.client, tenants.seeded
    ref = tenants.reference
    spy = spy_on(c.engine, c.fact_kv.store, monkeypatch)
    report = Report()
    for query in QUERIES:
        kwargs = query.one_shape()
        what = f"chat {mode} {query}"
        if not query.pinned():
            report.raises(what, ScopeError, c.chat, QUESTION, mode=mode, limit=LIMIT, max_new_tokens=1, **kwargs)
            report.equal(f"{what}: reached the engine", [], spy.take()[0])
            continue
        result = c.chat(QUESTION, mode=mode, limit=LIMIT, max_new_tokens=1, **kwargs)
        recorded = spy.take()
        report.equal(f"{what}: memory ids", sorted(expected_ids(query, seeded)), sorted(result.memory_ids))
        if mode == "kv":  # both modes choose the memories alike
            searched = [r["id"] for r in c.search(QUESTION, limit=LIMIT, **kwargs)["results"]]
            report.equal(f"{what}: order (as search ranks them)", searched, result.memory_ids)
        report.equal(f"{what}: memories", [tenants.by_id[i].text for i in result.memory_ids], result.memories)
        check_handed(report, what, mode, result.memory_ids, Scope(**query.pinned()), recorded, ref)
    if mode == "kv":
        check_kv_store(report, tenants, ref)
    report.assert_clean()


def check_kv_store(report: Report, tenants: Tenants, ref: Reference) -> None:
    """After the kv chats: every ``kv_entries`` row names a stored memory and that memory's text hash, every memory
    has an entry, and each entry under a memory's keys (its context-window and its context-free encoding) holds that
    memory's own K/V."""
    c, by_id = tenants.client, tenants.by_id
    engine = create_engine(tenants.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(KVEntryRow.memory_id, KVEntryRow.text_hash, KVEntryRow.encoding_key)).all()
    finally:
        engine.dispose()
    records = {i: c.db.get(i) for i in by_id}
    hashes = {i: r.hash for i, r in records.items() if r is not None}
    report.equal("kv_entries: the memories with rows", sorted(by_id), sorted({row.memory_id for row in rows}))
    for row in rows:
        report.equal(f"kv_entries row of {row.memory_id}: text hash", hashes.get(row.memory_id), row.text_hash)
    for memory_id, record in records.items():
        report.true(f"memory {memory_id} is gone", record is not None)
        if record is None:
            continue
        # its rows are under its two keys only (one when its context-free encoding is its in-context one), and
        # each row's entry is in the store and holds that encoding of the memory's own text
        keys = {
            c.fact_kv.key(record, e).encoding_key: c.fact_kv.canonical(record, e) for e in (IN_CONTEXT, CONTEXT_FREE)
        }
        row_keys = [row.encoding_key for row in rows if row.memory_id == memory_id]
        report.true(f"kv_entries rows of {memory_id} under other keys: {row_keys}", set(row_keys) <= set(keys))
        for encoding_key in row_keys:
            encoding = keys.get(encoding_key)
            if encoding is None:
                continue
            stored = c.fact_kv.store.get(c.fact_kv.key(record, encoding))
            report.true(
                f"K/V store entry {encoding} of {memory_id} is missing or not its own",
                stored is not None and ref.matches(memory_id, stored, first=encoding.context_free),
            )


def test_chat_with_memory_ids_injects_only_memories_of_the_scope(
    tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every v1 scope may inject exactly the memories it sees, in the caller's order; a memory it does not see is
    refused (MemoryNotFoundError) before the engine runs, under every :func:`relative_queries` that excludes it."""
    c, seeded = tenants.client, tenants.seeded
    ref = tenants.reference
    spy = spy_on(c.engine, c.fact_kv.store, monkeypatch)
    report = Report()
    for query in V1_QUERIES:
        visible = expected_ids(query, seeded)[::-1]  # an order of the caller's, not the store's
        what = f"chat memory_ids {query}"
        result = c.chat(QUESTION, memory_ids=visible, max_new_tokens=1, **query.given())
        report.equal(f"{what}: memory ids", visible, result.memory_ids)
        check_handed(report, what, "kv", result.memory_ids, Scope(**query.given()), spy.take(), ref)
    for m in seeded:
        for query in relative_queries(m):
            if not query.sees(m):
                what = f"chat memory_ids {query}: {m.id} ({label(*m.ids().values())})"
                report.raises(what, MemoryNotFoundError, c.chat, QUESTION, memory_ids=[m.id], **query.given())
    report.equal("chat memory_ids: refused calls reached the engine", [], spy.take()[0])
    report.assert_clean()


def test_memory_ids_with_a_wildcard_filter_are_refused_not_injected(
    tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``filters={"user_id": "u1", "agent_id": "*"}`` sees only memories with an agent; with ``memory_ids`` the
    wildcard used to be taken for a scope name and dropped, so u1's memory without an agent was injected. A wildcard
    does more than name the scope: with ``memory_ids`` it is an InvalidInputError, on every wildcard query, before
    the engine runs."""
    c, seeded = tenants.client, tenants.seeded
    spy = spy_on(c.engine, c.fact_kv.store, monkeypatch)
    report = Report()
    for query in V2_QUERIES:
        if query.has_wildcard and query.pinned():
            in_scope = expected_ids(query.without_wildcards(), seeded)  # some of them outside the filter
            assert set(in_scope) > set(expected_ids(query, seeded))  # the fill has memories the wildcard excludes
            what = f"chat memory_ids with filters {query.given()}"
            report.raises(what, InvalidInputError, c.chat, QUESTION, memory_ids=in_scope, filters=query.given())
    report.equal("chat memory_ids with a wildcard: calls that reached the engine", [], spy.take()[0])
    report.assert_clean()


def test_distinct_scopes_salt_the_engines_cache_differently_whatever_their_ids_hold() -> None:
    """``Scope.key`` salts the vLLM prefix cache per tenant. It used to join ``field=value`` with ``|``, so
    ``user_id="x|agent_id=y"`` and ``(user_id="x", agent_id="y|agent_id=")`` shared a salt (and ``|`` is common in
    real ids, e.g. Auth0's ``"auth0|42"``)."""
    ids = ["x", "y", "x|agent_id=y", "y|agent_id=", "x|", "|run_id=", "=", '"', "\\", "null", "None", "x,y"]
    scopes = {Scope(*triple) for triple in itertools.product([None, *ids], repeat=3) if any(triple)}
    keys = {scope.key() for scope in scopes}
    assert len(keys) == len(scopes)


def test_an_int_scope_id_names_the_same_scope_as_its_decimal_string() -> None:
    """``Scope.of`` is how the clients build a call's scope from ids as callers give them."""
    assert Scope.of(42, None, "r1") == Scope("42", None, "r1")
    assert Scope.of(42, None, None).key() == Scope.of("42", None, None).key() != Scope.of("042", None, None).key()
    with pytest.raises(ScopeError, match="at least one of user_id"):
        Scope.of(None, None, None)
    with pytest.raises(ScopeError, match="agent_id must be a non-empty string or an int, got True"):
        Scope.of("maya", True, None)


# ---- a key bound to one user ---------------------------------------------------------------------------------


@dataclass
class Keyed:
    """A keyed server filled by its admin key, and a remote client holding a key bound to :data:`KEY_USER`."""

    tenant: ClientAdapter
    served: AsyncMemoryClient
    seeded: list[Seeded]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, engine: Any) -> Iterator[Keyed]:
    """On SQLite only: the key's scope rules are the server's, above the store; both stores' answers to the same
    scopes are checked through the local clients above."""
    pytest.importorskip("fastapi", reason="the server needs FastAPI (pip install 'inferscale-memory[server]')")
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'inferscale-memory[server]')")
    from server_fixture import running_server

    from inferscale.server.app import create_app
    from inferscale.server.keys import KeyStore
    from inferscale.server.options import ServerOptions

    directory = tmp_path_factory.mktemp("keyed")
    with database_url("sqlite", directory) as url, ExitStack() as stack:
        config = fake_config(directory, url)
        served = AsyncMemoryClient(config, engine=engine, embedder=HashEmbedder())
        keys = KeyStore.for_config(config)
        stack.callback(keys.close)  # after the server stopped (it closes the client it serves)
        admin_key = keys.create("admin", admin=True)[1]
        user_key = keys.create(KEY_USER, user_ids=[KEY_USER])[1]
        base = stack.enter_context(running_server(create_app(served, keys=keys, options=ServerOptions())))
        admin = ClientAdapter(MemoryClient(host=base, api_key=admin_key))
        tenant = ClientAdapter(MemoryClient(host=base, api_key=user_key))
        stack.callback(admin.close)
        stack.callback(tenant.close)
        yield Keyed(tenant, served, fill(admin))


def test_a_key_bound_to_one_user_sees_exactly_that_users_share(keyed: Keyed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoped calls: a query naming another user is refused; otherwise the key's user is filled in where the query
    names none (a wildcard included) and the rule decides. Id-addressed calls see only the key's user's memories.

    A chat naming no id at all is the key's user's chat, as a search naming none is: the remote client used to refuse
    it before sending it (ScopeError), while ``search()`` got the key's user filled in."""
    c, seeded, engine = keyed.tenant, keyed.seeded, keyed.served.engine
    by_id = {m.id: m for m in seeded}
    spy = spy_on(engine, keyed.served.fact_kv.store, monkeypatch)
    report = Report()
    for query in QUERIES:
        kwargs = query.one_shape()
        what = f"key of {KEY_USER}: {query}"
        if query.user_id not in (None, WILDCARD, KEY_USER):
            for name, call in (("search", c.search), ("chat", c.chat)):
                report.raises(f"{name} {what}", PermissionDeniedError, call, QUESTION, limit=LIMIT, **kwargs)
            report.raises(f"get_all {what}", PermissionDeniedError, c.get_all, limit=LIMIT, **kwargs)
            continue
        effective = Query(KEY_USER, query.agent_id, query.run_id)
        expected = expected_ids(effective, seeded)
        found = c.search(QUESTION, limit=LIMIT, **kwargs)["results"]
        report.equal(f"search {what}", sorted(expected), sorted(r["id"] for r in found))
        report.equal(f"get_all {what}", expected, [r["id"] for r in c.get_all(limit=LIMIT, **kwargs)["results"]])
        result = c.chat(QUESTION, limit=LIMIT, max_new_tokens=1, **kwargs)
        report.equal(f"chat {what}", sorted(expected), sorted(result.memory_ids))
        handed = spy.take()[0]
        report.equal(f"chat {what}: cache salt", [Scope(**effective.pinned()).key()], [h.cache_scope for h in handed])
        injected = [f.token_ids.tolist() for h in handed for f in h.facts]
        own = [list(engine.fact_token_ids(by_id[i].text)) for i in result.memory_ids]
        report.equal(f"chat {what}: injected tokens", own, injected)
    for m in seeded:
        mine = m.user_id == KEY_USER
        for ids in ({}, {"user_id": KEY_USER}, {k: v for k, v in m.ids().items() if v is not None}):
            what = f"key of {KEY_USER}: {m.id} ({label(*m.ids().values())}) under {ids or 'no ids'}"
            if ids.get("user_id", KEY_USER) != KEY_USER:
                report.raises(f"get {what}", PermissionDeniedError, c.get, m.id, **ids)
                report.raises(f"history {what}", PermissionDeniedError, c.history, m.id, **ids)
                continue
            visible = mine and all(m.ids()[k] == v for k, v in ids.items())
            got = c.get(m.id, **ids)
            report.equal(f"get {what}", m.id if visible else None, got and got["id"])
            rows = c.history(m.id, **ids)
            report.equal(
                f"history {what}", [(m.id, "ADD")] if visible else [], [(h["memory_id"], h["event"]) for h in rows]
            )
        other = {"user_id": "u2"}
        report.raises(f"get {m.id} naming u2", PermissionDeniedError, c.get, m.id, **other)
    report.assert_clean()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_users_delete_all_leaves_no_trace_in_an_agents_own_kv(
    tmp_path: Path, db_url: str, kind: ClientKind, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's own memory stored after one of its user's used to be encoded after that user's text, which then
    outlived the user's ``delete_all`` in the K/V every reader of the agent is served. Now it follows its own scope's
    memories only, so after the deletion the agent is served the K/V of its fact after the system prefix alone."""
    c = open_client(kind, fake_config(tmp_path, db_url), engine=engine, embedder=HashEmbedder())
    try:
        c.add("u1/a1/- secret: my door code is 1234", user_id="u1", agent_id="a1", infer=False)
        shared = c.add("-/a1/- the desk opens at 8", agent_id="a1", infer=False)["results"][0]["id"]
        later = c.add("-/a1/- the lift is slow", agent_id="a1", infer=False)["results"][0]["id"]
        c.delete_all(user_id="u1")
        record = c.db.get(shared)
        assert record is not None and record.context == []
        spy = spy_on(c.engine, c.fact_kv.store, monkeypatch)
        # served second, so from its context-window encoding (the first slot's context-free one holds no context)
        c.chat(QUESTION, agent_id="a1", memory_ids=[later, shared], max_new_tokens=1)
        (handed,) = spy.take()[0]
        alone = c.engine.encode_facts([c.fact_kv.encode_request(dataclasses.replace(record, context=[]))])[0]
        assert torch.allclose(handed.facts[1].keys.cpu(), alone.keys, atol=1e-5, rtol=1e-4)
        assert torch.allclose(handed.facts[1].values.cpu(), alone.values, atol=1e-5, rtol=1e-4)
    finally:
        c.close()
