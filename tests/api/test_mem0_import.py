"""``import_memories``: a Mem0 user's stored memories move over with their ids, texts, scopes, metadata and times,
laid out and encoded as ``add(infer=False)`` of the same texts would be; a second run stores nothing twice; one bad
record stores nothing.

On a tiny float32 model with a byte-level tokenizer (real encoding), sync and async clients, both databases. The
records are shaped as Mem0 2.2.1 writes them (``mem0/memory/main.py``: ``get_all``'s result items and the payloads
of its vector stores).
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from tiny_models import tiny_engine

from inferscale import AsyncMemoryClient, ConfigError, InvalidInputError, MemoryClient, MemoryConfig, ScopeError
from inferscale.config import KVConfig
from inferscale.fact_kv import IN_CONTEXT
from inferscale.mem0_import import read_mem0_file
from inferscale.storage import MemoryRecord

IDS = [
    "5c1f3c52-7e0e-4c55-9a43-7c1d1f6b2a01",
    "0b6e2d0a-2f1b-4f0e-8a43-0d9b6c1e3a02",
    "9a7d5e44-1c3b-4a6f-b2d8-5e4f3a2b1c03",
    "e3c2b1a0-9f8e-4d7c-a6b5-4c3d2e1f0a04",
]


def _item(i: int, text: str, created: str, **extra: Any) -> dict[str, Any]:
    """A Mem0 2.2.1 ``get_all`` result item."""
    return {
        "id": IDS[i],
        "memory": text,
        "hash": "0" * 32,
        "created_at": created,
        "updated_at": extra.pop("updated", created),
        "user_id": extra.pop("user_id", "maya"),
        **extra,
    }


MAYA = [  # listed newest first, as Mem0's get_all may give them
    _item(0, "Lives in Porto.", "2026-03-02T10:00:00-08:00", role="user", actor_id="maya_s"),
    _item(1, "Has a beagle named Biscuit.", "2026-03-01T09:30:00.123456+00:00", metadata={"topic": "pets"}),
    _item(2, "Teaches chemistry.", "2026-02-28T08:00:00+00:00", updated="2026-03-05T12:00:00+00:00"),
]


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


class Client:
    """A sync or async client's calls as plain calls (the async ones run to the end on one event loop)."""

    def __init__(self, kind: str, config: MemoryConfig, engine: Any) -> None:
        self._runner = asyncio.Runner() if kind == "async" else None
        cls = AsyncMemoryClient if kind == "async" else MemoryClient
        self.client: Any = cls(config, engine=engine, embedder=HashEmbedder())

    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.client, method)(*args, **kwargs)
        return result if self._runner is None else self._runner.run(result)

    def record(self, memory_id: str) -> MemoryRecord:
        record = self.client.db.get(memory_id)
        assert record is not None
        return record

    def count(self) -> int:
        return len(self.client.db.all_memories())

    def close(self) -> None:
        self.run("close")
        if self._runner is not None:
            self._runner.close()


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest, tmp_path: Path, db_url: str, engine: Any) -> Any:
    built: list[Client] = []

    def build(**kv: Any) -> Client:
        config = MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(**{"encode_on_add": "lazy", **kv}))
        client = Client(request.param, config, engine)
        built.append(client)
        return client

    yield build
    for client in built:
        client.close()


def test_memories_keep_their_ids_scopes_metadata_and_times(make: Any) -> None:
    client = make()
    bob = _item(3, "Plays the cello.", "2026-01-01T00:00:00+00:00", user_id="bob", agent_id="tutor")
    out = client.run("import_memories", [*MAYA, bob])
    assert out["skipped"] == []
    assert [(r["id"], r["event"]) for r in out["results"]] == [
        (IDS[2], "ADD"),
        (IDS[1], "ADD"),
        (IDS[0], "ADD"),
        (IDS[3], "ADD"),
    ]

    listed = client.run("get_all", user_id="maya")["results"]
    assert [m["id"] for m in listed] == [IDS[2], IDS[1], IDS[0]]  # oldest first: by Mem0's created_at
    porto, biscuit, chemistry = (client.run("get", i) for i in IDS[:3])
    assert porto["memory"] == "Lives in Porto." and porto["user_id"] == "maya"
    assert (porto["role"], porto["actor_id"]) == ("user", "maya_s")  # shown beside the scope ids, as Mem0 does
    assert porto["created_at"] == "2026-03-02T18:00:00+00:00"  # -08:00 read as such, kept in UTC
    assert biscuit["metadata"] == {"topic": "pets"}
    assert biscuit["created_at"] == "2026-03-01T09:30:00.123456+00:00"
    assert (chemistry["created_at"], chemistry["updated_at"]) == (
        "2026-02-28T08:00:00+00:00",
        "2026-03-05T12:00:00+00:00",
    )
    cello = client.run("get", IDS[3])
    assert (cello["user_id"], cello["agent_id"], cello["memory"]) == ("bob", "tutor", "Plays the cello.")

    history = client.run("history", IDS[1])
    assert [(h["event"], h["new_memory"], h["created_at"]) for h in history] == [
        ("ADD", "Has a beagle named Biscuit.", "2026-03-01T09:30:00.123456+00:00")
    ]
    found = client.run("search", "beagle named Biscuit", user_id="maya", limit=1)["results"]
    assert [m["id"] for m in found] == [IDS[1]]  # embedded by InferScale's own embedder
    assert IDS[3] not in [m["id"] for m in client.run("search", "Plays the cello.", user_id="maya")["results"]]


