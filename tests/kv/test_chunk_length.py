"""The background encoder's chunks end before a run of memories that share a context, not inside it, so a shared
context is prefilled once per run (:func:`inferscale.kv.encode.chunk_length`)."""

from __future__ import annotations

import pytest

from inferscale.kv.encode import chunk_length


@pytest.mark.parametrize(
    ("contexts", "size", "expected"),
    [
        (["a", "a", "a", "b", "b", "b"], 4, 3),  # ends before b's run instead of taking its first fact
        (["a", "a", "a", "b", "b", "b"], 3, 3),  # a's run fills the chunk exactly
        (["a", "a", "a", "a", "a", "a"], 4, 4),  # a run longer than a chunk is split
        (["x", "a", "a", "a", "a", "b"], 4, 1),  # ends before a's run, which then fills the next chunk
        (["x", "a", "a", "a", "a", "a"], 4, 4),  # a's run is longer than a chunk wherever it starts: no cut
        (["x", "y", "a", "a", "a"], 3, 2),
        (["a", "b", "c", "d", "e"], 4, 4),  # nothing shared: full chunks
        ([None, None, None, None, None], 4, 4),  # None shares nothing, even with another None
        (["a", "b", None, None, None], 3, 3),
        (["a", "a", "b"], 4, 3),  # fewer left than a chunk: all of them
        (["a", "a", "b", "b"], 2, 2),
        ([], 4, 0),
        (["a", "b", "b"], 1, 1),
    ],
)
def test_a_chunk_ends_at_the_start_of_the_run_the_next_item_continues(
    contexts: list[str | None], size: int, expected: int
) -> None:
    assert chunk_length(contexts, size) == expected


def test_chunks_cover_the_queue_in_order_without_splitting_runs_that_fit() -> None:
    contexts = ["a"] * 3 + ["b"] * 2 + [None] + ["c"] * 4 + ["d"] * 3
    chunks = []
    rest = contexts
    while rest:
        n = chunk_length(rest, 4)
        chunks.append(rest[:n])
        rest = rest[n:]
    assert chunks == [["a"] * 3, ["b", "b", None], ["c"] * 4, ["d"] * 3]


def test_only_what_the_decision_needs_is_read() -> None:
    """With ``2 * size + 1`` items the answer is the one the whole queue gives."""
    contexts = ["x", "a", "a", "a", "a", "a", "a", "a", "b"]
    for size in range(1, 5):
        assert chunk_length(contexts[: 2 * size + 1], size) == chunk_length(contexts, size)


def test_a_size_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        chunk_length(["a"], 0)
