"""A context that several requests of one ``encode`` call share is prefilled once, and the facts encoded on top
of its K/V equal a plain pass over ``[context][fact]`` (issue #16: encoding throughput; the facts one
``add(infer=True)`` call extracts share the call's context turns)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import LONGROPE_ORIGINAL_MAX, SUPPORTED_ARCHS, tiny_model

from inferscale.kv.encode import EncodeRequest, FactEncoder
from inferscale.kv.fact import FactKV

PREFIX = [5, 17, 33, 41, 2, 99, 7]
TURNS = [80, 81, 82, 83, 84, 85]
OTHER_TURNS = [86, 87, 88]


def requests() -> list[EncodeRequest]:
    """Three facts after the prefix and the same turns (one at a position gap), two after the prefix and other
    turns, two after the turns alone (no prefix: a context that does not start with the cached one), one after
    turns no other request has, two after the prefix alone (which its cache covers already), and one standalone
    (no context: a row without a cache, batched with rows that have one)."""
    return [
        EncodeRequest([60, 61, 62], [*PREFIX, *TURNS]),
        EncodeRequest([100, 101, 102, 103], [*PREFIX, *OTHER_TURNS]),
        EncodeRequest([70, 71, 72, 73, 74], [*PREFIX, *TURNS], position_gap=4),
        EncodeRequest([110, 111], TURNS),
        EncodeRequest([90, 91], [*PREFIX, *TURNS]),
        EncodeRequest([120] * 9, PREFIX),
        EncodeRequest([104, 105], [*PREFIX, *OTHER_TURNS]),
        EncodeRequest([112], TURNS),
        EncodeRequest([113, 114], [*PREFIX, 89]),
        EncodeRequest([121, 122], PREFIX),
        EncodeRequest([130, 131, 132]),
    ]


def assert_same_facts(plain: list[FactKV], shared: list[FactKV], atol: float, rtol: float, what: str) -> None:
    for i, (want, got) in enumerate(zip(plain, shared, strict=True)):
        assert got.encoded_at == want.encoded_at, i
        assert torch.equal(got.token_ids, want.token_ids), i
        assert got.keys.dtype == want.keys.dtype, i
        torch.testing.assert_close(got.keys.float(), want.keys.float(), atol=atol, rtol=rtol, msg=f"{what} {i} keys")
        torch.testing.assert_close(got.values.float(), want.values.float(), atol=atol, rtol=rtol, msg=f"{what} {i} v")


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize("batch_size", [2, 16])
def test_facts_on_a_shared_context_equal_a_plain_pass(arch: str, batch_size: int) -> None:
    """Against the encoder that shares nothing (no cached prefix, every context prefilled per request): the same
    K/V within float32 kernel rounding, with the groups split over several batches (2) or in one (16)."""
    model = tiny_model(arch)
    plain = FactEncoder(model, batch_size=batch_size, share_contexts=False).encode(requests())
    encoder = FactEncoder(model, batch_size=batch_size)
    encoder.cache_prefix(PREFIX)
    assert_same_facts(plain, encoder.encode(requests()), 2e-5, 1e-4, arch)


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_under_a_sliding_window_shorter_than_the_contexts_a_shared_context_equals_a_plain_pass(arch: str) -> None:
    """A sliding layer's cache keeps only the last window of slots: a padded cache or a padded prefill would shift
    what falls inside it. With a window of 6 tokens (every shared context is longer), the K/V still equal the plain
    pass's."""
    model = tiny_model(arch, sliding_window=6)
    plain = FactEncoder(model, batch_size=4, share_contexts=False).encode(requests())
    encoder = FactEncoder(model, batch_size=4)
    encoder.cache_prefix(PREFIX)
    assert_same_facts(plain, encoder.encode(requests()), 2e-5, 1e-4, arch)


def test_padding_never_passes_the_longest_real_position_longrope_reads() -> None:
    """longrope picks its factor for the whole pass from the largest position id: a standalone fact batched with
    facts on a long shared context must not get padding positions past the batch's real ones (it did: its pad
    columns counted on from the fact's start, past 256, and every row of the batch took the long factor)."""
    model = tiny_model("llama_longrope")
    context = [(7 * i) % 250 + 3 for i in range(LONGROPE_ORIGINAL_MAX - 16)]  # 240 tokens, all spans under 256
    reqs = [
        EncodeRequest([60, 61, 62], context),
        EncodeRequest([63, 64], context),
        EncodeRequest(list(range(100, 120))),  # 20 tokens: padded to the batch's width of 20
    ]
    assert max(r.span for r in reqs) < LONGROPE_ORIGINAL_MAX
    plain = FactEncoder(model, batch_size=1, share_contexts=False).encode(reqs)
    assert_same_facts(plain, FactEncoder(model, batch_size=4).encode(reqs), 2e-5, 1e-4, "longrope")


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_a_padded_pass_is_kept_under_a_window_no_single_span_reaches(arch: str) -> None:
    """Each span (at most 12 tokens) is under the 16-token window, but a context prefill that pads a context on the
    7-token prefix (3 more tokens) and one without it (9 tokens) to one batch needs 7 + 9 slots: a sliding layer kept
    only the last 15, and dropped real K/V of the first row (|Δ| up to 0.76)."""
    model = tiny_model(arch, sliding_window=16)
    reqs = [
        EncodeRequest([60, 61], [*PREFIX, 80, 81, 82]),
        EncodeRequest([62], [*PREFIX, 80, 81, 82]),
        EncodeRequest([63, 64], [90, 91, 92, 93, 94, 95, 96, 97, 98]),
        EncodeRequest([65], [90, 91, 92, 93, 94, 95, 96, 97, 98]),
    ]
    assert max(r.span for r in reqs) < 16 - 1
    plain = FactEncoder(model, batch_size=1, share_contexts=False).encode(reqs)
    encoder = FactEncoder(model, batch_size=4)
    encoder.cache_prefix(PREFIX)
    assert_same_facts(plain, encoder.encode(reqs), 2e-5, 1e-4, arch)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_in_bfloat16_a_shared_context_stays_within_rounding_of_a_plain_pass(arch: str) -> None:
    """A wrong position or mask moves K/V by O(1); bfloat16 rounding by about 1e-2."""
    model = tiny_model(arch).to(torch.bfloat16)
    plain = FactEncoder(model, batch_size=4, share_contexts=False).encode(requests())
    encoder = FactEncoder(model, batch_size=4)
    encoder.cache_prefix(PREFIX)
    assert_same_facts(plain, encoder.encode(requests()), 5e-2, 5e-2, arch)