FIVE = [_item(i % 4, f"Fact number {i}.", f"2026-01-0{i + 1}T00:00:00+00:00") for i in range(5)]
"""Five memories created a day apart (the ids are patched per test where they must differ)."""


def _five(ids: list[str]) -> list[dict[str, Any]]:
    return [{**record, "id": memory_id} for record, memory_id in zip(FIVE, ids, strict=True)]


FIVE_IDS = [*IDS, "7d1c2b3a-4e5f-4a6b-8c7d-9e0f1a2b3c05"]


def _laid_out_alike(client: Client, engine: Any, imported_ids: list[str], scope: str) -> None:
    """Each imported memory's context (and chain) equals that of the same text added with ``add(infer=False)`` one
    call at a time in ``scope``, and so do its stored K/V; those of a memory in no chain equal a fresh encoding."""
    twins = {m["memory"]: m["id"] for m in client.run("get_all", user_id=scope)["results"]}
    fact_kv = client.client.derived.fact_kv
    for memory_id in imported_ids:
        imported = client.record(memory_id)
        twin = client.record(twins[imported.text])
        assert (imported.context, imported.chain_from) == (twin.context, twin.chain_from), imported.text
        stored, twins_kv = (fact_kv.store.get(fact_kv.key(r, IN_CONTEXT)) for r in (imported, twin))
        assert stored is not None and twins_kv is not None
        assert torch.equal(stored.keys, twins_kv.keys) and torch.equal(stored.values, twins_kv.values)
        if imported.chain_from is None:  # a chained memory is encoded on its chain's stored K/V (tests/kv: chains)
            (fresh,) = engine.encode_facts([fact_kv.encode_request(imported)])
            assert torch.equal(stored.keys, fresh.keys) and torch.equal(stored.values, fresh.values)


@pytest.mark.parametrize("kv", [{}, {"chain_block": 3}], ids=["window", "chains"])
def test_a_scope_is_laid_out_and_encoded_as_add_without_inference_one_call_at_a_time(
    make: Any, engine: Any, kv: dict[str, Any]
) -> None:
    """Context-window encoding (w=2) and chains: an imported memory is encoded after the memories created before
    it in its scope (a review's find: the import laid a scope out as one add call of all its texts, keeping up to
    64 of them as each one's context), after the scope's memories stored before the import, and its K/V equal a
    fresh encoding. Five memories, listed newest first, into a scope that holds one already."""
    client = make(context_window=2, encode_on_add="eager", **kv)
    for scope in ("maya", "twin"):
        client.run("add", "Plays chess.", user_id=scope, infer=False)
    client.run("import_memories", list(reversed(_five(FIVE_IDS))))
    for record in FIVE:
        client.run("add", record["memory"], user_id="twin", infer=False)
    _laid_out_alike(client, engine, FIVE_IDS, "twin")
    if not kv:
        assert client.record(FIVE_IDS[4]).context == ["Fact number 2.", "Fact number 3."]
        assert client.record(FIVE_IDS[0]).context == ["Plays chess."]


def test_a_second_import_lays_new_memories_after_the_stored_ones(make: Any, engine: Any) -> None:
    """A review's find: the records imported before stayed in the layout, so a new one was laid out after copies of
    them (``[f2, f3, f0, f1, f2, f3]`` at w=2)."""
    client = make(context_window=2, encode_on_add="eager")
    five = _five(FIVE_IDS)
    client.run("import_memories", five[:4])
    again = client.run("import_memories", five)
    assert [r["id"] for r in again["results"]] == [FIVE_IDS[4]]
    assert {s["id"]: s["reason"] for s in again["skipped"]} == {i: "imported before" for i in FIVE_IDS[:4]}
    assert client.record(FIVE_IDS[4]).context == ["Fact number 2.", "Fact number 3."]


def test_a_memory_deleted_since_its_import_is_not_brought_back(make: Any) -> None:
    """A review's find: a re-import stored it again, its history then running backwards (ADD, DELETE, ADD dated
    before the DELETE)."""
    client = make()
    client.run("import_memories", MAYA)
    client.run("delete", IDS[1])
    again = client.run("import_memories", MAYA)
    assert again["results"] == []
    assert {s["id"]: s["reason"] for s in again["skipped"]}[IDS[1]] == "a memory with this id was deleted here"
    assert [h["event"] for h in client.run("history", IDS[1])] == ["ADD", "DELETE"]
    assert client.count() == 2


