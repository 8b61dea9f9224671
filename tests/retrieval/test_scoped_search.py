"""The search paths of VectorIndex (SearchConfig): the exact per-scope path against a brute-force reference, equal
scores ordered by id on every path, the approximate (IVF) path's recall, tenant isolation, the approximate index
saved in the one index file, rebuilt from SQL, and moved to a GPU when FAISS sees one."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import faiss
import numpy as np
import pytest
from mem0_fakes import HashEmbedder, fake_config

import inferscale.derived
import inferscale.retrieval.approximate
from inferscale import MemoryClient
from inferscale.config import SearchConfig
from inferscale.retrieval import VectorIndex, index_file
from inferscale.retrieval.approximate import gpu_count
from inferscale.retrieval.ids import BITMAP_BITS_PER_ID, id_selector

DIM = 32

EXACT_ONLY = SearchConfig(exact_scope_max=64, approximate_min_total=None)
APPROXIMATE = SearchConfig(exact_scope_max=64, approximate_min_total=1000, ivf_nlist=32, ivf_nprobe=4)

RECALL_UNSCOPED = 0.93
"""Lower bound of the unscoped recall@10 of APPROXIMATE (4 of 32 lists) on the clustered set below: measured 0.98."""

RECALL_LARGE_SCOPE = 0.85
"""The same within the two large scopes (the probed lists hold fewer of their vectors): measured 0.91."""


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _clustered(rng: np.random.Generator, n: int, topics: int = 40) -> np.ndarray:
    """float32 ``[n, DIM]`` unit rows around ``topics`` random centres (cosine about 0.5 within a topic), like
    sentence embeddings rather than uniform noise."""
    centres = _unit(rng.standard_normal((topics, DIM)))
    return _unit(centres[rng.integers(0, topics, n)] + _unit(rng.standard_normal((n, DIM))))


def _queries(rng: np.random.Generator, vectors: np.ndarray, n: int) -> np.ndarray:
    """``n`` queries near stored vectors (cosine about 0.8 to the one each started from)."""
    picked = vectors[rng.choice(len(vectors), n, replace=False)]
    return _unit(0.8 * picked + 0.6 * _unit(rng.standard_normal(picked.shape)))


def _brute_force(
    ids: np.ndarray, vectors: np.ndarray, query: np.ndarray, k: int, allowed: np.ndarray | None = None
) -> tuple[list[int], np.ndarray]:
    """The reference: every score in float64, ranked by score descending then id ascending."""
    keep = np.ones(len(ids), dtype=bool) if allowed is None else np.isin(ids, allowed)
    scope_ids, scores = ids[keep], vectors[keep].astype(np.float64) @ query.astype(np.float64)
    order = np.lexsort((scope_ids, -scores))[:k]
    return scope_ids[order].tolist(), scores[order]


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """4000 clustered vectors under shuffled, non-contiguous ids, split among 100 users (40 each) and 2 large
    scopes (an agent's 1500 and another's 2000: beyond ``exact_scope_max``)."""
    rng = np.random.default_rng(0)
    ids = rng.permutation(np.arange(10, 10 + 3 * 4000, 3, dtype=np.int64))
    vectors = _clustered(rng, len(ids))
    users = [np.sort(ids[i : i + 40]) for i in range(0, 4000, 40)]
    large = [np.sort(ids[:1500]), np.sort(ids[2000:])]
    return ids, vectors, users + large


def _index(ids: np.ndarray, vectors: np.ndarray, search: SearchConfig, path: Path | None = None) -> VectorIndex:
    index = VectorIndex(DIM, path, search)
    index.add(ids, vectors, labels=[f"h{i}" for i in ids.tolist()])
    return index


# ---- the exact per-scope path ---------------------------------------------------------------------------------


@pytest.mark.parametrize("search", [EXACT_ONLY, APPROXIMATE], ids=["exact-only", "approximate-above-1000"])
def test_small_scopes_are_searched_exactly(
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]], search: SearchConfig
) -> None:
    """Every user's scope (40 ids, below exact_scope_max) gives the brute-force top-k, ids and scores, whatever
    the index's size: recall 1, and no approximate index is built for them."""
    ids, vectors, scopes = data
    index = _index(ids, vectors, search)
    rng = np.random.default_rng(1)
    for scope in scopes[:100:7]:
        for query in _queries(rng, vectors[np.isin(ids, scope)], 3):
            for k in (1, 10, 40, 100):
                got = index.search(query, k, allowed_ids=scope)
                want_ids, want_scores = _brute_force(ids, vectors, query, k, scope)
                assert [i for i, _ in got] == want_ids
                np.testing.assert_allclose([s for _, s in got], want_scores, rtol=0, atol=1e-6)
    assert index.approximate_lists == 0


