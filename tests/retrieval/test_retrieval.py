"""VectorIndex (FAISS, checked against a numpy reference) and the embedded all-MiniLM-L6-v2 embedder."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest

import inferscale.retrieval.index
from inferscale.errors import ConfigError, InvalidInputError, ModelNotAvailableError
from inferscale.retrieval import Embedder, SentenceTransformerEmbedder, VectorIndex, index_file
from inferscale.retrieval.embedder import embedder_identity
from inferscale.scope import Scope
from inferscale.storage import MemoryStore

DIM = 16


def _unit_rows(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    """float32 [n, dim] with L2 norm 1 per row."""
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _reference(
    ids: np.ndarray, vectors: np.ndarray, query: np.ndarray, k: int, allowed: np.ndarray | None = None
) -> list[tuple[int, float]]:
    """Brute-force top-k by inner product, in float64."""
    scores = vectors.astype(np.float64) @ query.astype(np.float64)
    keep = np.ones(len(ids), dtype=bool) if allowed is None else np.isin(ids, allowed)
    order = [i for i in np.argsort(-scores, kind="stable") if keep[i]][:k]
    return [(int(ids[i]), float(scores[i])) for i in order]


def _assert_same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=0, atol=1e-5)


@pytest.fixture
def filled() -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = np.arange(100, 400, 3, dtype=np.int64)  # 100 non-contiguous ids
    vectors = _unit_rows(rng, len(ids))
    index = VectorIndex(DIM)
    index.add(ids, vectors)
    return index, ids, vectors


# ---- search ---------------------------------------------------------------------------------------------------


def test_search_matches_numpy_reference(filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, ids, vectors = filled
    assert len(index) == 100
    rng = np.random.default_rng(1)
    for query in _unit_rows(rng, 5):
        got = index.search(query, 7)
        _assert_same(got, _reference(ids, vectors, query, 7))
        assert all(a[1] >= b[1] for a, b in itertools.pairwise(got))
    # A stored vector finds itself first with cosine 1.
    best_id, best_score = index.search(vectors[42], 1)[0]
    assert best_id == int(ids[42]) and best_score == pytest.approx(1.0, abs=1e-5)
    # k beyond the index size returns every vector once.
    assert sorted(i for i, _ in index.search(vectors[0], 1000)) == ids.tolist()
    # A [1, dim] query is accepted too.
    _assert_same(index.search(vectors[3][None, :], 4), _reference(ids, vectors, vectors[3], 4))


def test_restricted_search_returns_only_allowed_ids(filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, ids, vectors = filled
    rng = np.random.default_rng(2)
    allowed = rng.choice(ids, size=12, replace=False)
    for query in _unit_rows(rng, 5):
        got = index.search(query, 5, allowed_ids=allowed)
        assert {i for i, _ in got} <= set(allowed.tolist())
        _assert_same(got, _reference(ids, vectors, query, 5, allowed))
    # The restriction is applied inside the search, not after a global top-k: the 3 worst-scoring ids, far
    # below any unrestricted top-3, are still found when they are the only ones allowed.
    query = vectors[0]
    worst = np.array([i for i, _ in _reference(ids, vectors, query, len(ids))][-3:], dtype=np.int64)
    got = index.search(query, 3, allowed_ids=worst)
    assert [i for i, _ in got] == sorted(worst.tolist(), key=lambda i: -float(vectors[ids == i][0] @ query))
    assert all(s < 0 for _, s in got)


def test_restricted_search_edge_cases(filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, ids, vectors = filled
    assert index.search(vectors[0], 5, allowed_ids=np.array([], dtype=np.int64)) == []
    # ids that are not in the index are ignored; k larger than the allowed set returns the allowed set.
    allowed = np.array([ids[5], ids[9], 7, 999_999], dtype=np.int64)
    got = index.search(vectors[5], 10, allowed_ids=allowed)
    assert [i for i, _ in got] == _ids(_reference(ids, vectors, vectors[5], 10, allowed))
    assert {i for i, _ in got} == {int(ids[5]), int(ids[9])}
    assert VectorIndex(DIM).search(vectors[0], 3) == []


def _ids(pairs: list[tuple[int, float]]) -> list[int]:
    return [i for i, _ in pairs]


# ---- add / remove ---------------------------------------------------------------------------------------------


def test_add_replaces_an_existing_id(filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, ids, vectors = filled
    new_vector = -vectors[0]
    index.add(np.array([ids[0]]), new_vector[None, :])
    assert len(index) == 100
    assert np.sort(index.ids()).tolist() == ids.tolist()
    best_id, best_score = index.search(new_vector, 1)[0]
    assert best_id == int(ids[0]) and best_score == pytest.approx(1.0, abs=1e-5)


def test_remove(filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, ids, vectors = filled
    gone = ids[[0, 10, 20]]
    assert index.remove(np.concatenate([gone, np.array([5], dtype=np.int64)])) == 3
    assert len(index) == 97
    assert set(index.ids().tolist()) == set(ids.tolist()) - set(gone.tolist())
    for i in (0, 10, 20):
        assert int(ids[i]) not in _ids(index.search(vectors[i], 10))
    assert index.search(vectors[0], 3, allowed_ids=gone) == []
    assert index.remove(gone) == 0
    assert index.remove(np.array([], dtype=np.int64)) == 0
    keep = np.setdiff1d(ids, gone)
    kept_vectors = vectors[np.isin(ids, keep)]
    query = vectors[1]
    _assert_same(index.search(query, 8), _reference(keep, kept_vectors, query, 8))
    index.reset()
    assert len(index) == 0 and index.ids().shape == (0,)


BAD_ADDS: list[tuple[str, object, object]] = [
    ("wrong dim", np.array([1, 2]), np.zeros((2, DIM + 1), dtype=np.float32)),
    ("1-D vectors", np.array([1]), np.zeros(DIM, dtype=np.float32)),
    ("count mismatch", np.array([1, 2, 3]), np.zeros((2, DIM), dtype=np.float32)),
    ("float ids", np.array([1.0, 2.0]), np.zeros((2, DIM), dtype=np.float32)),
    ("negative id", np.array([-1, 2]), np.zeros((2, DIM), dtype=np.float32)),
    ("2-D ids", np.array([[1, 2]]), np.zeros((2, DIM), dtype=np.float32)),
    ("repeated ids", np.array([1, 1]), np.zeros((2, DIM), dtype=np.float32)),
    ("nan", np.array([1]), np.full((1, DIM), np.nan, dtype=np.float32)),
    ("int vectors", np.array([1]), np.ones((1, DIM), dtype=np.int64)),
]


@pytest.mark.parametrize(("ids", "vectors"), [(i, v) for _, i, v in BAD_ADDS], ids=[n for n, _, _ in BAD_ADDS])
def test_bad_add_raises_and_changes_nothing(
    filled: tuple[VectorIndex, np.ndarray, np.ndarray], ids: np.ndarray, vectors: np.ndarray
) -> None:
    index, stored_ids, stored_vectors = filled
    before = index.ids()
    with pytest.raises(InvalidInputError):
        index.add(ids, vectors)
    assert np.array_equal(index.ids(), before)
    _assert_same(index.search(stored_vectors[0], 5), _reference(stored_ids, stored_vectors, stored_vectors[0], 5))


def test_bad_search_and_constructor_arguments(filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, _, vectors = filled
    with pytest.raises(InvalidInputError):
        index.search(np.zeros(DIM + 1, dtype=np.float32), 3)
    with pytest.raises(InvalidInputError):
        index.search(vectors[:2], 3)
    for bad_k in (0, -2, 2.5, True):
        with pytest.raises(InvalidInputError):
            index.search(vectors[0], bad_k)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        index.search(vectors[0], 3, allowed_ids=np.array([0.5]))
    with pytest.raises(InvalidInputError):
        index.remove(np.array([[1]]))
    for bad_dim in (0, -3, 1.5):
        with pytest.raises(InvalidInputError):
            VectorIndex(bad_dim)  # type: ignore[arg-type]


def test_concurrent_adds(tmp_path: Path) -> None:
    index = VectorIndex(DIM)
    rng = np.random.default_rng(3)
    vectors = _unit_rows(rng, 400)

    def work(worker: int) -> None:
        for j in range(50):
            i = worker * 50 + j
            index.add(np.array([i], dtype=np.int64), vectors[i : i + 1])
            index.search(vectors[i], 3)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(index) == 400
    assert np.sort(index.ids()).tolist() == list(range(400))


# ---- persistence ----------------------------------------------------------------------------------------------


def test_save_and_open_round_trip(tmp_path: Path, filled: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    index, ids, vectors = filled
    path = tmp_path / "nested" / "index.faiss"
    assert index.save(path) == path
    assert [p.name for p in path.parent.iterdir()] == ["index.faiss"]  # no temporary file left behind

    loaded = VectorIndex.open(path, DIM)
    assert loaded.path == path and len(loaded) == len(index)
    assert np.array_equal(loaded.ids(), index.ids())
    allowed = ids[::7]
    for query in (vectors[0], vectors[50]):
        assert loaded.search(query, 6) == index.search(query, 6)
        assert loaded.search(query, 4, allowed_ids=allowed) == index.search(query, 4, allowed_ids=allowed)

    # A reopened index keeps working and saves back to its own path.
    loaded.remove(ids[:10])
    loaded.save()
    assert len(VectorIndex.open(path, DIM)) == 90


def test_labels_say_what_each_vector_was_computed_from_and_are_saved_with_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    index = VectorIndex(DIM, tmp_path / "index.faiss")
    vectors = _unit_rows(rng, 3)
    index.add(np.array([1, 2, 3]), vectors, labels=["a", "b", "c"])
    index.add(np.array([2]), _unit_rows(rng, 1), labels=["b2"])  # a new vector, a new label
    index.add(np.array([3]), vectors[2:])  # no label: unknown origin
    assert index.labels(np.array([1, 2, 3, 4])) == ["a", "b2", None, None]
    assert index.stale_ids(np.array([1, 2, 3, 4]), ["a", "b", "c", "d"]).tolist() == [2, 3, 4]
    np.testing.assert_array_equal(index.vectors(np.array([3, 1])), vectors[[2, 0]])
    index.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss"]  # the labels are in the index file
    assert VectorIndex.open(tmp_path / "index.faiss", DIM).labels(np.array([1, 2, 3])) == ["a", "b2", None]
    index.remove(np.array([1]))
    assert index.labels(np.array([1])) == [None]
    with pytest.raises(InvalidInputError, match="label"):
        index.add(np.array([5]), _unit_rows(rng, 1), labels=["é"])
    with pytest.raises(InvalidInputError, match="not in the index"):
        index.vectors(np.array([9]))


def test_a_save_writes_the_index_and_its_labels_in_one_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two renames (index, then labels) let interleaved saves of two processes pair one's index with the other's
    labels, which forced a full re-embed; one file renamed once cannot mismatch."""
    rng = np.random.default_rng(8)
    path = tmp_path / "index.faiss"
    writes: list[Path] = []
    write = inferscale.retrieval.index.atomic_write

    def counted(target: Path, data: bytes | memoryview, fsync: bool = True) -> None:
        writes.append(target)
        write(target, data, fsync)

    monkeypatch.setattr(inferscale.retrieval.index, "atomic_write", counted)
    index = VectorIndex(DIM, path)
    index.add(np.array([1, 2]), _unit_rows(rng, 2), labels=["old-1", "old-2"])
    index.save()
    assert writes == [path]
    assert VectorIndex.open(path, DIM).labels(np.array([1, 2, 3])) == ["old-1", "old-2", None]


