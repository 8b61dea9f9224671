"""How often a writing client rewrites its index file: at most every INDEX_SAVE_INTERVAL_S, and, for an index whose
save is slow (a million vectors are a 1.5 GB file), every last save's duration over INDEX_SAVE_SHARE, so that
saving does not take every add (benchmarks/scale.py measured ~8 s adds at a million memories when each add saved).
A fake clock stands in for time: no test here waits."""

from __future__ import annotations

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
