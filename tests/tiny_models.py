"""Tiny randomly initialised decoder models built from configs (no download), for exactness tests.

Every model has hidden size 64, 4 query heads and 2 KV heads (head_dim 16 unless stated), 3 layers, float32
weights. Supported architectures and rope types (re-rotation and injection must be exact):

- ``llama`` (default RoPE), ``llama31`` (Llama-3.1-style ``llama3`` scaling), ``llama_linear``, ``llama_yarn``
  (attention factor 0.1·ln 4 + 1 ≈ 1.139), ``llama_longrope`` (static below 256 positions; attention factor
  sqrt(1 + ln 8 / ln 256) ≈ 1.173);
- ``mistral``; ``qwen2`` (q/k/v biases); ``qwen3`` (``k_norm`` before RoPE);
- ``stablelm`` (partial rotary, 8 of 16 channels; per-head ``k_layernorm`` on ``[B, n_kv, T, hd]``; q/k/v biases);
- ``phi`` (partial rotary, 8 of 16 channels; ``k_layernorm``);
- ``gemma3`` (sliding layers: base 10k; global layer: base 1M with linear factor 8; scaled embeddings;
  ``k_norm`` on ``[B, n_kv, T, hd]``; sliding window 512, wider than every test sequence).

Refused on purpose: ``cohere`` (interleaved cos/sin table), ``glm`` (rotate-half-looking table, interleaved
attention code), ``phi3`` (fused ``qkv_proj``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

TINY = dict(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)

SUPPORTED_ARCHS: tuple[str, ...] = (
    "llama",
    "llama31",
    "llama_linear",
    "llama_yarn",
    "llama_longrope",
    "mistral",
    "qwen2",
    "qwen3",
    "stablelm",
    "phi",
    "gemma3",
)
REFUSED_ARCHS: tuple[str, ...] = ("cohere", "glm", "phi3")

LONGROPE_ORIGINAL_MAX = 256
"""``original_max_position_embeddings`` of ``llama_longrope``: positions 0..255 are static."""

_LLAMA_ROPES: dict[str, dict[str, Any]] = {
    "llama31": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
    "llama_linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama_yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "llama_longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.02, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0],
        "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 10.0, 12.0],
        "factor": 8.0,  # max_position_embeddings / original_max_position_embeddings
        "original_max_position_embeddings": LONGROPE_ORIGINAL_MAX,
    },
}


def tiny_config(arch: str, **overrides: Any) -> Any:
    """A small config of ``arch`` (one of :data:`SUPPORTED_ARCHS` or :data:`REFUSED_ARCHS`)."""
    import transformers as tf

    kwargs: dict[str, Any] = {**TINY, **overrides}
    if arch == "llama":
        return tf.LlamaConfig(**kwargs)
    if arch in _LLAMA_ROPES:
        return tf.LlamaConfig(**{"rope_parameters": dict(_LLAMA_ROPES[arch]), **kwargs})
    if arch == "mistral":
        return tf.MistralConfig(**{"sliding_window": None, **kwargs})
    if arch == "qwen2":
        return tf.Qwen2Config(**kwargs)
    if arch == "qwen3":
        return tf.Qwen3Config(**{"head_dim": 16, **kwargs})
    if arch == "stablelm":
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        return tf.StableLmConfig(**{"rope_parameters": rope, "qk_layernorm": True, "use_qkv_bias": True, **kwargs})
    if arch == "phi":
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        return tf.PhiConfig(**{"rope_parameters": rope, "qk_layernorm": True, **kwargs})
    if arch == "gemma3":
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        }
        return tf.Gemma3TextConfig(
            **{
                "head_dim": 16,
                "query_pre_attn_scalar": 16,
                "sliding_window": 512,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                "rope_parameters": rope,
                **kwargs,
            }
        )
    if arch == "cohere":
        return tf.CohereConfig(**{"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **kwargs})
    if arch == "glm":
        return tf.GlmConfig(**{"head_dim": 16, "pad_token_id": 0, "eos_token_id": 2, **kwargs})
    if arch == "phi3":
        return tf.Phi3Config(**{"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, **kwargs})
    raise ValueError(arch)


_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")


def tiny_model(arch: str, seed: int = 0, attn: str = "eager", **overrides: Any) -> Any:
    """A float32 causal LM of ``arch`` with seeded random weights, in eval mode.

    Biases of q/k/v projections (qwen2, stablelm, phi) and the weights of query/key norms are randomised so that
    they matter: a capture that skipped them would fail the exactness tests.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)
    with torch.no_grad():
        for layer in getattr(model.model, "layers", []):
            attention = layer.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                bias = getattr(getattr(attention, name, None), "bias", None)
                if bias is not None:
                    bias.normal_(0, 0.5)
            for name in _NORMS:
                norm = getattr(attention, name, None)
                if norm is not None:
                    for param in norm.parameters():
                        param.add_(torch.randn_like(param) * 0.3)
    return model.eval()