def test_scope_ids_missing_from_the_index_or_repeated_are_ignored(
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]],
) -> None:
    ids, vectors, scopes = data
    index = _index(ids, vectors, EXACT_ONLY)
    scope = scopes[3]
    noisy = np.concatenate([scope, scope[:5], np.array([1, 2, 99_999_999], dtype=np.int64)])
    query = vectors[np.flatnonzero(ids == scope[0])[0]]
    assert index.search(query, 50, allowed_ids=noisy) == index.search(query, 50, allowed_ids=scope)
    assert len(index.search(query, 50, allowed_ids=noisy)) == len(scope)


@pytest.mark.parametrize("spread", [1, 3, 63, 65, 10_000], ids=lambda s: f"spread-{s}")
def test_the_scope_selector_lets_exactly_the_scopes_ids_through(spread: int) -> None:
    """Dense scopes get a bitmap (FAISS's IDSelectorBitmap counts its size in bytes: the one first written here
    with a size in bits let garbage ids through), sparse ones a hash set; both select exactly the scope."""
    rng = np.random.default_rng(spread)
    ids = np.unique(rng.integers(0, 200 * spread, 200)).astype(np.int64)
    selector = id_selector(ids)
    assert isinstance(selector, faiss.IDSelectorBitmap) == (int(ids[-1]) + 1 <= BITMAP_BITS_PER_ID * ids.size)
    del ids  # the selector keeps its own bitmap alive
    rng = np.random.default_rng(spread)
    want = np.unique(rng.integers(0, 200 * spread, 200)).tolist()
    assert [i for i in range(200 * spread + 64) if selector.is_member(i)] == want


# ---- equal scores ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "search",
    [EXACT_ONLY, SearchConfig(exact_scope_max=0, approximate_min_total=None), APPROXIMATE],
    ids=["per-scope", "scan", "approximate"],
)
def test_equal_scores_are_ordered_by_ascending_id_for_every_k(
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]], search: SearchConfig
) -> None:
    """Six copies of one vector, stored under ids out of order and one of them replaced (so it moves to the end of
    FAISS's storage): each k returns the k smallest ids, best first. FAISS's own heap returned ties in an order
    that changed with k (the top-3 of ids 9, 3, 7, 5 came back as 7, 3, 9)."""
    ids, vectors, _ = data
    index = _index(ids, vectors, search)
    twin = _unit(np.random.default_rng(2).standard_normal(DIM))
    twins = np.array([900_009, 900_003, 900_007, 900_005, 900_011, 900_001], dtype=np.int64)
    index.add(twins, np.repeat(twin[None, :], len(twins), axis=0))
    index.add(twins[3:4], twin[None, :])  # replaced: now last in storage
    scope = np.concatenate([twins, ids[:30]])
    for allowed in (scope, None):
        for k in range(1, 8):
            got = index.search(twin, k, allowed_ids=allowed)
            assert [i for i, _ in got[:6]] == sorted(twins.tolist())[: min(k, 6)], (allowed is None, k)
            assert len({s for _, s in got[:6]}) == 1


# ---- the approximate path ----------------------------------------------------------------------------------------


