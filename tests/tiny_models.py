"""Tiny randomly initialised decoder models built from configs (no download), for exactness tests."""

from __future__ import annotations

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


def tiny_config(arch: str, **overrides: Any) -> Any:
    """A small config of ``arch`` in {llama, llama31, mistral, qwen2, qwen3}."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kwargs: dict[str, Any] = {**TINY, **overrides}
    if arch == "llama":
        return LlamaConfig(**kwargs)
    if arch == "llama31":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        }
        return LlamaConfig(**kwargs, rope_parameters=rope)
    if arch == "mistral":
        return MistralConfig(**kwargs, sliding_window=None)
    if arch == "qwen2":
        return Qwen2Config(**kwargs)
    if arch == "qwen3":
        return Qwen3Config(**kwargs, head_dim=16)
    raise ValueError(arch)


def tiny_model(arch: str, seed: int = 0, attn: str = "eager", **overrides: Any) -> Any:
    """A float32 causal LM of ``arch`` with seeded random weights, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(arch, **overrides)
    config._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attn)
    if arch == "qwen2":  # make the q/k/v biases matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    return model.eval()


def block_diagonal_logits(
    model: Any, prefix: list[int], facts: list[list[int]], query: list[int], fact_context: bool = False
) -> torch.Tensor:
    """Reference: one forward pass over prefix + facts + query with a block-structured float mask.

    The prefix is causal; each fact attends only to itself (causally), plus the prefix when ``fact_context``;
    the query attends to everything before it. Positions are 0..N-1. Returns last-token logits ``[vocab]``.
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
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]),
            attention_mask=mask[None, None],
            position_ids=torch.arange(n)[None],
            use_cache=False,
        )
    return out.logits[0, -1].float()