def test_each_shared_context_is_prefilled_once() -> None:
    reqs = requests()
    facts = sum(len(r.fact_ids) for r in reqs)
    encoder = FactEncoder(tiny_model("llama"), batch_size=2)
    encoder.cache_prefix(PREFIX)
    encoder.encode(reqs)
    # the prefix once; then TURNS on the prefix once (three facts), OTHER_TURNS on the prefix once (two), TURNS
    # without the prefix once (two); the lone [PREFIX, 89] prefills its one turn; the prefix-only facts nothing more
    assert encoder.tokens_prefilled == len(PREFIX) + len(TURNS) + len(OTHER_TURNS) + len(TURNS) + 1 + facts


def test_without_sharing_every_request_prefills_its_context() -> None:
    reqs = requests()
    encoder = FactEncoder(tiny_model("llama"), batch_size=2, share_contexts=False)
    encoder.cache_prefix(PREFIX)
    encoder.encode(reqs)
    after_prefix = sum(len(r.context_ids) - len(PREFIX) for r in reqs if list(r.context_ids[:7]) == PREFIX)
    alone = sum(len(r.context_ids) for r in reqs if list(r.context_ids[:7]) != PREFIX)
    assert encoder.tokens_prefilled == len(PREFIX) + after_prefix + alone + sum(len(r.fact_ids) for r in reqs)


def test_a_context_one_request_has_is_not_prefilled_apart() -> None:
    """Sharing pays only when two requests share: a lone context stays in its fact's own pass."""
    encoder = FactEncoder(tiny_model("llama"))
    encoder.cache_prefix(PREFIX)
    encoder.encode([EncodeRequest([60, 61], [*PREFIX, *TURNS]), EncodeRequest([62], [*PREFIX, *OTHER_TURNS])])
    assert encoder.tokens_prefilled == len(PREFIX) + len(TURNS) + 2 + len(OTHER_TURNS) + 1


def test_a_context_is_shared_within_one_call_only() -> None:
    """Nothing is kept between calls but the system prefix: a context two calls share is prefilled by each."""
    encoder = FactEncoder(tiny_model("llama"))
    encoder.cache_prefix(PREFIX)
    shared = [EncodeRequest([60, 61], [*PREFIX, *TURNS]), EncodeRequest([62], [*PREFIX, *TURNS])]
    encoder.encode(shared)
    encoder.encode(shared)
    assert encoder.tokens_prefilled == len(PREFIX) + 2 * (len(TURNS) + 3)


_MODELS = {
    "llama": lambda: tiny_model("llama"),
    "gemma3, window 10": lambda: tiny_model("gemma3", sliding_window=10),
    "mistral, window 7": lambda: tiny_model("mistral", sliding_window=7),
}
_BUILT: dict[str, torch.nn.Module] = {}


def _model(name: str) -> torch.nn.Module:
    if name not in _BUILT:
        _BUILT[name] = _MODELS[name]()
    return _BUILT[name]


_tokens = st.lists(st.integers(3, 250), max_size=12)
_contexts = st.one_of(
    _tokens.map(lambda body: (*PREFIX, *body)),  # after the prefix
    _tokens.map(tuple),  # without it (or empty)
    _tokens.map(lambda body: (*PREFIX[:3], *body)),  # starting with part of it
)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(
    name=st.sampled_from(sorted(_MODELS)),
    pool=st.lists(_contexts, min_size=1, max_size=4),
    picks=st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(3, 250), min_size=1, max_size=6), st.sampled_from([0, 3])),
        min_size=1,
        max_size=9,
    ),
    batch_size=st.sampled_from([1, 3, 16]),
)
def test_any_mix_of_requests_equals_a_plain_pass(
    name: str, pool: list[tuple[int, ...]], picks: list[tuple[int, list[int], int]], batch_size: int
) -> None:
    """Contexts drawn from a small pool (so some are shared), after the prefix, without it or after part of it, with
    and without a position gap, on a full-attention model and two with windows shorter than many spans: every fact's
    K/V equal its own unbatched plain pass."""
    reqs = [EncodeRequest(fact, pool[i % len(pool)], gap) for i, fact, gap in picks]
    model = _model(name)
    plain = FactEncoder(model, batch_size=1, share_contexts=False).encode(reqs)
    encoder = FactEncoder(model, batch_size=batch_size)
    encoder.cache_prefix(PREFIX)
    assert_same_facts(plain, encoder.encode(reqs), 2e-5, 1e-4, name)
