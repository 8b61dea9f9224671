"""Crash test: a writer process is killed with SIGKILL at a random point of its writes, 20 times on each backend
(``KILLS``); after each kill the store is reopened and reconciled, and checked against every write
the writer acknowledged.

The writer (tests/crash_writer.py) makes up to 200 random adds (half with ``encode_kv``), updates, deletes and K/V
encodings and logs each acknowledged one (fsynced after the call returns). After each kill, a fresh client
reconciles, and then:

- every acknowledged write is there: adds with their text, updates' texts, deletes absent, and K/V encoded for a
  text the memory still holds; the one write in flight at the kill either happened or did not, wholly;
- no deleted memory comes back in search, and the last written memories are found first (or tied for first) by
  their own text;
- the index holds exactly the stored memories, each vector embedded from its current text, and the K/V store
  matches the ``kv_entries`` rows: every row has its file and its memory's text, every file its row, no K/V of a
  deleted memory and no temporary file is left.

It prints the kills survived, the acknowledged writes checked and the losses (which must be 0).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mem0_fakes import HashEmbedder, fake_config

import inferscale.atomic
import inferscale.reconcile
from inferscale import KVConfig, MemoryClient
from inferscale.kv.tiers import DiskTier
from inferscale.reconcile import ReconcileReport, entry_file_name
from inferscale.storage import hash_text

pytestmark = pytest.mark.slow  # a zygote process that imports torch, and 20 writer processes forked from it

KILLS = {"sqlite": 20, "postgresql": 20}
"""Kills per backend: the issue's 20 on each (PostgreSQL's run is slower: the server fsyncs every commit)."""
OPS_PER_WRITER = 200
WRITER = Path(__file__).parents[1] / "crash_writer.py"
REPO = Path(__file__).parents[2]


class Zygote:
    """The writer zygote (tests/crash_writer.py): forks writers on request and reaps them."""

    def __init__(self, stderr: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        self._stderr = stderr.open("w")
        self._proc = subprocess.Popen(
            [sys.executable, str(WRITER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, env=env, cwd=REPO,
        )  # fmt: skip

    def _ask(self, line: str) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline().strip()
        if not answer:
            raise AssertionError(f"the writer zygote ended: {self.errors()}")
        return answer

    def fork(self, **arguments: Any) -> int:
        return int(self._ask(f"fork {json.dumps(arguments)}"))

    def reap(self, pid: int) -> str:
        return self._ask(f"reap {pid}")

    def errors(self) -> str:
        self._stderr.flush()
        return Path(self._stderr.name).read_text()[-3000:]

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=30)
        self._stderr.close()


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    """One zygote for both backends: it spends seconds importing."""
    started = Zygote(tmp_path_factory.mktemp("zygote") / "writers.err")
    yield started
    started.close()


def complete_entries(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """The entries of a writer's log text ``data`` (one JSON object per line) and what follows its last line break:
    a line still being written, or one cut by the kill, which is not an entry."""
    *lines, rest = data.split(b"\n")
    return [json.loads(line) for line in lines], rest


def read_log(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a writer's log (a line cut by the kill is not acknowledged, and dropped)."""
    return complete_entries(path.read_bytes())[0] if path.exists() else []