def test_a_memory_changed_since_its_import_is_kept_and_the_difference_said(make: Any) -> None:
    client = make()
    client.run("import_memories", MAYA[:1])
    edited = {**MAYA[0], "memory": "Lives in Lisbon now."}
    again = client.run("import_memories", [edited])
    assert again["skipped"] == [{"id": IDS[0], "reason": "imported before; its text here differs, kept"}]
    assert client.run("get", IDS[0])["memory"] == "Lives in Porto."


def test_a_memory_with_an_update_time_alone_is_dated_by_it(make: Any) -> None:
    """A review's find: ``created_at`` became the import's time, later than the memory's ``updated_at``."""
    client = make()
    record = {k: v for k, v in MAYA[1].items() if k != "created_at"}
    client.run("import_memories", [record])
    got = client.run("get", IDS[1])
    assert got["created_at"] == got["updated_at"] == "2026-03-01T09:30:00.123456+00:00"


def test_memories_are_laid_out_in_the_order_of_the_times_they_are_stored_with(make: Any) -> None:
    """A review's find: a memory with an update time alone was dated by it but laid out after every dated one."""
    client = make(context_window=2)
    first = {k: v for k, v in _item(0, "First.", "2026-01-01T00:00:00+00:00").items() if k != "created_at"}
    second, third = _item(1, "Second.", "2026-01-02T00:00:00+00:00"), _item(2, "Third.", "2026-01-03T00:00:00+00:00")
    client.run("import_memories", [third, second, first])
    assert [m["id"] for m in client.run("get_all", user_id="maya")["results"]] == IDS[:3]
    assert client.record(IDS[0]).context == []
    assert client.record(IDS[2]).context == ["First.", "Second."]


def test_times_without_a_zone_are_read_as_utc_when_asked(make: Any) -> None:
    client = make()
    naive = {**MAYA[0], "created_at": "2026-03-02T10:00:00", "updated_at": "2026-03-02T10:00:00"}
    with pytest.raises(InvalidInputError, match="no time zone") as refused:
        client.run("import_memories", [naive])
    assert str(refused.value).endswith(  # it named no way out (a new user's find)
        "has no time zone: give one (e.g. +00:00 for UTC), or read such times as UTC with assume_utc=True "
        "(`inferscale import-mem0 --assume-utc`)"
    )
    client.run("import_memories", [naive], assume_utc=True)
    assert client.run("get", IDS[0])["created_at"] == "2026-03-02T10:00:00+00:00"


def test_scope_ids_import_only_that_scope_and_a_platform_page_is_taken(make: Any) -> None:
    client = make()
    bob = _item(3, "Plays the cello.", "2026-01-01T00:00:00+00:00", user_id="bob", agent_id="tutor")
    page = {"count": 4, "next": None, "previous": None, "results": [*MAYA, bob]}
    out = client.run("import_memories", page, user_id="bob")
    assert [r["id"] for r in out["results"]] == [IDS[3]]
    assert client.run("import_memories", page, agent_id="tutor", user_id="maya")["results"] == []
    assert client.count() == 1


def test_importing_again_stores_nothing_twice(make: Any) -> None:
    client = make()
    client.run("import_memories", MAYA)
    again = client.run("import_memories", {"results": MAYA})  # get_all's return value as it is
    assert again["results"] == []
    assert again["skipped"] == [{"id": i, "reason": "imported before"} for i in IDS[:3]]
    assert client.count() == 3


def test_an_import_run_again_with_encode_kv_encodes_what_an_interrupted_one_left(make: Any) -> None:
    """A new user's find: ``import-mem0 --encode-kv`` interrupted after its memories were stored and before their K/V
    were encoded skipped them all as imported before when run again, and never encoded them. The rerun encodes the
    K/V they lack; one without ``encode_kv`` leaves them to the first chat, as before."""
    client = make()
    client.run("import_memories", MAYA, encode_kv=False)  # stored, K/V left: the state an interruption leaves
    derived = client.client.derived
    assert derived.missing_kv(IDS[:3]) == IDS[:3]
    client.run("import_memories", MAYA)  # the store's kv.encode_on_add: "lazy" here
    assert derived.missing_kv(IDS[:3]) == IDS[:3]
    again = client.run("import_memories", MAYA, encode_kv=True)
    assert again["results"] == [] and [s["id"] for s in again["skipped"]] == IDS[:3]
    assert derived.missing_kv(IDS[:3]) == []
    assert client.count() == 3


def test_an_import_run_again_with_background_encoding_queues_what_an_interrupted_one_left(make: Any) -> None:
    """As above, with the encoder behind ``add`` (``kv.encode_on_add="background"``, the default): the rerun queues
    the memories stored without K/V."""
    client = make(encode_on_add="background")
    client.run("import_memories", MAYA, encode_kv=False)
    derived = client.client.derived
    assert derived.missing_kv(IDS[:3]) == IDS[:3]
    client.run("import_memories", MAYA)
    assert client.run("wait_for_encoding", 120)
    assert derived.missing_kv(IDS[:3]) == []


