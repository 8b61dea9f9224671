"""A fact encoded on the stored K/V of earlier facts (a chained encoding, docs/architecture.md runs 14 and 17) equals
the plain pass over ``[prefix][those facts' tokens][fact]`` when those facts were themselves encoded after the prefix
and one another: chaining re-uses stored K/V instead of prefilling the earlier facts' text again (issue #16)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import SUPPORTED_ARCHS, tiny_engine, tiny_model

from inferscale.errors import UnsupportedModelError
from inferscale.kv.encode import EncodeRequest, FactEncoder
from inferscale.kv.fact import FactKV
from inferscale.kv.rope import RopeTable

PREFIX = [5, 17, 33, 41, 2, 99, 7]
FIRST, SECOND, THIRD = [60, 61, 62], [70, 71, 72, 73, 74], [90, 91]
CHAINABLE = [arch for arch in SUPPORTED_ARCHS if arch != "gemma3"]  # gemma3 has sliding-window layers


def chained_encoder(model: torch.nn.Module, batch_size: int = 4) -> FactEncoder:
    encoder = FactEncoder(model, batch_size=batch_size, rotate_keys=RopeTable.from_model(model).rotate)
    encoder.cache_prefix(PREFIX)
    return encoder


def text_reference(model: torch.nn.Module, fact: list[int], before: list[int]) -> FactKV:
    """``fact`` encoded by a plain pass after the prefix and ``before`` as tokens (no cache, no chain)."""
    return FactEncoder(model, share_contexts=False).encode([EncodeRequest(fact, [*PREFIX, *before])])[0]


def assert_same(got: FactKV, want: FactKV, what: str) -> None:
    assert got.encoded_at == want.encoded_at, what
    assert torch.equal(got.token_ids, want.token_ids), what
    torch.testing.assert_close(got.keys, want.keys, atol=2e-5, rtol=1e-4, msg=f"{what} keys")
    torch.testing.assert_close(got.values, want.values, atol=2e-5, rtol=1e-4, msg=f"{what} values")


@pytest.mark.parametrize("arch", CHAINABLE)
def test_a_chain_of_stored_facts_equals_the_plain_pass_over_their_text(arch: str) -> None:
    model = tiny_model(arch)
    encoder = chained_encoder(model)
    (first,) = encoder.encode([EncodeRequest(FIRST, PREFIX)])
    (second,) = encoder.encode([EncodeRequest(SECOND, PREFIX, chained_on=[first])])
    (third,) = encoder.encode([EncodeRequest(THIRD, PREFIX, chained_on=[first, second])])
    assert_same(second, text_reference(model, SECOND, FIRST), f"{arch} second")
    # the second fact's K/V were chained themselves: the third still equals the text pass over both
    assert_same(third, text_reference(model, THIRD, FIRST + SECOND), f"{arch} third")


def test_chained_and_plain_requests_share_a_batch() -> None:
    """Rows with different caches (the prefix alone, the prefix and one or two facts) and a shared context are
    left-padded into one pass; each fact still equals its own reference."""
    model = tiny_model("llama")
    encoder = chained_encoder(model, batch_size=8)
    first, second = encoder.encode([EncodeRequest(FIRST, PREFIX), EncodeRequest(SECOND, [*PREFIX, *FIRST])])
    shared = [*PREFIX, 80, 81]
    mixed = [
        EncodeRequest(THIRD, PREFIX, chained_on=[first, second]),
        EncodeRequest([100, 101, 102, 103], shared),
        EncodeRequest(SECOND, PREFIX, chained_on=[first]),
        EncodeRequest([110], shared),
        EncodeRequest([120, 121], [*PREFIX, 84], position_gap=3),
    ]
    got = encoder.encode(mixed)
    assert_same(got[0], text_reference(model, THIRD, FIRST + SECOND), "third")
    assert_same(got[2], text_reference(model, SECOND, FIRST), "second")
    plain = FactEncoder(model, share_contexts=False).encode([mixed[i] for i in (1, 3, 4)])
    for i, want in zip((1, 3, 4), plain, strict=True):
        assert_same(got[i], want, f"request {i}")


def test_only_the_fact_tokens_are_prefilled() -> None:
    encoder = chained_encoder(tiny_model("llama"))
    (first,) = encoder.encode([EncodeRequest(FIRST, PREFIX)])
    before = encoder.tokens_prefilled
    (third,) = encoder.encode([EncodeRequest(THIRD, PREFIX, chained_on=[first, first])])
    assert encoder.tokens_prefilled - before == len(THIRD)
    assert third.encoded_at == len(PREFIX) + 2 * len(FIRST)
    assert EncodeRequest(THIRD, PREFIX, chained_on=[first, first]).span == len(PREFIX) + 2 * len(FIRST) + len(THIRD)


def test_8_bit_facts_are_chained_as_their_dequantised_values() -> None:
    model = tiny_model("llama")
    encoder = chained_encoder(model)
    (first,) = encoder.encode([EncodeRequest(FIRST, PREFIX)])
    stored = first.quantized("int8")
    assert stored.scales is not None
    (from_codes,) = encoder.encode([EncodeRequest(SECOND, PREFIX, chained_on=[stored])])
    (from_floats,) = encoder.encode([EncodeRequest(SECOND, PREFIX, chained_on=[stored.dequantized(torch.float32)])])
    assert torch.equal(from_codes.keys, from_floats.keys)
    assert torch.equal(from_codes.values, from_floats.values)
    # and the quantisation moved the chained fact's K/V, so the test would see a chain that ignored them
    (exact,) = encoder.encode([EncodeRequest(SECOND, PREFIX, chained_on=[first])])
    assert not torch.equal(from_codes.keys, exact.keys)


def test_chained_requests_it_cannot_encode_are_refused() -> None:
    model = tiny_model("llama")
    (first,) = chained_encoder(model).encode([EncodeRequest(FIRST, PREFIX)])
    no_rotation = FactEncoder(model)
    no_rotation.cache_prefix(PREFIX)
    with pytest.raises(ValueError, match="request 0 is chained on stored facts, but this encoder was built without"):
        no_rotation.encode([EncodeRequest(SECOND, PREFIX, chained_on=[first])])
    encoder = chained_encoder(model)
    with pytest.raises(ValueError, match="request 1 is chained on stored facts: its context must be the cached"):
        encoder.encode([EncodeRequest(THIRD, PREFIX), EncodeRequest(SECOND, [*PREFIX, 80], chained_on=[first])])
    with pytest.raises(ValueError, match="request 0 is chained on stored facts: it takes no position gap"):
        encoder.encode([EncodeRequest(SECOND, PREFIX, position_gap=2, chained_on=[first])])


def test_a_model_with_sliding_window_layers_is_not_chained() -> None:
    model = tiny_model("gemma3")
    encoder = chained_encoder(model)
    (first,) = encoder.encode([EncodeRequest(FIRST, PREFIX)])
    with pytest.raises(UnsupportedModelError, match="sliding-window layers"):
        encoder.encode([EncodeRequest(SECOND, PREFIX, chained_on=[first])])


def test_the_transformers_engine_encodes_chained_requests() -> None:
    """The engine gives its encoder the model's own rotation: a chained encode through it equals the text pass."""
    engine = tiny_engine()
    prefix = engine.system_prefix_ids()
    first_ids, second_ids = engine.fact_token_ids("Maya has a dog."), engine.fact_token_ids("His name is Biscuit.")
    (first,) = engine.encode_facts([EncodeRequest(first_ids, prefix)])
    (chained,) = engine.encode_facts([EncodeRequest(second_ids, prefix, chained_on=[first])])
    (text,) = engine.encode_facts([EncodeRequest(second_ids, prefix + first_ids)])
    assert_same(chained, text, "engine")
