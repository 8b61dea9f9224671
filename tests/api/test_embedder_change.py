"""A store opened with another embedder of the same dimension: the index records the embedder whose vectors it
holds (:func:`inferscale.retrieval.embedder.embedder_identity`), so the memories are embedded again by the new one
instead of being ranked by the old model's vectors."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from client_adapter import MakeClient
from mem0_fakes import HashEmbedder

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