def test_a_text_stored_twice_in_a_scope_keeps_both_ids(make: Any) -> None:
    client = make()
    twice = [_item(0, "Likes tea.", "2026-01-01T00:00:00Z"), _item(1, "Likes tea.", "2026-01-02T00:00:00Z")]
    client.run("import_memories", twice)
    assert [m["id"] for m in client.run("get_all", user_id="maya")["results"]] == IDS[:2]


def test_a_payload_of_mem0s_vector_store_is_read_with_its_metadata(make: Any, tmp_path: Path) -> None:
    """Mem0's faiss store writes ``<collection>.json``: payloads hold the metadata's keys beside Mem0's own."""
    folder = tmp_path / "mem0_faiss"
    folder.mkdir()
    payload = {
        "data": "Is allergic to peanuts.",
        "hash": "d41d8cd98f00b204e9800998ecf8427e",
        "text_lemmatized": "allergic peanut",
        "created_at": "2026-04-01T10:00:00+00:00",
        "updated_at": "2026-04-01T10:00:00+00:00",
        "user_id": "maya",
        "run_id": "visit-3",
        "role": "user",
        "severity": "high",
        "attributed_to": "user",
        "score": 5,
    }
    (folder / "people.json").write_text(json.dumps({"docstore": {IDS[0]: payload}, "index_to_id": {"0": IDS[0]}}))
    (folder / "people.faiss").write_bytes(b"")
    client = make()
    client.run("import_memories", read_mem0_file(folder, collection="people"))
    got = client.run("get", IDS[0])
    assert (got["memory"], got["user_id"], got["run_id"], got["role"]) == (
        "Is allergic to peanuts.",
        "maya",
        "visit-3",
        "user",
    )
    assert got["metadata"] == {"severity": "high", "attributed_to": "user", "score": 5}  # a payload's own key
    assert got["created_at"] == "2026-04-01T10:00:00+00:00"


def _qdrant_store(folder: Path, collection: str = "mem0") -> Any:
    """A local Qdrant store as Mem0 2.2.1 writes one (``mem0/vector_stores/qdrant.py``): a point per memory, its id
    the memory's, its payload Mem0's. Returns the open client (close it before reading the folder)."""
    qdrant = pytest.importorskip(
        "qdrant_client", reason="reading Qdrant needs pip install 'inferscale-memory[mem0-import]'"
    )
    client = qdrant.QdrantClient(path=str(folder))
    client.create_collection(collection, vectors_config=qdrant.models.VectorParams(size=4, distance="Cosine"))
    payloads = [
        {
            "data": m["memory"],
            "hash": m["hash"],
            "created_at": m["created_at"],
            "updated_at": m["updated_at"],
            "user_id": m["user_id"],
            **({"role": m["role"]} if "role" in m else {}),
            **({"actor_id": m["actor_id"]} if "actor_id" in m else {}),
            **m.get("metadata", {}),
        }
        for m in MAYA
    ]
    points = [
        qdrant.models.PointStruct(id=m["id"], vector=[0.1, 0.2, 0.3, 0.4], payload=p)
        for m, p in zip(MAYA, payloads, strict=True)
    ]
    client.upsert(collection, points=points)
    return client


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_mem0s_default_store_a_local_qdrant_folder_is_read_and_left_as_it_is(make: Any, tmp_path: Path) -> None:
    folder = tmp_path / "qdrant"
    _qdrant_store(folder).close()
    before = _files(folder)
    client = make()
    client.run("import_memories", read_mem0_file(folder))
    assert _files(folder) == before
    porto, biscuit = client.run("get", IDS[0]), client.run("get", IDS[1])
    assert (porto["memory"], porto["role"], porto["actor_id"]) == ("Lives in Porto.", "user", "maya_s")
    assert (biscuit["metadata"], biscuit["created_at"]) == ({"topic": "pets"}, "2026-03-01T09:30:00.123456+00:00")
    assert client.count() == 3


def test_a_qdrant_folder_open_elsewhere_or_without_the_collection_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "qdrant"
    open_client = _qdrant_store(folder, collection="books")
    with pytest.raises(InvalidInputError, match="Stop the process that has it open"):
        read_mem0_file(folder, collection="books")
    open_client.close()
    with pytest.raises(InvalidInputError, match=r"no collection 'mem0' \(it has \['books'\]\)"):
        read_mem0_file(folder)
    assert sorted(r["id"] for r in read_mem0_file(folder, collection="books")) == sorted(IDS[:3])


def test_a_qdrant_folder_without_qdrants_client_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "qdrant"
    _qdrant_store(folder).close()
    monkeypatch.setitem(sys.modules, "qdrant_client", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"inferscale-memory\[mem0-import\]"):
        read_mem0_file(folder)


