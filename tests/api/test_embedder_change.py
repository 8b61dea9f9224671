"""A store opened with another embedder of the same dimension: the index records the embedder whose vectors it
holds (:func:`inferscale.retrieval.embedder.embedder_identity`), so the memories are embedded again by the new one
instead of being ranked by the old model's vectors."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from client_adapter import MakeClient
from mem0_fakes import HashEmbedder, fake_config

from inferscale import ConfigError, MemoryClient
from inferscale.derived import DerivedStores
from inferscale.reconcile import EMBEDDER_PROBE_SIZE, ReconcileReport
from inferscale.storage import MemoryStore

TEXTS = ["Alice keeps bees in Porto", "Alice plays the cello on Sundays", "Alice is allergic to walnuts"]


class SaltedEmbedder(HashEmbedder):
    """Another model of HashEmbedder's dimension: each word lands in another bucket, so its vectors differ."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        salted = [" ".join(hashlib.sha256(word.encode()).hexdigest()[:8] for word in t.lower().split()) for t in texts]
        return super().embed(salted)


def test_memories_are_embedded_again_by_another_embedder_of_the_same_dimension(make: MakeClient) -> None:
    first = make()
    added = [first.add(text, user_id="alice", infer=False)["results"][0]["id"] for text in TEXTS]
    first.close()

    embedder = SaltedEmbedder()
    assert embedder.dim == HashEmbedder().dim
    second = make(embedder=embedder)
    query = "Who keeps bees?"
    found = second.search(query, user_id="alice", limit=3)["results"]
    vectors = embedder.embed([query, *TEXTS])
    want = {memory_id: float(vectors[0] @ vectors[i + 1]) for i, memory_id in enumerate(added)}
    got = {r["id"]: r["score"] for r in found}
    assert got.keys() == want.keys()
    for memory_id, score in got.items():  # before the fix: the scores of HashEmbedder's stored vectors
        assert abs(score - want[memory_id]) < 1e-5, (memory_id, score, want[memory_id])
    assert sorted(r["memory"] for r in second.get_all(user_id="alice")["results"]) == sorted(TEXTS)


class RenamedHashEmbedder(HashEmbedder):
    """HashEmbedder's model under another name (a folder spelled another way): the same vectors. Counts the texts
    it embeds."""

    name = "hash-128 spelled another way"

    def __init__(self) -> None:
        super().__init__()
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


def _strip_embedder_identity(index_file: Path) -> None:
    """Rewrite the index file as a version before embedder identities wrote it (no ``embedder`` entry)."""
    with np.load(index_file) as saved:
        entries = {name: saved[name] for name in saved.files if name != "embedder"}
    assert len(entries) < len(saved.files)
    with index_file.open("wb") as file:  # a file object: np.savez would add ".npz" to a path
        np.savez(file, **entries)  # type: ignore[arg-type]


def test_an_index_of_an_earlier_version_is_checked_against_the_embedder(tmp_path: Path) -> None:
    """An index written before identities were recorded was taken to hold the new embedder's vectors: a store
    upgraded and given another embedder at once ranked by the old model's vectors, for good once saved again."""
    config = fake_config(tmp_path)
    with MemoryClient(config, embedder=HashEmbedder()) as first:
        added = [first.add(text, user_id="alice", infer=False)["results"][0]["id"] for text in TEXTS]
    index_file = next(tmp_path.glob("*.faiss"))
    _strip_embedder_identity(index_file)
    embedder = SaltedEmbedder()
    with MemoryClient(config, embedder=embedder) as second:
        found = second.search("Who keeps bees?", user_id="alice", limit=3)["results"]
    vectors = embedder.embed(["Who keeps bees?", *TEXTS])
    want = {memory_id: float(vectors[0] @ vectors[i + 1]) for i, memory_id in enumerate(added)}
    assert {r["id"]: round(r["score"], 5) for r in found} == {k: round(v, 5) for k, v in want.items()}