def test_approximate_search_recall_and_isolation(data: tuple[np.ndarray, np.ndarray, list[np.ndarray]]) -> None:
    """From approximate_min_total on, unscoped and large-scope searches use the IVF index (built by the first of
    them): recall@10 against the exact search is at least the measured bound, and a large scope's results are all
    its own."""
    ids, vectors, scopes = data
    index = _index(ids, vectors, APPROXIMATE)
    rng = np.random.default_rng(3)
    unscoped, scoped = [], []
    for query in _queries(rng, vectors, 40):
        got = [i for i, _ in index.search(query, 10)]
        unscoped.append(len(set(got) & set(_brute_force(ids, vectors, query, 10)[0])) / 10)
    assert index.approximate_lists == 32
    for scope in scopes[100:]:
        for query in _queries(rng, vectors[np.isin(ids, scope)], 20):
            got = [i for i, _ in index.search(query, 10, allowed_ids=scope)]
            assert set(got) <= set(scope.tolist()) and len(got) == 10
            scoped.append(len(set(got) & set(_brute_force(ids, vectors, query, 10, scope)[0])) / 10)
    assert np.mean(unscoped) >= RECALL_UNSCOPED, np.mean(unscoped)
    assert np.mean(scoped) >= RECALL_LARGE_SCOPE, np.mean(scoped)
    assert np.mean(unscoped) < 1.0  # the measure sees the approximation: this path is not the exact one


def test_the_approximate_index_follows_adds_replacements_and_removals(
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]],
) -> None:
    ids, vectors, _ = data
    index = _index(ids, vectors, APPROXIMATE)
    index.build_approximate()
    fresh = _unit(np.random.default_rng(4).standard_normal((2, DIM)))
    index.add(np.array([ids[0], 5], dtype=np.int64), fresh)  # one replaced, one new
    assert index.search(fresh[0], 1)[0][0] == ids[0]
    assert index.search(fresh[1], 1)[0][0] == 5
    index.remove(np.array([5], dtype=np.int64))
    assert 5 not in [i for i, _ in index.search(fresh[1], 10)]
    assert index.approximate_lists == 32  # maintained, not rebuilt


def test_the_approximate_index_is_retrained_when_the_index_grows(
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]],
) -> None:
    ids, vectors, _ = data
    search = SearchConfig(exact_scope_max=64, approximate_min_total=1000, ivf_nprobe=4, rebuild_growth=2.0)
    index = _index(ids[:1200], vectors[:1200], search)
    index.search(vectors[0], 5)
    first = index.approximate_lists
    index.add(ids[1200:2300], vectors[1200:2300])
    index.search(vectors[0], 5)
    assert index.approximate_lists == first  # grown less than twice
    index.add(ids[2300:], vectors[2300:])
    index.search(vectors[0], 5)
    # The power of two nearest sqrt(n) lists, at most one per 64 vectors: 32 -> 18 for 1200, 64 -> 62 for 4000.
    assert (first, index.approximate_lists) == (18, 62)
    assert index.approximate_builds == 2


# ---- persistence and rebuilds -----------------------------------------------------------------------------------