BAD_RECORDS = [
    pytest.param({k: v for k, v in MAYA[2].items() if k != "id"}, InvalidInputError, "no id", id="no id"),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "metadata": {"user_id": "bob"}},
        InvalidInputError,
        "scope ids",
        id="scope in metadata",
    ),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "metadata": {"role": "assistant"}}, InvalidInputError, "both", id="role twice"
    ),
    pytest.param(
        {**MAYA[1], "id": IDS[3], "categories": ["pets"], "metadata": {"categories": []}},
        InvalidInputError,
        "both",
        id="categories twice",
    ),
    pytest.param(
        {**MAYA[1], "id": IDS[3], "metadata": {"actor_id": "bob"}},
        InvalidInputError,
        "actor_id",
        id="actor in metadata",
    ),
    pytest.param({**MAYA[1], "id": IDS[3], "metadata": []}, InvalidInputError, "must be a dict", id="metadata []"),
    pytest.param(
        {**MAYA[1], "id": IDS[3], "metadata": False}, InvalidInputError, "must be a dict", id="metadata False"
    ),
    pytest.param(  # found by the bad-input fuzz: an OverflowError in the conversion to UTC
        {**MAYA[0], "id": IDS[3], "updated_at": "9999-12-31T23:59:59-05:00"},
        InvalidInputError,
        "out of datetime's range",
        id="time past year 9999 in UTC",
    ),
    pytest.param({"id": IDS[3], "user_id": "maya"}, InvalidInputError, "no text", id="no text"),
    pytest.param({**MAYA[0], "id": "mem-42"}, InvalidInputError, "canonical form", id="id not a UUID"),
    pytest.param({**MAYA[0], "id": IDS[3].upper()}, InvalidInputError, "canonical form", id="id in capitals"),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "created_at": "2026-03-02T10:00:00"},
        InvalidInputError,
        "no time zone",
        id="naive time",
    ),
    pytest.param({**MAYA[0], "id": IDS[3], "created_at": "yesterday"}, InvalidInputError, "ISO 8601", id="not a time"),
    pytest.param(  # epoch seconds: the message said only "must be a datetime", not that a string is taken
        {**MAYA[0], "id": IDS[3], "created_at": 1735689600},
        InvalidInputError,
        "created_at must be an ISO 8601 time string or a datetime, got 1735689600",
        id="epoch seconds",
    ),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "score": 0.4, "categories": ["x"], "owner": "o"},
        InvalidInputError,
        "'owner'",
        id="unknown key",
    ),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "metadata": ["x"]}, InvalidInputError, "metadata must be a dict", id="metadata list"
    ),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "expiration_date": "2999-01-01"}, InvalidInputError, "not past", id="expires later"
    ),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "expiration_date": "soon"}, InvalidInputError, "YYYY-MM-DD", id="bad expiry"
    ),
    pytest.param({**MAYA[0], "id": IDS[1]}, InvalidInputError, "id of record 1 too, which differs", id="repeated id"),
    pytest.param({**MAYA[0], "id": IDS[3], "user_id": None}, ScopeError, "record 3", id="no scope"),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "memory": "x" * 4001}, InvalidInputError, "at most 4000", id="text too long"
    ),
    pytest.param(
        {**MAYA[0], "id": IDS[3], "memory": "  "}, InvalidInputError, "must not be empty, whitespace", id="blank text"
    ),
    pytest.param("Lives in Porto.", InvalidInputError, "is a dict", id="not a dict"),
]


@pytest.mark.parametrize(("bad", "error", "says"), BAD_RECORDS)
def test_one_bad_record_stores_nothing(make: Any, bad: Any, error: type[Exception], says: str) -> None:
    client = make()
    client.run("add", "I play chess.", user_id="maya", infer=False)
    with pytest.raises(error, match=says) as raised:
        client.run("import_memories", [*MAYA, bad])
    assert type(raised.value) is error
    assert "record 3" in str(raised.value)
    assert client.count() == 1


def test_a_memory_in_two_exports_is_taken_once(make: Any) -> None:
    """A user's and an agent's ``get_all`` both list a memory of that user and agent (a helper's export of every
    scope was refused as holding one id twice)."""
    client = make()
    shared = _item(3, "Prefers email.", "2026-01-01T00:00:00+00:00", agent_id="support")
    graph = {"results": [*MAYA, shared, shared], "relations": []}  # Mem0 with a graph store adds relations
    out = client.run("import_memories", graph)
    assert [r["id"] for r in out["results"]].count(IDS[3]) == 1
    assert client.count() == 4


def test_a_memory_too_long_for_the_models_context_is_named_by_its_id(make: Any) -> None:
    client = make()
    too_long = _item(3, "word " * 500, "2026-01-01T00:00:00+00:00", user_id="bob")
    with pytest.raises(InvalidInputError, match=f"id {IDS[3]}"):
        client.run("import_memories", [*MAYA, too_long])
    assert client.count() == 0


def test_an_expired_memory_is_skipped_as_mem0_hides_it(make: Any) -> None:
    client = make()
    expired = {**MAYA[0], "id": IDS[3], "memory": "Is in Lisbon this week.", "expiration_date": "2026-01-31"}
    out = client.run("import_memories", [*MAYA, expired])
    assert out["skipped"] == [{"id": IDS[3], "reason": "expired on 2026-01-31"}]
    assert client.count() == 3