def test_an_earlier_versions_files_are_read_and_mismatched_labels_ignored(tmp_path: Path) -> None:
    """An earlier version saved the bare FAISS index and its labels beside it, bound by a digest: they are read,
    and labels of another save count as none (a caller embeds again), never as labelled wrongly."""
    rng = np.random.default_rng(9)
    path = tmp_path / "index.faiss"
    index = VectorIndex(DIM, path)
    index.add(np.array([1, 2]), _unit_rows(rng, 2))
    data = faiss.serialize_index(index._index)
    path.write_bytes(data.tobytes())

    def sidecar(digest: str) -> None:
        with (tmp_path / "index.faiss.labels.npz").open("wb") as out:
            np.savez(out, ids=np.array([1, 2]), labels=np.array(["a", "b"], dtype="S"), index=np.array(digest))

    sidecar(hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest())
    assert VectorIndex.open(path, DIM).labels(np.array([1, 2])) == ["a", "b"]
    sidecar("0" * 32)
    assert VectorIndex.open(path, DIM).labels(np.array([1, 2])) == [None, None]
    (tmp_path / "index.faiss.labels.npz").write_bytes(b"not an npz file")
    assert VectorIndex.open(path, DIM).labels(np.array([1, 2])) == [None, None]
    VectorIndex.open(path, DIM).save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss"]


