"""benchmarks/block_contexts.py: the block contexts and their prefill count against hand-written ones, and the
block of one turn against the product's own context (the w turns before each memory)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from inferscale.encoding_layout import context_turns
from inferscale.eval.fidelity_cases import MAX_CONTEXT_TURNS, memories_with_contexts

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    if "block_contexts" not in sys.modules:
        spec = importlib.util.spec_from_file_location("block_contexts", ROOT / "benchmarks" / "block_contexts.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["block_contexts"] = module
        spec.loader.exec_module(module)
    return sys.modules["block_contexts"]


bc = _script()

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


def test_a_block_of_one_is_the_products_context() -> None:
    sessions = [[f"turn {i}" for i in range(40)], [f"other {i}" for i in range(7)]]
    memories, contexts = bc.block_contexts(sessions, w=5, block=1)
    reference_memories, reference = memories_with_contexts(sessions)
    assert memories == reference_memories
    assert contexts == [context_turns(c, 5) for c in reference]


def test_long_blocks_keep_the_nearest_turns_a_setting_can_take() -> None:
    turns = [f"t{i}" for i in range(30)]
    _, contexts = bc.block_contexts([turns], w=5, block=30)
    assert contexts[29] == turns[29 - MAX_CONTEXT_TURNS : 29]
    assert contexts[10] == turns[:10]


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