def test_an_id_held_in_another_scope_refuses_the_import_without_naming_that_scope(make: Any) -> None:
    client = make()
    client.run("import_memories", [_item(3, "Plays the cello.", "2026-01-01T00:00:00+00:00", user_id="bob")])
    with pytest.raises(InvalidInputError, match="held by a memory of another scope") as raised:
        client.run("import_memories", [*MAYA, _item(3, "Lives in Porto.", "2026-01-01T00:00:00+00:00")])
    assert "bob" not in str(raised.value)
    assert client.count() == 1  # maya's memories, checked first, are not written either


def test_the_file_reader_takes_mem0s_shapes_and_refuses_others(tmp_path: Path) -> None:
    listed, wrapped = tmp_path / "list.json", tmp_path / "wrapped.json"
    listed.write_text(json.dumps(MAYA))
    wrapped.write_text(json.dumps({"results": MAYA}))
    assert read_mem0_file(listed) == MAYA == read_mem0_file(wrapped)
    pickled = tmp_path / "old"
    pickled.mkdir()
    (pickled / "mem0.faiss").write_bytes(b"")
    (pickled / "mem0.pkl").write_bytes(b"\x80\x04")
    with pytest.raises(InvalidInputError, match=r"older pickle docstore mem0\.pkl"):
        read_mem0_file(pickled)
    with pytest.raises(InvalidInputError, match="no such file"):
        read_mem0_file(tmp_path / "missing.json")
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"memories": []}))
    with pytest.raises(InvalidInputError, match="none of Mem0's shapes"):
        read_mem0_file(odd)
    odd.write_text("{not json")
    with pytest.raises(InvalidInputError, match="cannot be read as JSON"):
        read_mem0_file(odd)
    odd.write_text("[" * 100_000 + "]" * 100_000)  # raised the JSON parser's bare RecursionError
    with pytest.raises(InvalidInputError, match="cannot be read as JSON: it nests deeper"):
        read_mem0_file(odd)
    for path, says in [
        ("~nosuchuser_h/x.json", "not a usable path"),
        ("a\x00b.json", "cannot be read as JSON"),
        ("x" * 300, "not a usable path"),  # a raw OSError (a name too long for the file system) before
        (5, "not a usable path"),
    ]:
        with pytest.raises(InvalidInputError, match=says):  # a raw RuntimeError and ValueError before
            read_mem0_file(path)
    with pytest.raises(InvalidInputError, match="plain file name"):
        read_mem0_file(tmp_path, collection="")


def test_records_are_checked_against_today_in_utc() -> None:
    from inferscale.mem0_import import mem0_memories

    record = {**MAYA[0], "expiration_date": "2026-05-01"}
    assert mem0_memories([record], 4000, today=datetime(2026, 5, 2, tzinfo=UTC).date()).expired == [
        (IDS[0], "2026-05-01")
    ]
    with pytest.raises(InvalidInputError, match="not past"):
        mem0_memories([record], 4000, today=datetime(2026, 5, 1, tzinfo=UTC).date())


# ---- Mem0's history (history.db): each memory's history starts at its ADD in Mem0 ---------------------------------

GONE_ID, OTHER_ID = "1f2e3d4c-5b6a-4978-8a7b-6c5d4e3f2a10", "2a3b4c5d-6e7f-4081-9a2b-3c4d5e6f7a11"


def _row(memory_id: str, event: str, old: str | None, new: str | None, created: str, **extra: Any) -> dict[str, Any]:
    """A row of Mem0 2.2.1's ``history`` table (``mem0/memory/storage.py``), as ``Memory.history`` returns it."""
    return {
        "id": extra.pop("row_id", f"00000000-0000-4000-8000-{len(created):012d}"),
        "memory_id": memory_id,
        "old_memory": old,
        "new_memory": new,
        "event": event,
        "created_at": created,
        "updated_at": extra.pop("updated_at", None),
        "is_deleted": 1 if event == "DELETE" else 0,
        "actor_id": extra.pop("actor_id", None),
        "role": extra.pop("role", None),
        **extra,
    }


CHEMISTRY_ROWS = [  # MAYA[2]'s life in Mem0: an UPDATE row keeps the memory's created_at and dates itself by updated_at
    _row(IDS[2], "ADD", None, "Teaches biology.", "2026-02-28T00:00:00-08:00"),
    _row(IDS[2], "UPDATE", "Teaches biology.", "Teaches physics.", "2026-02-28T00:00:00-08:00",
         updated_at="2026-03-01T07:00:00-08:00"),
    _row(IDS[2], "UPDATE", "Teaches physics.", "Teaches chemistry.", "2026-02-28T00:00:00-08:00",
         updated_at="2026-03-05T04:00:00-08:00", actor_id="maya_s"),
]  # fmt: skip
OTHER_ROWS = [  # a memory Mem0 deleted, and one of a scope not imported: their rows are not read
    _row(GONE_ID, "ADD", None, "Likes jazz.", "2026-01-01T00:00:00+00:00"),
    _row(GONE_ID, "DELETE", "Likes jazz.", None, "2026-01-01T00:00:00+00:00", updated_at="2026-01-02T00:00:00+00:00"),
    _row(OTHER_ID, "WHATEVER", None, None, "not a time"),
]