def test_the_approximate_index_is_saved_in_the_one_index_file(
    tmp_path: Path, data: tuple[np.ndarray, np.ndarray, list[np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids, vectors, scopes = data
    path = tmp_path / "index.faiss"
    index = _index(ids, vectors, APPROXIMATE, path)
    queries = _queries(np.random.default_rng(5), vectors, 5)
    before = [index.search(q, 10) for q in queries]  # builds the approximate index
    index.save()
    assert [p.name for p in tmp_path.iterdir()] == ["index.faiss"]

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the saved approximate index is loaded, not built again")

    monkeypatch.setattr(inferscale.retrieval.approximate.ApproximateIndex, "build", no_build)
    loaded = VectorIndex.open(path, DIM, APPROXIMATE)
    assert loaded.approximate_lists == 32
    assert [loaded.search(q, 10) for q in queries] == before
    assert loaded.search(queries[0], 5, allowed_ids=scopes[100]) == index.search(queries[0], 5, allowed_ids=scopes[100])
    assert loaded.labels(ids[:3]) == [f"h{i}" for i in ids[:3].tolist()]
    monkeypatch.undo()

    # An approximate index that does not hold the exact store's vectors (here: a file whose store lost some) is
    # dropped on open and built again by the next search that needs it.
    full = index_file.read(path)  # its approximate index holds all 4000 vectors
    loaded.remove(ids[:10])
    loaded.save()
    saved = index_file.read(path)
    assert saved.ann is not None and full.ann is not None
    path.write_bytes(index_file.encode(dataclasses.replace(saved, ann=full.ann, ann_trained_for=4000)))
    reopened = VectorIndex.open(path, DIM, APPROXIMATE)
    assert reopened.approximate_lists == 0 and len(reopened) == 3990
    assert ids[0] not in [i for i, _ in reopened.search(vectors[0], 10)]
    assert reopened.approximate_lists == 32


@pytest.mark.parametrize(("nlist", "lists"), [(16, 16), (None, 18)], ids=["nlist-16", "auto-nlist"])
def test_a_saved_approximate_index_with_another_nlist_is_rebuilt(
    tmp_path: Path,
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]],
    caplog: pytest.LogCaptureFixture,
    nlist: int | None,
    lists: int,
) -> None:
    """An approximate index saved with 32 lists, opened with another ``search.ivf_nlist`` (16, or unset: the
    automatic 18 for 1200 vectors), is dropped on open (logged at info level) and the next search builds one with
    the lists asked for; it was used as saved. A setting the index does not hold (``ivf_nprobe``) keeps it."""
    ids, vectors, _ = data
    path = tmp_path / "index.faiss"
    index = _index(ids[:1200], vectors[:1200], APPROXIMATE, path)
    index.build_approximate()
    index.save()
    assert VectorIndex.open(path, DIM, APPROXIMATE.model_copy(update={"ivf_nprobe": 8})).approximate_lists == 32
    changed = APPROXIMATE.model_copy(update={"ivf_nlist": nlist})
    with caplog.at_level(logging.INFO, logger="inferscale.retrieval.approximate"):
        reopened = VectorIndex.open(path, DIM, changed)
    assert reopened.approximate_lists == 0
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            logging.INFO,
            f"the saved approximate index has 32 lists where search.ivf_nlist={nlist} gives {lists} for its 1200 "
            "vectors: it is rebuilt when needed",
        )
    ]
    assert reopened.search(vectors[0], 5)[0][0] == ids[0]
    assert reopened.approximate_lists == lists


def test_the_index_is_rebuilt_from_sql(tmp_path: Path) -> None:
    """Delete the index file: the next client re-embeds every memory from SQL (reconciliation), and scoped and
    large searches give what they gave before."""
    search = SearchConfig(exact_scope_max=8, approximate_min_total=50, ivf_nlist=4, ivf_nprobe=4)
    config = fake_config(tmp_path, search=search)
    words = ["tea", "chess", "Lisbon", "beagle", "cello", "nurse", "tennis", "garden", "piano", "sushi"]
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        for user in range(6):
            for i, word in enumerate(words):
                client.add(f"user {user} likes {word} number {i * user}", user_id=f"u{user}", infer=False)
        client.add("the agent likes tea", agent_id="a", infer=False)
        before_user = client.search("likes tea", user_id="u3", limit=5)
        before_all = client.get_all(user_id="u3")
        path = client.derived.index_path
    assert path.exists()
    path.unlink()
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        assert client.search("likes tea", user_id="u3", limit=5) == before_user
        assert client.get_all(user_id="u3") == before_all
        index = client.derived.open_index()
        assert len(index) == 61
        hits = index.search(HashEmbedder().embed(["likes tea"])[0], 61)  # unscoped: the approximate path
        assert index.approximate_lists == 4 and len(hits) == 61