def block_diagonal_logits(
    model: Any,
    prefix: list[int],
    facts: list[list[int]],
    query: list[int],
    fact_context: bool = False,
    memory_bias: float = 0.0,
) -> torch.Tensor:
    """Reference: one forward pass over prefix + facts + query with a block-structured float mask.

    The prefix is causal; each fact attends only to itself (causally), plus the prefix when ``fact_context``;
    the query attends to everything before it, with ``memory_bias`` added to its logits on the fact columns (the
    memory attention scale, log s). Positions are 0..N-1. Returns last-token logits ``[vocab]``.
    A 4-D mask is used as given by every layer type (also Gemma 3's sliding layers), so models with a sliding
    window must have it wider than the sequence.
    """
    ids = prefix + [t for f in facts for t in f] + query
    n = len(ids)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    p = len(prefix)
    allowed[:p, :p] = True
    start = p
    for f in facts:
        end = start + len(f)
        allowed[start:end, start:end] = True
        if fact_context:
            allowed[start:end, :p] = True
        start = end
    allowed[start:, :] = True
    allowed &= causal
    mask = torch.zeros(n, n, dtype=torch.float32)
    mask[start:, p:start] = memory_bias
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]),
            attention_mask=mask[None, None],
            position_ids=torch.arange(n)[None],
            use_cache=False,
        )
    return out.logits[0, -1].float()


CHATML_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""A template that renders every message in place, system ones included (like ChatML)."""

ONE_SYSTEM_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system message not first') }}{% endif %}"
    "{% if loop.index0 > 0 and m['role'] != 'system' and (m['role'] == 'user') != (loop.index0 % 2 == 1) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""A template like Gemma's or Mistral's: one leading system message, then user and assistant turns alternating."""


LAST_TURN_SYSTEM_TEMPLATE = (
    "{% set system = messages[0]['content'] if messages[0]['role'] == 'system' else none %}"
    "{% set turns = messages[1:] if system is not none else messages %}"
    "{% for m in turns %}{% if m['role'] == 'user' %}"
    "{% if loop.last and system is not none %}[INST] {{ system }}\n\n{{ m['content'] }}[/INST]"
    "{% else %}[INST] {{ m['content'] }}[/INST]{% endif %}"
    "{% else %}{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
)
"""Like Mistral-7B-Instruct-v0.3's: the system message is rendered inside the last user turn."""


def byte_chat_tokenizer(template: str = CHATML_TEMPLATE) -> Any:
    """A real byte-level tokenizer for the tiny models (vocabulary 257: the 256 bytes and ``<|end|>``) with a chat
    template: every UTF-8 byte is one token, so multi-byte characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>", pad_token="<|end|>")
    tokenizer.chat_template = template
    return tokenizer


def tiny_engine(arch: str = "llama", template: str = CHATML_TEMPLATE, **kwargs: Any) -> Any:
    """A float32 :class:`~inferscale.engines.transformers.TransformersEngine` on ``tiny_model(arch)`` and
    :func:`byte_chat_tokenizer`, system prompt ``"Memories:\\n"``, loaded."""
    from inferscale.config import EngineConfig
    from inferscale.engines.transformers import TransformersEngine

    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"),
        "Memories:\n",
        model=tiny_model(arch),
        tokenizer=byte_chat_tokenizer(template),
        **kwargs,
    )
    return engine.load()


@contextlib.contextmanager
def counted_forwards(engine: Any, delay_s: float = 0.0) -> Iterator[list[int]]:
    """Count the engine's forward passes while the block runs, each slowed by ``delay_s`` seconds (so that an
    answer takes long enough to be abandoned halfway); the list grows by one per pass."""
    forwards: list[int] = []
    original = engine._forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        forwards.append(1)
        time.sleep(delay_s)
        return original(*args, **kwargs)

    engine._forward = counted
    try:
        yield forwards
    finally:
        engine._forward = original
