"""Model fingerprint: what a stored KV entry must have been encoded with to be injected.

The fingerprint covers the model id, a hash of the weights, the dtype, the rope parameters and a hash of the
tokenizer's vocabulary. Changing any of them turns every stored entry into a miss, so a fact is encoded again
rather than injected with K/V from another model.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from torch import nn

from inferscale.kv.rope_config import rope_parameters


def weights_digest(model: nn.Module) -> str:
    """sha256 over every parameter's name, shape, dtype and two float64 reductions (sum and sum of |x|·i-weights).

    One pass over the weights at memory bandwidth (no copy to the host for CUDA tensors beyond two scalars per
    tensor), so it stays cheap for multi-GB models; any single changed weight changes the digest.
    """
    h = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.state_dict().items():
            flat = param.detach().reshape(-1).to(torch.float64)
            ramp = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
            sums = torch.stack([flat.sum(), (flat * ramp).sum()]).cpu().tolist()
            h.update(f"{name}|{tuple(param.shape)}|{param.dtype}|{sums[0]!r}|{sums[1]!r}\n".encode())
    return h.hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of the tokenizer's vocabulary (token → id) and its special tokens."""
    vocab = tokenizer.get_vocab()
    payload = json.dumps(
        {"vocab": sorted(vocab.items()), "special": sorted(map(str, tokenizer.all_special_tokens))},
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def model_fingerprint(model: nn.Module, tokenizer: Any, model_id: str) -> str:
    """A short hex id of (model id, weights, dtype, rope parameters, tokenizer).

    Args:
        model: the loaded transformers model.
        tokenizer: its tokenizer.
        model_id: the folder or hub name the model was loaded from.

    Returns:
        32 hex characters.
    """
    dtype = str(next(model.parameters()).dtype)
    payload = json.dumps(
        {
            "model_id": model_id,
            "weights": weights_digest(model),
            "dtype": dtype,
            "rope": rope_parameters(model.config),
            "tokenizer": tokenizer_digest(tokenizer),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