def test_an_approximate_index_built_by_a_search_is_saved_for_the_next_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's search that builds the approximate index marks the index changed: the next save writes it (here
    the one on close, the save interval not being over), and the next client loads it rather than building it
    again. It was left unsaved, and every process built it again (96 s at a million vectors)."""
    config = fake_config(tmp_path, search=SearchConfig(exact_scope_max=8, approximate_min_total=50, ivf_nlist=4))
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        for i in range(60):
            client.add(f"the user likes hobby number {i}", user_id="u", infer=False)
        path = client.derived.index_path
    assert index_file.read(path).ann is None  # adds never need it
    monkeypatch.setattr(inferscale.derived, "INDEX_SAVE_INTERVAL_S", 1e12)  # no save is due before close
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        before = client.search("likes hobby number 7", user_id="u", limit=5)  # 60 > exact_scope_max: built
        assert len(before["results"]) == 5
        assert client.derived.open_index().approximate_lists == 4
        assert index_file.read(path).ann is None  # the save spacing holds
    saved = index_file.read(path)
    assert saved.ann is not None and saved.ann_trained_for == 60

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the saved approximate index is loaded, not built again")

    monkeypatch.setattr(inferscale.retrieval.approximate.ApproximateIndex, "build", no_build)
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        assert client.search("likes hobby number 7", user_id="u", limit=5) == before
        assert client.derived.open_index().approximate_lists == 4


# ---- GPU --------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="FAISS sees no GPU (faiss-cpu or no CUDA device; inferscale-memory[gpu])")
def test_unscoped_searches_run_on_the_gpu(data: tuple[np.ndarray, np.ndarray, list[np.ndarray]]) -> None:
    ids, vectors, scopes = data
    index = _index(ids, vectors, APPROXIMATE)
    queries = _queries(np.random.default_rng(6), vectors, 20)
    cpu = VectorIndex(DIM, search=APPROXIMATE.model_copy(update={"gpu": False}))
    cpu.add(ids, vectors)
    recall = []
    for query in queries:
        got = [i for i, _ in index.search(query, 10)]
        recall.append(len(set(got) & set(_brute_force(ids, vectors, query, 10)[0])) / 10)
    assert index.approximate_on_gpu and not cpu.approximate_on_gpu
    assert np.mean(recall) >= RECALL_UNSCOPED
    # Scoped searches stay on the CPU (GPU indexes take no id selector) and keep to their scope.
    got = index.search(queries[0], 10, allowed_ids=scopes[101])
    assert {i for i, _ in got} <= set(scopes[101].tolist()) and len(got) == 10
    # A removal drops the GPU copy (GPU IVF cannot remove); the next unscoped search copies the index again.
    index.remove(ids[:1])
    assert not index.approximate_on_gpu
    assert ids[0] not in [i for i, _ in index.search(vectors[0], 10)]
    assert index.approximate_on_gpu
    assert faiss.get_num_gpus() > 0


# ---- threads ----------------------------------------------------------------------------------------------------


def test_searches_run_faiss_on_one_thread_and_leave_the_threads_setting_as_it_was(
    data: tuple[np.ndarray, np.ndarray, list[np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-query FAISS search opened an OpenMP region on every thread, which cost ~12 ms beside torch's runtime
    on 2 cores (benchmarks/scale.py); searches set one thread, and restore the caller's setting."""
    ids, vectors, scopes = data
    index = _index(ids, vectors, SearchConfig(exact_scope_max=64, approximate_min_total=None))
    seen: list[int] = []
    scan = index._scan

    def spy(*args: object) -> tuple[np.ndarray, np.ndarray]:
        seen.append(faiss.omp_get_max_threads())
        return scan(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(index, "_scan", spy)
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        index.search(vectors[0], 5)
        index.search(vectors[0], 5, allowed_ids=scopes[100])
        assert seen == [1, 1]
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)
