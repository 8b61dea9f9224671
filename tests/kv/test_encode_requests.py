"""EncodeRequest spans and the context-window check both engines run before encoding."""

from __future__ import annotations

import pytest

from inferscale.errors import InvalidInputError
from inferscale.kv.encode import EncodeRequest, check_spans


def test_span_counts_context_gap_and_fact() -> None:
    assert EncodeRequest([1, 2, 3], [9] * 5, position_gap=7).span == 15
    assert EncodeRequest([1]).span == 1


def test_check_spans_refuses_the_first_request_past_the_window() -> None:
    fits = EncodeRequest([1, 2], [0] * 6)  # span 8
    check_spans([fits], max_positions=8)
    with pytest.raises(InvalidInputError, match=r"fact 1 needs positions up to 9 .* context is 8 tokens"):
        check_spans([fits, EncodeRequest([1, 2], [0] * 6, position_gap=1)], max_positions=8)