def test_open_missing_file_gives_empty_index(tmp_path: Path) -> None:
    path = tmp_path / "absent.faiss"
    index = VectorIndex.open(path, DIM)
    assert len(index) == 0 and index.path == path
    assert not path.exists()
    index.add(np.array([4]), _unit_rows(np.random.default_rng(4), 1))
    index.save()
    assert VectorIndex.open(path, DIM).ids().tolist() == [4]


def test_open_rejects_wrong_dim_and_corrupt_files(
    tmp_path: Path, filled: tuple[VectorIndex, np.ndarray, np.ndarray]
) -> None:
    index, _, _ = filled
    path = index.save(tmp_path / "index.faiss")
    with pytest.raises(InvalidInputError, match="dim"):
        VectorIndex.open(path, DIM * 2)
    corrupt = tmp_path / "corrupt.faiss"
    corrupt.write_bytes(b"not a faiss index")
    with pytest.raises(ConfigError):
        VectorIndex.open(corrupt, DIM)
    with pytest.raises(InvalidInputError, match="no path"):
        VectorIndex(DIM).save()


@pytest.mark.parametrize(
    "damage", ["cut short", "empty", "index bytes changed", "cut within the zip magic", "zero bytes"]
)
def test_a_damaged_index_file_is_set_aside_and_the_index_starts_empty(
    tmp_path: Path,
    filled: tuple[VectorIndex, np.ndarray, np.ndarray],
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An index file InferScale wrote that cannot be read (a save or a backup copy cut short, an empty file, bytes
    changed in place) made every search and chat fail with ConfigError until someone deleted it by hand: the index
    is derived from the database, so the file is kept aside, bytes intact, and the index starts empty."""
    index, ids, vectors = filled
    path = index.save(tmp_path / "index.faiss")
    whole = path.read_bytes()
    if damage == "cut short":
        damaged = whole[: len(whole) // 2]
    elif damage == "empty":
        damaged = b""
    elif damage == "cut within the zip magic":  # an .npz begins PK\x03\x04
        damaged = whole[:3]
    elif damage == "zero bytes":  # what a power loss can leave of a file whose blocks were never written
        damaged = bytes(len(whole))
    else:  # a readable .npz whose serialised FAISS index is garbage
        saved = index_file.read(path)
        garbage = np.frombuffer(b"not a faiss index at all", dtype=np.uint8)
        damaged = bytes(index_file.encode(dataclasses.replace(saved, index=garbage)))
    path.write_bytes(damaged)
    with caplog.at_level("WARNING", logger="inferscale.retrieval.index"):
        opened = VectorIndex.open(path, DIM)
    assert len(opened) == 0 and opened.path == path and not path.exists()
    (aside,) = tmp_path.glob("index.faiss.damaged-*")
    assert aside.read_bytes() == damaged
    assert str(aside) in caplog.text and "rebuilt from the database" in caplog.text
    opened.add(ids, vectors)
    opened.save()
    assert VectorIndex.open(path, DIM).ids().tolist() == ids.tolist()


def test_a_damaged_index_file_replaced_meanwhile_is_left(
    tmp_path: Path, filled: tuple[VectorIndex, np.ndarray, np.ndarray]
) -> None:
    """Two processes that find the file damaged: the second must not set aside the index the first rebuilt."""
    index, _, _ = filled
    path = index.save(tmp_path / "index.faiss")
    path.write_bytes(b"")
    read = path.stat()
    index.save(path)  # the other process's rebuilt index, saved by an atomic rename
    assert index_file.set_aside(path, read) is None
    assert len(VectorIndex.open(path, DIM)) == len(index)


def test_open_reports_the_saved_embedder_and_drops_another_models_other_dimension(
    tmp_path: Path, filled: tuple[VectorIndex, np.ndarray, np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    _, ids, vectors = filled
    tagged = VectorIndex(DIM, tmp_path / "index.faiss", embedder="model-a (16-d)")
    tagged.add(ids, vectors, labels=[f"h{i}" for i in ids])
    file = tagged.save()
    other = VectorIndex.open(file, DIM, embedder="model-b (16-d)")  # the caller checks whose vectors they are
    assert other.ids().tolist() == ids.tolist() and other.embedder == "model-a (16-d)"
    other.set_embedder("model-b (16-d)")
    other.save()
    assert VectorIndex.open(file, DIM).embedder == "model-b (16-d)"
    with caplog.at_level("WARNING", logger="inferscale.retrieval.index"):
        wider = VectorIndex.open(file, DIM * 2, embedder="model-c (32-d)")  # another model's dimension: no error
    assert len(wider) == 0 and wider.dim == DIM * 2 and wider.embedder == "model-c (32-d)" and wider.path == file
    assert "model-b (16-d)" in caplog.text and "model-c (32-d)" in caplog.text
    assert len(VectorIndex.open(file, DIM)) == len(ids)  # the file is untouched until the next save
    with pytest.raises(InvalidInputError, match="dim"):  # the same identity cannot change its dimension
        VectorIndex.open(file, DIM * 2, embedder="model-b (16-d)")


def test_a_file_without_embedder_identity_records_none_until_set(
    tmp_path: Path, filled: tuple[VectorIndex, np.ndarray, np.ndarray]
) -> None:
    index, ids, _ = filled
    file = index.save(tmp_path / "index.faiss")  # saved without an identity (as earlier versions did)
    loaded = VectorIndex.open(file, DIM, embedder="model-a (16-d)")
    assert loaded.ids().tolist() == ids.tolist() and loaded.embedder is None
    other = VectorIndex.open(file, DIM * 2, embedder="model-a (32-d)")  # another dimension: another model's
    assert len(other) == 0 and other.embedder == "model-a (32-d)"
    with pytest.raises(InvalidInputError, match="dim"):  # a caller that names no embedder is told to rebuild
        VectorIndex.open(file, DIM * 2)
    loaded.set_embedder("model-a (16-d)")
    loaded.save()
    assert VectorIndex.open(file, DIM).embedder == "model-a (16-d)"  # recorded from the next save on
    with pytest.raises(InvalidInputError, match="embedder must be a non-empty str"):
        VectorIndex(DIM, embedder="")
    with pytest.raises(InvalidInputError, match="embedder must be a non-empty str"):
        loaded.set_embedder("")


# ---- embedder -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm(embedder: SentenceTransformerEmbedder) -> SentenceTransformerEmbedder:
    """The default embedder (``SentenceTransformerEmbedder()``), loaded once per session by conftest.py."""
    return embedder


@pytest.mark.slow
def test_default_embedder_loads_minilm(minilm: SentenceTransformerEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert minilm.dim == 384
    texts = ["My dog is called Biscuit.", "I adopted a beagle.", "The stock market fell today."]
    vectors = minilm.embed(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Deterministic: embedding the same text twice gives the same vector.
    np.testing.assert_allclose(minilm.embed(texts[:1])[0], vectors[0], atol=1e-5)
    assert embedder_identity(minilm) == "sentence-transformers/all-MiniLM-L6-v2 (384-d)"


class _Unnamed:
    dim = 3

    def embed(self, texts: object) -> np.ndarray:
        return np.zeros((0, 3), dtype=np.float32)


class _Named(_Unnamed):
    name = "my-model-v2"


def test_embedder_identity_names_the_model_or_the_class() -> None:
    assert embedder_identity(_Named()) == "my-model-v2 (3-d)"
    assert embedder_identity(_Unnamed()) == f"{__name__}._Unnamed (3-d)"
    assert SentenceTransformerEmbedder("/models/e5-small").name == "/models/e5-small"  # no model load
    assert SentenceTransformerEmbedder().name == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.slow
def test_paraphrase_scores_higher_than_unrelated(minilm: SentenceTransformerEmbedder) -> None:
    query, paraphrase, unrelated = minilm.embed(
        [
            "Alice is allergic to peanuts.",
            "Peanuts give Alice an allergic reaction.",
            "The train to Berlin leaves at noon.",
        ]
    )
    close = float(query @ paraphrase)
    far = float(query @ unrelated)
    assert close > far + 0.3, (close, far)


@pytest.mark.slow
def test_embedder_edge_cases(minilm: SentenceTransformerEmbedder) -> None:
    empty = minilm.embed([])
    assert empty.shape == (0, 384) and empty.dtype == np.float32
    with pytest.raises(InvalidInputError):
        minilm.embed("a bare string")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        minilm.embed(["ok", 3])  # type: ignore[list-item]


def test_missing_embedder_folder_fails_on_first_use(tmp_path: Path) -> None:
    embedder = SentenceTransformerEmbedder(str(tmp_path / "no-such-model"))  # lazy: no error yet
    with pytest.raises(ModelNotAvailableError):
        embedder.embed(["hello"])


@pytest.mark.slow
def test_scoped_semantic_search_end_to_end(minilm: SentenceTransformerEmbedder, tmp_path: Path) -> None:
    """Store facts for two users, index them by vector id, and search within one user's scope only."""
    store = MemoryStore(f"sqlite:///{tmp_path}/memory.db")
    alice, bob = Scope(user_id="alice"), Scope(user_id="bob")
    facts = {
        alice: ["Alice adopted a beagle named Biscuit.", "Alice works as a nurse in Lyon."],
        bob: ["Bob's dog is a poodle called Max.", "Bob plays the cello."],
    }
    index = VectorIndex(minilm.dim)
    for scope, texts in facts.items():
        records = [store.add(t, scope) for t in texts]
        index.add(np.array([r.vector_id for r in records], dtype=np.int64), minilm.embed(texts))

    query = minilm.embed(["What is the name of my dog?"])[0]
    for scope, expected in ((alice, facts[alice][0]), (bob, facts[bob][0])):
        hits = index.search(query, 2, allowed_ids=store.vector_ids_in_scope(scope))
        by_id = store.by_vector_ids([i for i, _ in hits])
        texts = [by_id[i].text for i, _ in hits]
        assert texts[0] == expected
        assert set(texts) <= set(facts[scope])
    store.close()


def test_an_embedder_folder_holding_no_model_is_a_config_error(tmp_path: Path) -> None:
    """An empty folder raised sentence-transformers' bare ValueError ("Unrecognized model"), no InferScale error."""
    embedder = SentenceTransformerEmbedder(str(tmp_path))
    with pytest.raises(ConfigError, match=r"embedder.model '.*' holds no model that can be loaded"):
        embedder.embed(["hello"])


def test_a_damaged_index_file_that_cannot_be_renamed_is_left_and_the_index_still_starts_empty(
    tmp_path: Path,
    filled: tuple[VectorIndex, np.ndarray, np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A read-only folder: the rename raised a raw PermissionError out of open() (review)."""
    index, _, _ = filled
    path = index.save(tmp_path / "index.faiss")
    path.write_bytes(b"")

    def read_only(self: Path, target: object) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", read_only)
    with caplog.at_level("WARNING", logger="inferscale.retrieval"):
        opened = VectorIndex.open(path, DIM)
    assert len(opened) == 0 and path.read_bytes() == b""
    assert "could not be set aside (" in caplog.text and "Permission denied" in caplog.text
