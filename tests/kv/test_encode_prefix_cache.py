"""The shared system prefix is prefilled once, not once per fact, and the K/V encoded on top of its cache equal a
plain pass over ``[prefix][context][fact]`` (issue #16: encoding throughput)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import SUPPORTED_ARCHS, tiny_model

from inferscale.kv.encode import EncodeRequest, FactEncoder

PREFIX = [5, 17, 33, 41, 2, 99, 7]


def requests() -> list[EncodeRequest]:
    """Facts after the prefix (with and without further context and a position gap), and two that do not start
    with it (standalone, and a context that only shares the prefix's first tokens)."""
    return [
        EncodeRequest([60, 61, 62], PREFIX),
        EncodeRequest([70, 71, 72, 73, 74], [*PREFIX, 80, 81, 82]),
        EncodeRequest([90, 91], [*PREFIX, 83], position_gap=4),
        EncodeRequest([100, 101, 102, 103]),
        EncodeRequest([110, 111], [*PREFIX[:3], 84]),
        EncodeRequest([120] * 9, PREFIX),
    ]


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_facts_on_the_cached_prefix_equal_a_plain_pass(arch: str) -> None:
    model = tiny_model(arch)
    plain = FactEncoder(model, batch_size=4, share_contexts=False).encode(requests())
    cached_encoder = FactEncoder(model, batch_size=4)
    cached_encoder.cache_prefix(PREFIX)
    cached = cached_encoder.encode(requests())
    for i, (want, got) in enumerate(zip(plain, cached, strict=True)):
        assert got.encoded_at == want.encoded_at, i
        assert torch.equal(got.token_ids, want.token_ids), i
        torch.testing.assert_close(got.keys, want.keys, atol=2e-5, rtol=1e-4, msg=f"{arch} fact {i} keys")
        torch.testing.assert_close(got.values, want.values, atol=2e-5, rtol=1e-4, msg=f"{arch} fact {i} values")


def test_the_prefix_is_prefilled_once_not_per_fact() -> None:
    reqs = requests()
    plain_encoder = FactEncoder(tiny_model("llama"), batch_size=2, share_contexts=False)
    plain_encoder.encode(reqs)
    assert plain_encoder.tokens_prefilled == sum(len(r.context_ids) + len(r.fact_ids) for r in reqs)

    encoder = FactEncoder(tiny_model("llama"), batch_size=2)
    encoder.cache_prefix(PREFIX)
    assert encoder.tokens_prefilled == len(PREFIX)
    encoder.encode(reqs)
    after_prefix = [r for r in reqs if list(r.context_ids[: len(PREFIX)]) == PREFIX]
    assert len(after_prefix) == 4
    # each request prefills only what follows the prefix; the four that start with it skip 7 tokens each
    assert encoder.tokens_prefilled == len(PREFIX) + plain_encoder.tokens_prefilled - len(PREFIX) * len(after_prefix)
    encoder.encode(reqs)  # a second call reuses the same cached prefix
    assert encoder.tokens_prefilled == len(PREFIX) + 2 * (plain_encoder.tokens_prefilled - len(PREFIX) * 4)


def test_an_empty_prefix_drops_the_cache() -> None:
    encoder = FactEncoder(tiny_model("llama"))
    encoder.cache_prefix(PREFIX)
    encoder.cache_prefix([])
    assert encoder.prefix_ids == ()
    encoder.encode([EncodeRequest([60, 61], PREFIX)])
    assert encoder.tokens_prefilled == len(PREFIX) + len(PREFIX) + 2


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_in_bfloat16_the_cached_prefix_stays_within_rounding_of_a_plain_pass(arch: str) -> None:
    """dtype "auto" picks bfloat16 on CUDA and on CPUs with native bfloat16: the cached path must hold there too.
    A wrong position or mask moves K/V by O(1); bfloat16 rounding by about 1e-2."""
    model = tiny_model(arch).to(torch.bfloat16)
    plain = FactEncoder(model, batch_size=4, share_contexts=False).encode(requests())
    encoder = FactEncoder(model, batch_size=4)
    encoder.cache_prefix(PREFIX)
    for i, (want, got) in enumerate(zip(plain, encoder.encode(requests()), strict=True)):
        assert got.keys.dtype == torch.bfloat16
        torch.testing.assert_close(got.keys.float(), want.keys.float(), atol=5e-2, rtol=5e-2, msg=f"keys {i}")
        torch.testing.assert_close(got.values.float(), want.values.float(), atol=5e-2, rtol=5e-2, msg=f"values {i}")