def test_mem0s_history_is_each_memorys_history_from_its_add(make: Any) -> None:
    """Mem0's rows of one memory, listed newest first, with the ADD written twice (Mem0's batch write fails half-way
    and writes it again one by one) and the rows of other memories among them."""
    client = make()
    rows = [*reversed(CHEMISTRY_ROWS), CHEMISTRY_ROWS[0] | {"id": "another row id"}, *OTHER_ROWS]
    client.run("import_memories", MAYA, history=rows)
    history = client.run("history", IDS[2])
    assert [(h["event"], h["old_memory"], h["new_memory"], h["created_at"], h["actor_id"]) for h in history] == [
        ("ADD", None, "Teaches biology.", "2026-02-28T08:00:00+00:00", None),
        ("UPDATE", "Teaches biology.", "Teaches physics.", "2026-03-01T15:00:00+00:00", None),
        ("UPDATE", "Teaches physics.", "Teaches chemistry.", "2026-03-05T12:00:00+00:00", "maya_s"),
    ]
    assert {h["user_id"] for h in history} == {"maya"}
    assert [h["event"] for h in client.run("history", IDS[1])] == ["ADD"]  # no rows in Mem0's history: one ADD
    assert client.run("history", GONE_ID) == [] and client.run("history", OTHER_ID) == []
    again = client.run("import_memories", MAYA, history=rows)
    assert again["results"] == [] and len(client.run("history", IDS[2])) == 3  # nothing stored twice


def _replaced(index: int, **changes: Any) -> list[dict[str, Any]]:
    return [row | changes if i == index else row for i, row in enumerate(CHEMISTRY_ROWS)]


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([*CHEMISTRY_ROWS, _row(IDS[2], "DELETE", "Teaches chemistry.", None, "2026-03-06T00:00:00+00:00")],
         "history row 3 of memory .*: Mem0 deleted this memory after its records were read"),
        (CHEMISTRY_ROWS[:2], "ends at 'Teaches physics.', not at its text 'Teaches chemistry.'"),
        (_replaced(1, old_memory="Teaches maths."),
         "does not chain: its UPDATE of 2026-03-01T15:00:00\\+00:00 from 'Teaches maths.' follows no row"),
        ([*CHEMISTRY_ROWS, _row(IDS[2], "ADD", None, "Teaches art.", "2026-03-09T00:00:00+00:00")],
         "has 2 ADD rows"),
        (_replaced(0, event="CREATE"), "history row 0 of memory .*: event 'CREATE' is none of Mem0's"),
        (_replaced(0, score=1), r"unknown keys \['score'\]"),
        (_replaced(1, created_at=None, updated_at=None), "history row 1 of memory .*: no time"),
        (_replaced(1, updated_at="2026-03-01T07:00:00"), "no time zone"),
        (_replaced(1, new_memory=""), "new_memory"),
        ([CHEMISTRY_ROWS[0] | {1: "x"}, *CHEMISTRY_ROWS[1:]], "history row 0 of memory .*: a Mem0 history row's keys"),
        ([*CHEMISTRY_ROWS, {"memory_id": None}], "history row 3: a Mem0 history row is a dict"),
        ({"results": CHEMISTRY_ROWS}, "history must be a list"),
    ],
)  # fmt: skip
def test_a_history_that_does_not_lead_to_the_memory_refuses_the_import(make: Any, rows: Any, says: str) -> None:
    client = make()
    with pytest.raises(InvalidInputError, match=says):
        client.run("import_memories", MAYA, history=rows)
    assert client.count() == 0


def test_a_history_is_ordered_by_how_its_texts_chain_and_keeps_each_rows_time_and_role(make: Any) -> None:
    """Found with real Mem0 2.2.1: a memory added with a created_at in its metadata two hours ahead (a naive local
    time, read with assume_utc) has its ADD dated after its UPDATE, and that valid history was refused. Two UPDATEs
    of one second, listed the wrong way round, chain as well. Mem0's rows keep each change's role and actor_id, which
    had been replaced by the memory's."""
    client = make()
    porto = [
        _row(IDS[0], "ADD", None, "Lives in Lisbon.", "2026-03-02T12:00:00+00:00", role="user", actor_id="maya_s"),
        _row(IDS[0], "UPDATE", "Lives in Faro.", "Lives in Porto.", "2026-03-02T12:00:00+00:00",
             updated_at="2026-03-02T10:00:05+00:00", role="user", actor_id="maya_s"),
        _row(IDS[0], "UPDATE", "Lives in Lisbon.", "Lives in Faro.", "2026-03-02T12:00:00+00:00",
             updated_at="2026-03-02T10:00:05+00:00", role="assistant"),
    ]  # fmt: skip
    client.run("import_memories", MAYA, history=porto)
    history = client.run("history", IDS[0])
    assert [(h["event"], h["new_memory"], h["created_at"], h["role"], h["actor_id"]) for h in history] == [
        ("ADD", "Lives in Lisbon.", "2026-03-02T12:00:00+00:00", "user", "maya_s"),
        ("UPDATE", "Lives in Faro.", "2026-03-02T10:00:05+00:00", "assistant", None),
        ("UPDATE", "Lives in Porto.", "2026-03-02T10:00:05+00:00", "user", "maya_s"),
    ]
    assert (history[2]["old_metadata"], history[2]["new_metadata"]) == (
        {"role": "assistant"},
        {"role": "user", "actor_id": "maya_s"},  # after the last change: the memory's metadata as it is
    )