def test_the_same_model_named_another_way_keeps_its_vectors(tmp_path: Path) -> None:
    """A sample is embedded again and matches: no memory is embedded again, the index records the new name."""
    config = fake_config(tmp_path)
    texts = [f"Alice's fact number {i}" for i in range(EMBEDDER_PROBE_SIZE + 4)]
    with MemoryClient(config, embedder=HashEmbedder()) as first:
        first.add([{"role": "user", "content": text} for text in texts], user_id="alice", infer=False)
    renamed = RenamedHashEmbedder()
    with MemoryClient(config, embedder=renamed) as second:
        assert len(second.search("fact number 3", user_id="alice", limit=3)["results"]) == 3
        assert second.reconcile() == ReconcileReport()
    assert renamed.texts == EMBEDDER_PROBE_SIZE + 1  # the sample, then the query: no memory embedded again
    with np.load(next(tmp_path.glob("*.faiss"))) as saved:
        assert str(saved["embedder"]) == "hash-128 spelled another way (128-d)"


def test_the_sample_is_drawn_from_vectors_of_stored_memories(tmp_path: Path) -> None:
    """The sample was the 16 oldest vectors: when their memories were deleted (by a client with another index),
    nothing could be compared and every memory was embedded again, with a false warning."""
    config = fake_config(tmp_path)
    texts = [f"Alice's fact number {i}" for i in range(EMBEDDER_PROBE_SIZE + 4)]
    with MemoryClient(config, embedder=HashEmbedder()) as first:
        ids = [
            r["id"]
            for r in first.add([{"role": "user", "content": t} for t in texts], user_id="alice", infer=False)["results"]
        ]
    store = MemoryStore(config.database_url())
    for memory_id in ids[:EMBEDDER_PROBE_SIZE]:  # committed in SQL only: the index still holds their vectors
        store.delete(memory_id)
    store.close()
    renamed = RenamedHashEmbedder()
    with MemoryClient(config, embedder=renamed) as second:
        report = second.reconcile()
    assert (report.vectors_removed, report.vectors_added, report.vectors_refreshed) == (EMBEDDER_PROBE_SIZE, 0, 0)
    assert renamed.texts == 4  # the four stored memories' vectors, compared; none embedded again


def test_no_search_sees_the_loaded_index_before_its_embedder_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loaded index was in use while its sample was read from SQL: a concurrent first search ranked by the old
    model's vectors."""
    config = fake_config(tmp_path)
    with MemoryClient(config, embedder=HashEmbedder()) as first:
        for text in TEXTS:
            first.add(text, user_id="alice", infer=False)
    in_use_while_checked: list[bool] = []
    settle = DerivedStores.settle_embedder

    def checking(self: DerivedStores, index: Any, sample: Any) -> Any:
        in_use_while_checked.append(self._index is not None)
        return settle(self, index, sample)

    monkeypatch.setattr(DerivedStores, "settle_embedder", checking)
    with MemoryClient(config, embedder=SaltedEmbedder()) as second:
        second.search("Who keeps bees?", user_id="alice", limit=1)
    assert in_use_while_checked == [False]


class _WrongWidth(HashEmbedder):
    """A custom embedder whose ``dim`` is not its vectors' width (or whose vectors hold NaN)."""

    def __init__(self, nan: bool = False) -> None:
        super().__init__()
        self.nan = nan

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = super().embed(texts)
        if self.nan:
            vectors[:, 0] = np.nan
            return vectors
        return vectors[:, :-1]


@pytest.mark.parametrize("nan", [False, True])
def test_an_embedder_whose_vectors_are_not_its_dim_is_a_config_error(tmp_path: Path, nan: bool) -> None:
    """A custom embedder whose vectors are narrower than its ``dim`` raised numpy's bare ValueError ("operands could
    not be broadcast"), and one giving NaN an InvalidInputError, as if the caller's text were at fault (tester
    report). The memory is committed before it is embedded (SQL first), so it is kept, and embedded once the
    embedder is fixed."""
    with MemoryClient(fake_config(tmp_path), embedder=_WrongWidth(nan)) as client:
        message = "returned a vector that is not finite" if nan else "returned vectors of shape"
        for call in (
            lambda: client.add("I like tea.", user_id="u", infer=False),
            lambda: client.search("tea", user_id="u"),
        ):
            with pytest.raises(ConfigError, match=message):
                call()
    with MemoryClient(fake_config(tmp_path), embedder=HashEmbedder()) as fixed:
        assert [r["memory"] for r in fixed.search("tea", user_id="u")["results"]] == ["I like tea."]
