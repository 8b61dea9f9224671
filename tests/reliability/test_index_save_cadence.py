"""How often a writing client rewrites its index file: at most every INDEX_SAVE_INTERVAL_S, and, for an index whose
save is slow (a million vectors are a 1.5 GB file), every last save's duration over INDEX_SAVE_SHARE, so that
saving does not take every add (benchmarks/scale.py measured ~8 s adds at a million memories when each add saved).
A fake clock stands in for time in the cadence test; the put-off save's test waits for its timer (0.5 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder, fake_config

import inferscale.derived
from inferscale import MemoryClient
from inferscale.retrieval import VectorIndex


def test_a_slow_save_stretches_the_interval_to_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    saves: list[float] = []
    save = VectorIndex.save

    def slow_save(index: VectorIndex, path: Path | str | None = None) -> Path:
        saves.append(clock[0])
        clock[0] += save_seconds  # the save takes this long on the fake clock
        return save(index, path)

    monkeypatch.setattr(inferscale.derived.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(VectorIndex, "save", slow_save)
    save_seconds = 0.01
    with MemoryClient(fake_config(tmp_path), embedder=HashEmbedder()) as client:
        client.add("I like tea", user_id="u", infer=False)  # saved: the first write
        clock[0] += 6
        client.add("I play chess", user_id="u", infer=False)  # saved: 6 s > 5 s, and the last save was quick
        assert len(saves) == 2
        save_seconds = 10.0  # from now on a save takes 10 s: the next is due 10 / INDEX_SAVE_SHARE = 200 s after
        clock[0] += 6
        client.add("I love Lisbon", user_id="u", infer=False)
        assert len(saves) == 3
        for text in ("I have a beagle", "I play the cello", "I grow tomatoes"):
            clock[0] += 60
            client.add(text, user_id="u", infer=False)
        assert len(saves) == 3  # 180 s after a 10 s save: not yet
        clock[0] += 30
        client.add("I read maps", user_id="u", infer=False)
        assert len(saves) == 4
        assert saves[3] - saves[2] >= 10.0 / inferscale.derived.INDEX_SAVE_SHARE
        client.add("I bake bread", user_id="u", infer=False)
        assert len(saves) == 4
    assert len(saves) == 5  # close() saves what changed since, whatever the interval


def test_a_delete_reaches_the_index_file_when_the_interval_is_up_without_another_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A privacy helper's report: a delete less than the interval after a save left the deleted memory's vector, and
    the label that is its text's hash, in the index file until the next write or ``close`` (still there 15 s later
    on an idle server). The put-off save now runs on a timer when the interval is up."""
    monkeypatch.setattr(inferscale.derived, "INDEX_SAVE_INTERVAL_S", 0.5)
    with MemoryClient(fake_config(tmp_path), embedder=HashEmbedder()) as client:
        kept = client.add("I like tea", user_id="u", infer=False)["results"][0]["id"]
        gone = client.add("My PIN is 4321", user_id="u", infer=False)["results"][0]["id"]
        client.derived.save_index(force=True)  # both vectors on file, saved just now
        path = client.derived.index_path
        assert len(VectorIndex.open(path, dim=HashEmbedder().dim)) == 2
        client.delete(gone)  # within the interval of that save

        def ids_on_file() -> list[int]:
            return sorted(int(i) for i in VectorIndex.open(path, dim=HashEmbedder().dim).ids())

        vector_ids = {r.id: r.vector_id for r in client.db.get_many([kept]).values()}
        deadline = time.monotonic() + 10.0
        while ids_on_file() != [vector_ids[kept]] and time.monotonic() < deadline:
            time.sleep(0.05)  # no call on the client meanwhile
        assert ids_on_file() == [vector_ids[kept]]
