"""A config that keeps a ``sliding_window`` its layers never use: Qwen2 with ``use_sliding_window`` and a
``max_window_layers`` that covers every layer (transformers' ``layer_types`` are all ``"full_attention"``). A tester
found chains (``kv.chain_block``) and the request-time remedies refused on it as a sliding-window model; its layers
attend in full, so the encoder lays its cache out as a full-attention model's and nothing is refused."""

from __future__ import annotations

import pytest
from test_encode_shared_context import PREFIX, assert_same_facts, requests
from tiny_models import TINY, byte_chat_tokenizer, tiny_config, tiny_model

from inferscale.config import EngineConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.engines.transformers.remedies import check_remedies
from inferscale.errors import UnsupportedModelError
from inferscale.kv.encode import FactEncoder, sliding_window
from inferscale.kv.serving import ServingSettings

LAYERS = TINY["num_hidden_layers"]


def _qwen2(max_window_layers: int) -> dict[str, object]:
    return {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": max_window_layers}


def test_a_window_no_layer_uses_is_no_window() -> None:
    unused = tiny_config("qwen2", **_qwen2(LAYERS))
    assert unused.sliding_window == 6 and set(unused.layer_types) == {"full_attention"}
    assert sliding_window(unused) is None
    used = tiny_config("qwen2", **_qwen2(1))  # layers 1 and 2 slide
    assert "sliding_attention" in used.layer_types and sliding_window(used) == 6
    assert sliding_window(tiny_config("mistral", sliding_window=7)) == 7  # no layer_types: the window holds
    assert sliding_window(tiny_config("gemma3", sliding_window=10)) == 10


def test_remedies_are_refused_only_where_a_layer_slides() -> None:
    remedies = ServingSettings(0.8)
    check_remedies(tiny_config("qwen2", **_qwen2(LAYERS)), remedies)
    with pytest.raises(UnsupportedModelError, match="sliding-window attention"):
        check_remedies(tiny_config("qwen2", **_qwen2(1)), remedies)


def test_its_facts_on_a_shared_context_equal_a_plain_pass() -> None:
    """The encoder now batches it as a full-attention model (contexts longer than the unused 6-token window): the
    K/V equal the unbatched plain pass's, as for every supported family."""
    model = tiny_model("qwen2", **_qwen2(LAYERS))
    plain = FactEncoder(model, batch_size=4, share_contexts=False).encode(requests())
    encoder = FactEncoder(model, batch_size=4)
    encoder.cache_prefix(PREFIX)
    assert_same_facts(plain, encoder.encode(requests()), 2e-5, 1e-4, "qwen2, unused window")


@pytest.mark.parametrize(("max_window_layers", "chains"), [(LAYERS, True), (1, False)])
def test_the_engine_encodes_chains_unless_a_layer_slides(max_window_layers: int, chains: bool) -> None:
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        "Memories:\n",
        model=tiny_model("qwen2", **_qwen2(max_window_layers)),
        tokenizer=byte_chat_tokenizer(),
    )
    assert engine.encodes_chains is chains