def test_a_text_changed_back_and_then_on_chains_whichever_update_is_dated_first(make: Any) -> None:
    """A review's find: from each text the earliest UPDATE came next, so biology→physics→biology→chemistry with
    biology→chemistry dated first reached chemistry with two UPDATEs left, and was refused."""
    client = make()
    rows = [
        _row(IDS[2], "ADD", None, "Teaches biology.", "2026-02-28T08:00:00+00:00"),
        _row(IDS[2], "UPDATE", "Teaches biology.", "Teaches chemistry.", "2026-02-28T08:00:00+00:00",
             updated_at="2026-03-01T00:00:00+00:00"),
        _row(IDS[2], "UPDATE", "Teaches biology.", "Teaches physics.", "2026-02-28T08:00:00+00:00",
             updated_at="2026-03-02T00:00:00+00:00"),
        _row(IDS[2], "UPDATE", "Teaches physics.", "Teaches biology.", "2026-02-28T08:00:00+00:00",
             updated_at="2026-03-03T00:00:00+00:00"),
    ]  # fmt: skip
    client.run("import_memories", MAYA, history=rows)
    assert [(h["old_memory"], h["new_memory"]) for h in client.run("history", IDS[2])] == [
        (None, "Teaches biology."),
        ("Teaches biology.", "Teaches physics."),
        ("Teaches physics.", "Teaches biology."),
        ("Teaches biology.", "Teaches chemistry."),
    ]


def test_a_time_without_a_zone_in_the_history_is_read_as_utc_when_asked(make: Any) -> None:
    client = make()
    client.run("import_memories", MAYA, history=_replaced(1, updated_at="2026-03-01T15:00:00"), assume_utc=True)
    assert client.run("history", IDS[2])[1]["created_at"] == "2026-03-01T15:00:00+00:00"


MEM0_HISTORY_TABLE = """CREATE TABLE history (
    id TEXT PRIMARY KEY, memory_id TEXT, old_memory TEXT, new_memory TEXT, event TEXT, created_at DATETIME,
    updated_at DATETIME, is_deleted INTEGER, actor_id TEXT, role TEXT)"""
"""Mem0 2.2.1's table (``mem0/memory/storage.py``, ``SQLiteManager._create_history_table``)."""


def test_the_history_reader_takes_mem0s_history_db_and_json_and_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    import sqlite3

    from inferscale.mem0_history import read_mem0_history

    rows = [_row(IDS[2], "ADD", None, "x", "2026-01-01T00:00:00+00:00", row_id=f"row-{i}") for i in range(3)]
    db = tmp_path / "history.db"
    with sqlite3.connect(db) as connection:
        connection.execute(MEM0_HISTORY_TABLE)
        connection.executemany(
            "INSERT INTO history VALUES (:id, :memory_id, :old_memory, :new_memory, :event, :created_at, :updated_at, "
            ":is_deleted, :actor_id, :role)",
            rows,
        )
    connection.close()
    before = db.read_bytes()
    assert read_mem0_history(db) == rows
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["history.db"]
    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps(rows))
    assert read_mem0_history(listed) == rows
    empty = tmp_path / "other.db"
    with sqlite3.connect(empty) as connection:
        connection.execute("CREATE TABLE memories (id TEXT)")
    connection.close()
    for path, says in [
        (empty, r"cannot be read as Mem0's history\.db: no such table: history"),
        (tmp_path, "cannot be read as Mem0's history"),
        (tmp_path / "missing.db", "cannot be read as Mem0's history"),
        ("a\x00b.db", "cannot be read as Mem0's history"),
        ("~nosuchuser_h/history.db", "not a usable path"),
        (5, "not a usable path"),
        ("x" * 300, "cannot be read as Mem0's history"),
    ]:
        with pytest.raises(InvalidInputError, match=says):
            read_mem0_history(path)
    listed.write_text(json.dumps({"rows": rows}))
    with pytest.raises(InvalidInputError, match="holds no list"):
        read_mem0_history(listed)
    listed.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)  # raised the JSON parser's bare RecursionError
    with pytest.raises(InvalidInputError, match=r"neither Mem0's history\.db nor JSON: it nests deeper"):
        read_mem0_history(listed)
    listed.write_text("{not json")
    with pytest.raises(InvalidInputError, match=r"neither Mem0's history\.db nor JSON"):
        read_mem0_history(listed)