class AckCounter:
    """The acknowledged writes in a growing writer log, counted from the lines appended since the last look (the
    polling loop reads each line once, not the whole log every 2 ms, so it leaves the CPU to the writer)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""
        self.acks = 0

    def count(self) -> int:
        """The acknowledged writes so far (a line still being written is counted once it is complete)."""
        try:
            with self._path.open("rb") as log:
                log.seek(self._offset)
                appended = log.read()
        except FileNotFoundError:  # the writer has not opened its log yet
            return self.acks
        self._offset += len(appended)
        entries, self._partial = complete_entries(self._partial + appended)
        self.acks += sum(entry["phase"] == "ack" for entry in entries)
        return self.acks


def test_the_ack_counter_counts_each_acknowledged_line_once_it_is_complete(tmp_path: Path) -> None:
    log = tmp_path / "writer.log"
    acks = AckCounter(log)
    assert acks.count() == 0  # no log yet
    ack, start = json.dumps({"phase": "ack", "op": "add"}) + "\n", json.dumps({"phase": "start", "op": "add"}) + "\n"
    log.write_text(ack + start + ack[:7])
    assert acks.count() == 1  # the cut line is not an ack yet
    with log.open("a") as tail:
        tail.write(ack[7:] + ack)
    assert acks.count() == 3  # the appended rest completes the cut line: counted once, with the new one
    assert acks.count() == 3  # nothing appended: nothing counted again
    assert [e["phase"] for e in read_log(log)] == ["ack", "start", "ack", "ack"]
    log.unlink()
    assert acks.count() == 3  # a log gone between looks loses no count


def kill_at_random(zygote: Zygote, log: Path, rng: random.Random, **arguments: Any) -> str:
    """Start a writer and SIGKILL it after a random number of acknowledged writes (0 to 199) plus a random
    0-10 ms, so the kill lands anywhere inside a write (or, after 0, anywhere in its first half second); returns
    how it ended (``"killed 9"``)."""
    target = rng.randrange(OPS_PER_WRITER)
    pid = zygote.fork(log_path=str(log), n_ops=OPS_PER_WRITER, **arguments)
    if target == 0:  # somewhere in the writer's start: building its client, reconciling, its first write
        time.sleep(rng.uniform(0, 0.5))
    deadline = time.monotonic() + 120
    acks = AckCounter(log)
    while target and acks.count() < target and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.01))
    os.kill(pid, signal.SIGKILL)
    return zygote.reap(pid)


@dataclass
class Model:
    """What the store must hold: the acknowledged writes applied in order."""

    live: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (user, text)
    deleted: dict[str, tuple[str, str]] = field(default_factory=dict)
    kv_encoded: dict[str, set[str]] = field(default_factory=dict)  # id -> text hashes whose K/V were acknowledged
    # id -> the texts of the memories its K/V are encoded after (the last kv.context_window of its scope at add time)
    neighbours: dict[str, list[str]] = field(default_factory=dict)
    acknowledged: int = 0

    def apply(self, entry: dict[str, Any]) -> None:
        op, memory_id = entry["op"], entry["id"]
        self.acknowledged += 1
        if op == "add":
            self.add(memory_id, entry["user"], entry["text"])
            if entry["kv"]:
                self.kv_encoded.setdefault(memory_id, set()).add(hash_text(entry["text"]))
        elif op == "update":
            self.update(memory_id, entry["text"])
        elif op == "delete":
            self.delete(memory_id)
        else:
            self.kv_encoded.setdefault(memory_id, set()).add(entry["hash"])

    def add(self, memory_id: str, user: str, text: str) -> None:
        scope = [t for u, t in self.live.values() if u == user]  # live is in add (stored) order
        self.neighbours[memory_id] = scope[-KVConfig().context_window :]
        self.live[memory_id] = (user, text)

    def update(self, memory_id: str, text: str) -> None:
        user, old = self.live[memory_id]
        self.live[memory_id] = (user, text)
        self._scrub(user, old)

    def delete(self, memory_id: str) -> None:
        self.deleted[memory_id] = self.live.pop(memory_id)
        self._scrub(*self.deleted[memory_id])

    def _scrub(self, user: str, text: str) -> None:
        """A text no memory of ``user`` holds any more leaves the others' context, and their K/V are encoded anew
        (the acknowledged K/V of the old context are rightly gone)."""
        if any(value == (user, text) for value in self.live.values()):
            return
        for memory_id, (owner, _) in self.live.items():
            if owner == user and text in self.neighbours.get(memory_id, []):
                self.neighbours[memory_id] = [t for t in self.neighbours[memory_id] if t != text]
                self.kv_encoded.pop(memory_id, None)


def settle_in_flight(model: Model, intent: dict[str, Any], stored: dict[str, tuple[str, str]]) -> bool:
    """Adopt the outcome of the write in flight at the kill: it happened wholly or not at all. Returns False when
    the store shows neither."""
    op = intent["op"]
    if op == "add":
        found = [i for i, value in stored.items() if i not in model.live and value == (intent["user"], intent["text"])]
        for i in found[:1]:
            model.add(i, *stored[i])
        return len(found) <= 1
    memory_id = intent["id"]
    before = model.live[memory_id]
    if op == "update":
        after = (before[0], intent["text"])
        if stored.get(memory_id) == after:
            model.update(memory_id, intent["text"])
        return stored.get(memory_id) in (before, after)
    if op == "delete":
        if memory_id not in stored:
            model.delete(memory_id)
        return stored.get(memory_id) in (before, None)
    return True  # a K/V encoding changes no memory


def check_store(client: MemoryClient, model: Model, kv_dir: Path, round_entries: list[dict[str, Any]]) -> list[str]:
    """Every way the reconciled store disagrees with ``model`` (acknowledged writes lost or stale, deleted memories
    back, derived stores out of step); ``[]`` when it holds exactly what it must."""
    problems: list[str] = []
    records = {r.id: r for r in client.db.all_memories()}
    stored = {i: (r.user_id or "", r.text) for i, r in records.items()}
    for memory_id, value in model.live.items():
        if stored.get(memory_id) != value:
            problems.append(f"lost: {memory_id} should hold {value}, holds {stored.get(memory_id)}")
    problems += [f"deleted memory back: {i}" for i in model.deleted if i in stored]
    problems += [f"memory nobody acknowledged: {i} {stored[i]}" for i in stored.keys() - model.live.keys()]

    # The index: exactly the stored memories, each vector embedded from its current text.
    index = client.index
    vector_ids = np.array(sorted(r.vector_id for r in records.values()), dtype=np.int64)
    if not np.array_equal(np.sort(index.ids()), vector_ids):
        problems.append(f"index ids {sorted(index.ids().tolist())} differ from the stored {vector_ids.tolist()}")
    else:
        by_vid = {r.vector_id: r for r in records.values()}
        want = HashEmbedder().embed([by_vid[int(v)].text for v in vector_ids])
        current = np.isclose(index.vectors(vector_ids), want, rtol=0, atol=1e-6).all(axis=1)
        problems += [f"stale vector for {by_vid[int(v)].id}" for v in vector_ids[~current]]

    # The K/V store: rows and files in step, K/V present for every acknowledged encoding still current.
    rows = client.db.all_kv_entries()
    names = set()
    for row in rows:
        memory = records.get(row.memory_id)
        if memory is None or memory.hash != row.text_hash:
            problems.append(f"kv row {row.id} of {row.memory_id} is not for the memory's text")
        name = entry_file_name(row)
        names.add((row.memory_id, name))
        if not (kv_dir / row.memory_id / str(name)).exists():
            problems.append(f"kv row {row.id} of {row.memory_id} has no file")
    for memory_id, files in DiskTier(kv_dir).entry_files().items():
        problems += [f"kv file without row: {p}" for p in files if (memory_id, p.name) not in names]
    problems += [f"temporary file left: {p}" for p in kv_dir.glob("*/.*.tmp")]
    for memory_id, hashes in model.kv_encoded.items():
        memory = records.get(memory_id)
        if memory is not None and memory.hash in hashes and not any(r.memory_id == memory_id for r in rows):
            problems.append(f"lost: acknowledged K/V of {memory_id}")

    # Search: this round's deleted memories never come back; its last written ones (the likeliest to be missing
    # from the index file) come first for their own text. The vector check above covers every other memory.
    for entry in round_entries:
        if entry["op"] == "delete":
            user, text = model.deleted[entry["id"]]
            hits = [h["id"] for h in client.search(text, user_id=user, limit=5)["results"]]
            if entry["id"] in hits:
                problems.append(f"deleted memory {entry['id']} found by search")
    written = [e["id"] for e in round_entries if e["op"] in ("add", "update") and e["id"] in model.live]
    for memory_id in list(dict.fromkeys(reversed(written)))[:10]:
        user, text = model.live[memory_id]
        hits = client.search(text, user_id=user, limit=5)["results"]
        # First, or tied for first: the hashed bag of words of another text can equal this one's.
        if not any(h["id"] == memory_id and h["score"] >= hits[0]["score"] - 1e-6 for h in hits):
            problems.append(f"search for {text!r} does not find {memory_id} first: {hits}")
    return problems


def test_writer_killed_at_random_points_loses_nothing(
    tmp_path: Path, db_url: str, zygote: Zygote, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer is known dead when the store is reconciled: its young rows without files and temp files go too.
    monkeypatch.setattr(inferscale.reconcile, "KV_ROW_GRACE_S", 0.0)
    monkeypatch.setattr(inferscale.atomic, "TEMP_MIN_AGE_S", 0.0)
    rng = random.Random(15)
    backend = db_url.split(":")[0].split("+")[0]
    config = fake_config(tmp_path, db_url)
    model = Model()
    kills = 0
    problems: list[str] = []
    repaired = dict.fromkeys(ReconcileReport().as_dict(), 0)
    writing_s = checking_s = 0.0
    for round_no in range(KILLS[backend]):
        log = tmp_path / f"writes-{round_no}.jsonl"
        started = time.monotonic()
        ended = kill_at_random(zygote, log, rng, data_dir=str(tmp_path), db_url=db_url, seed=round_no)
        writing_s += time.monotonic() - started
        assert ended == f"killed {signal.SIGKILL}", f"the writer ended on its own ({ended}): {zygote.errors()}"
        kills += 1
        entries = read_log(log)
        acks = [e for e in entries if e["phase"] == "ack"]
        intents = [e for e in entries if e["phase"] == "intent"]
        for entry in acks:
            model.apply(entry)
        client = MemoryClient(config, embedder=HashEmbedder())  # no engine: reconciliation must not need one
        try:
            for name, count in client.reconcile().as_dict().items():
                repaired[name] += count
            stored = {r.id: (r.user_id or "", r.text) for r in client.db.all_memories()}
            if len(intents) > len(acks) and not settle_in_flight(model, intents[-1], stored):
                problems.append(f"lost: the write in flight at kill {round_no} half happened: {intents[-1]}")
            problems += [f"kill {round_no}: {p}" for p in check_store(client, model, tmp_path / "kv", acks)]
            if client.reconcile().repairs:
                problems.append(f"kill {round_no}: a second reconciliation found more to repair")
        finally:
            client.close()
        checking_s += time.monotonic() - started
    checking_s -= writing_s
    losses = sum("lost" in p for p in problems)
    print(
        f"\ncrash test ({backend}): kills survived {kills}, acknowledged writes checked "
        f"{model.acknowledged}, losses {losses}; memories live {len(model.live)}, deleted {len(model.deleted)}; "
        f"repaired {repaired}; {writing_s:.0f} s writing, {checking_s:.0f} s reopening and checking"
    )
    assert kills == KILLS[backend]
    assert ReconcileReport(**repaired).repairs > 0, "no kill left anything to repair: the test exercised nothing"
    assert losses == 0, problems
    assert problems == []
