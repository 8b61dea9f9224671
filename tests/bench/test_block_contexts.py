"""benchmarks/block_contexts.py: the block contexts and their prefill count against hand-written ones, and the
block of one turn against the session-bounded context (the w turns before each memory in its session) the runs
before run 23 measured."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from benchmark_scripts import load_benchmark

from inferscale.encoding_layout import context_turns
from inferscale.eval.fidelity_cases import MAX_CONTEXT_TURNS, memories_with_contexts

bc = load_benchmark("block_contexts")

SESSIONS = [["a", "b", "c", "d", "e", "f", "g"], ["h", "b", "i"]]


def test_each_turn_sees_the_turns_before_its_block_and_the_blocks_turns_before_it() -> None:
    memories, contexts = bc.block_contexts(SESSIONS, w=2, block=3)
    assert memories == ["a", "b", "c", "d", "e", "f", "g", "h", "i"]  # "b" again in session 2 is one memory
    assert contexts == [
        [],  # block a-c
        ["a"],
        ["a", "b"],
        ["b", "c"],  # block d-f: the 2 turns before it
        ["b", "c", "d"],
        ["b", "c", "d", "e"],
        ["e", "f"],  # block g
        [],  # session 2, block h-b-i: contexts never cross sessions
        ["h", "b"],
    ]


def test_a_block_of_one_is_the_session_bounded_context_the_runs_before_23_measured() -> None:
    sessions = [[f"turn {i}" for i in range(40)], [f"other {i}" for i in range(7)]]
    memories, contexts = bc.block_contexts(sessions, w=5, block=1)
    reference_memories, reference = memories_with_contexts(sessions, across_sessions=False)
    assert memories == reference_memories
    assert contexts == [context_turns(c, 5) for c in reference]


def test_a_block_longer_than_a_setting_takes_whole_is_refused() -> None:
    turns = [f"t{i}" for i in range(30)]
    _, contexts = bc.block_contexts([turns], w=5, block=12)  # 12 = 16 - 5 + 1: the longest context is 16 turns
    assert max(len(c) for c in contexts) == MAX_CONTEXT_TURNS
    assert contexts[23] == turns[7:23]  # turn 23 closes block 12-23: the 5 turns before it and 11 of its own
    for w, block in ((5, 13), (0, 0), (-1, 1)):
        with pytest.raises(ValueError, match="need w >= 0"):
            bc.block_contexts([turns], w=w, block=block)


class _CharTokens:
    """One token per character; a context is its turns' characters."""

    def fact_token_ids(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def context_token_ids(self, turns: Sequence[str]) -> list[int]:
        return [ord(c) for t in turns for c in t]


def test_prefill_counts_each_blocks_context_once() -> None:
    sessions = [["aa", "bbb", "c", "dddd"]]
    # B=2, w=1: pass 1 prefills "aa" + "bbb" (5); pass 2 prefills context "bbb" + "c" + "dddd" (8); facts 10.
    assert bc.prefill_per_fact_token(_CharTokens(), sessions, w=1, block=2) == 13 / 10
    # B=1, w=1: every turn after the one before it: 2 + (2+3) + (3+1) + (1+4) = 16.
    assert bc.prefill_per_fact_token(_CharTokens(), sessions, w=1, block=1) == 16 / 10
