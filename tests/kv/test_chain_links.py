"""Which memories a chained memory is encoded on, and how a new memory joins a chain (inferscale.chains), against
hand-written expectations; and the settings that chains refuse."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferscale.chains import ChainLink, anchor_context, chained_on, next_in_chain
from inferscale.config import KVConfig

LEAD_IN = ("t1", "t2")  # the anchor's context turns


def test_a_chained_memory_is_encoded_on_the_last_window_memories_of_its_block_with_their_own_contexts() -> None:
    link = ChainLink("m3", (*LEAD_IN, "a", "m1", "m2"), 2)  # block: anchor "a", then m1, m2, then m3
    assert chained_on(link, 2) == [
        ChainLink("m1", (*LEAD_IN, "a"), 2),
        ChainLink("m2", (*LEAD_IN, "a", "m1"), 2),
    ]
    assert [m.text for m in chained_on(link, 5)] == ["a", "m1", "m2"]  # never past the anchor into its turns
    assert chained_on(link, 5)[0] == ChainLink("a", LEAD_IN, 2) and not chained_on(link, 5)[0].chained


def test_anchors_and_memories_in_no_chain_are_encoded_on_nothing() -> None:
    assert chained_on(ChainLink("a", LEAD_IN, 2), 3) == []  # an anchor: its chain starts at its context's end
    assert chained_on(ChainLink("x", LEAD_IN, None), 3) == []
    with pytest.raises(ValueError, match="window must be at least 1"):
        chained_on(ChainLink("m1", (*LEAD_IN, "a"), 2), 0)


def test_a_new_memory_continues_its_block_until_the_block_is_full() -> None:
    anchor = ChainLink("a", LEAD_IN, 2)
    assert next_in_chain(anchor, 3) == ((*LEAD_IN, "a"), 2)
    second = ChainLink("m1", (*LEAD_IN, "a"), 2)
    assert next_in_chain(second, 3) == ((*LEAD_IN, "a", "m1"), 2)
    third = ChainLink("m2", (*LEAD_IN, "a", "m1"), 2)
    assert next_in_chain(third, 3) is None  # the block holds 3: the next memory anchors a new one
    assert next_in_chain(anchor, 2) == ((*LEAD_IN, "a"), 2) and next_in_chain(second, 2) is None


def test_a_memory_after_none_or_after_one_in_no_chain_anchors_a_block() -> None:
    assert next_in_chain(None, 24) is None
    assert next_in_chain(ChainLink("x", LEAD_IN, None), 24) is None
    with pytest.raises(ValueError, match="at least 2 memories"):
        next_in_chain(ChainLink("a", LEAD_IN, 2), 1)


def test_an_anchor_keeps_the_last_w_turns() -> None:
    assert anchor_context(["t0", *LEAD_IN], 2) == LEAD_IN
    assert anchor_context(["t0"], 2) == ("t0",)
    assert anchor_context(["t0", *LEAD_IN], 0) == ()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"chain_block": 1}, "0 \\(no chains\\) or at least 2"),
        ({"chain_block": 24, "position_buckets": (0, 64)}, "position_buckets=\\(0,\\)"),
        ({"chain_block": 24, "encode_after_system_prefix": False}, "encode_after_system_prefix=True"),
        ({"chain_block": 33}, "less than or equal to 32"),
        ({"chain_window": 0}, "greater than or equal to 1"),
    ],
)
def test_settings_chains_cannot_serve_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KVConfig(**settings)  # type: ignore[arg-type]


def test_chains_are_off_by_default_and_on_from_a_block_of_two() -> None:
    assert not KVConfig().chains and KVConfig(chain_block=2).chains
