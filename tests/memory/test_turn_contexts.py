"""``turn_contexts``: the context each message of an ``add(infer=False)`` call is encoded after."""

from __future__ import annotations

import pytest

from inferscale.memory.contexts import turn_contexts


def test_each_turn_follows_the_stored_texts_then_the_calls_earlier_turns() -> None:
    assert turn_contexts(["m1", "m2"], ["a", "b", "c"], keep=3) == [("m1", "m2"), ("m1", "m2", "a"), ("m2", "a", "b")]


def test_a_repeated_turn_gets_the_context_of_its_own_place() -> None:
    assert turn_contexts([], ["x", "y", "x"], keep=16) == [(), ("x",), ("x", "y")]


def test_keep_zero_keeps_nothing_and_a_negative_keep_is_refused() -> None:
    assert turn_contexts(["m1"], ["a", "b"], keep=0) == [(), ()]
    with pytest.raises(ValueError, match="keep must be >= 0"):
        turn_contexts([], ["a"], keep=-1)
