"""What a stored fact's K/V depend on, as hashes: the model fingerprint and the encoding key.

A fact's K/V are a function of the model (its weights, its whole config, its dtype), of the tokenizer that turned
the text into ids, and of what the fact was encoded after (the system prefix's token ids, its context turns, its
position gap). :func:`model_fingerprint` hashes the first group once per loaded model; :func:`encoding_key` hashes
the second per fact, from text the caller already holds (no tokenising at request time). A change to any of them
gives another key, so a stored entry becomes a miss and the fact is encoded again; nothing stale is injected.

Left out on purpose (same computation, rounding only): the device, the attention kernel and the encoding batch
size. The serving remedies (attention scale, temperature, recompute) act on the cache at request time and never on
stored K/V.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from inferscale.kv.quantization import CURRENT_STORAGE_TAGS, encoding_setting, tag_of_encoding_key
from inferscale.kv.rope_config import rope_parameters


def _tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 hex of a tensor's values as stored (its bytes, row-major), whatever its device and dtype; a tensor
    off the CPU is copied to the host first."""
    flat = tensor.detach().reshape(-1).contiguous().view(torch.uint8)
    return hashlib.sha256(flat.cpu().numpy().data).hexdigest()


def weights_digest(model: nn.Module) -> str:
    """sha256 over every entry of the state dict: its name, shape, dtype and the sha256 of its bytes.

    Exact and independent of the device: any changed bit of any weight changes the digest, and the same weights on
    CPU or CUDA give the same one. The tensors are hashed by a pool of threads (hashlib releases the GIL): about
    0.3 s of CPU for SmolLM2-135M in float32, where two float64 reductions per tensor (this function before) took
    about 5 s; a model on a GPU is copied to the host one tensor per thread at a time.
    """
    entries = list(model.state_dict().items())
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(_tensor_sha256, [param for _, param in entries]))
    h = hashlib.sha256()
    for (name, param), digest in zip(entries, digests, strict=True):
        h.update(f"{name}|{tuple(param.shape)}|{param.dtype}|{digest}\n".encode())
    return h.hexdigest()


# Config fields that never change a fact's K/V: where or by which library version the model was saved, and what a
# forward pass returns (its outputs, not the K/V it computes). The attention kernel (``_attn_implementation``,
# not in ``to_dict()``) is left out too: eager, SDPA and ours compute the same attention, rounded differently, like
# the device; a speed setting must not invalidate the store.
_UNRELATED_CONFIG_FIELDS = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "_commit_hash",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
    }
)

# Tokenizer settings read besides its pipeline: how special tokens are added and which ids pad, begin and end.
_TOKENIZER_SETTINGS = (
    "add_bos_token",
    "add_eos_token",
    "split_special_tokens",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def _sha256(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def config_digest(config: Any) -> str:
    """sha256 of a transformers model config: every field of ``config.to_dict()`` (rope settings, norms' epsilon,
    head layout, activation, ...) less those that never change K/V (save path, library version, output switches).

    Args:
        config: a ``transformers.PretrainedConfig`` (read duck-typed: ``to_dict()``).
    """
    return _sha256({k: v for k, v in config.to_dict().items() if k not in _UNRELATED_CONFIG_FIELDS})


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of the whole tokenizer: its class, its pipeline (a fast tokenizer's ``tokenizer.json``: normaliser,
    pre-tokeniser, model with vocabulary and merges, post-processor, added tokens; else its vocabulary), its special
    tokens, its special-token settings and its chat template.

    Args:
        tokenizer: a Hugging Face tokenizer (read duck-typed; absent attributes count as ``None``).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    special = list(map(str, getattr(tokenizer, "all_special_tokens", ())))
    return _sha256(
        {
            "class": type(tokenizer).__name__,
            "pipeline": backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items()),
            "special": sorted(special),
            "settings": {name: getattr(tokenizer, name, None) for name in _TOKENIZER_SETTINGS},
            "chat_template": getattr(tokenizer, "chat_template", None),
        }
    )


def model_fingerprint(model: nn.Module, tokenizer: Any, model_id: str) -> str:
    """A short hex id of everything about the model that a fact's K/V depend on: the model id, the weights, the
    dtype, the whole config (rope parameters included) and the whole tokenizer. Computed once per loaded model
    (one pass over the weights).

    Args:
        model: the loaded transformers model.
        tokenizer: its tokenizer.
        model_id: the folder or hub name the model was loaded from.

    Returns:
        32 hex characters.
    """
    dtype = str(next(model.parameters()).dtype)
    payload = {
        "model_id": model_id,
        "weights": weights_digest(model),
        "dtype": dtype,
        "config": config_digest(model.config),
        "rope": rope_parameters(model.config),
        "tokenizer": tokenizer_digest(tokenizer),
    }
    return _sha256(payload)[:32]


ENCODING_FORMAT = "v3"
"""Leads every :func:`encoding_key`. Raise it when the fact or context layout (the lines they are tokenised as)
changes: keys of an older format never match again, and their entries can be pruned
(:meth:`inferscale.kv.store.TieredKVStore.prune`)."""


def token_ids_digest(token_ids: Sequence[int]) -> str:
    """sha256 hex of a token id sequence (e.g. the system prefix, hashed once per engine)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()


def encoding_key(
    prefix_digest: str | None,
    turns: Sequence[str],
    context_window: int,
    bucket: int,
    storage_format: str = "model",
    chain: tuple[int, int] | None = None,
    control_text: bool = False,
) -> str:
    """The encoding part of a fact's KV key: what the fact was encoded after and where, and how its K/V are stored,
    beside its text (the key's text hash) and the model (its fingerprint).

    Args:
        prefix_digest: :func:`token_ids_digest` of the system prefix the fact was encoded after, or ``None`` when it
            was encoded without it (``encode_after_system_prefix=False``).
        turns: the context turns it was encoded after, oldest first (the record's last ``context_window``; a chained
            fact's whole context: its anchor's turns and its block's earlier texts).
        context_window: w, the configured number of context turns.
        bucket: the position bucket (tokens after the prefix; 0 for none).
        storage_format: ``kv.storage_format`` (:mod:`inferscale.kv.quantization`): an 8-bit format adds its name
            and scale layout (:func:`inferscale.kv.quantization.encoding_setting`), so entries of two formats never
            share a key; ``"model"`` adds nothing (keys written before 8-bit storage stay valid).
        chain: ``(chain_window, chain_from)`` of a fact encoded on the stored K/V of the memories before it in its
            block (:mod:`inferscale.chains`), or ``None``; adds ``;chain=<window>@<from>``.
        control_text: whether the fact's text or a text it was encoded after holds the text of one of the model's
            control tokens, which is tokenised as plain text (:mod:`inferscale.control_tokens`); adds
            ``;controls=plain``. Entries of such a fact encoded before that rule read the text as control tokens:
            without this part in their key they never match again, while every other key stays as it was.

    Returns:
        e.g. ``"v3;w=5;prefix=system;gap=0;<32 hex>"``, or
        ``"v3;w=5;prefix=system;gap=0;kv=int8:k=channel,v=token,offset;<32 hex>"`` (at most about 120 characters):
        the readable settings, then a digest over all of them and the turns' texts.

    Raises:
        ConfigError: for an unknown ``storage_format``.
    """
    prefix = "system" if prefix_digest is not None else "none"
    readable = f"{ENCODING_FORMAT};w={context_window};prefix={prefix};gap={bucket}{encoding_setting(storage_format)}"
    if chain is not None:
        readable += f";chain={chain[0]}@{chain[1]}"
    if control_text:
        readable += ";controls=plain"
    digest = _sha256({"settings": readable, "prefix": prefix_digest, "turns": list(turns)})[:32]
    return f"{readable};{digest}"


def depends_on_context(key: str) -> bool:
    """Whether the K/V an encoding key names depend on the memory's stored context: ``False`` only for an encoding
    after no context turn and on no chain (``w=0`` and no ``chain=`` part, as :func:`encoding_key` writes them, e.g.
    a memory's context-free encoding), whose K/V are a function of its text, the system prefix and the model alone,
    so a change to the stored context leaves them valid."""
    parts = key.split(";")
    return "w=0" not in parts or any(part.startswith("chain=") for part in parts)


def survives_recontext(key: str, context_left: bool) -> bool:
    """Whether a memory's entry under the encoding key ``key`` is kept when a deleted or re-worded text leaves its
    stored context (the scrub: :mod:`inferscale.storage.contexts`), ``context_left`` saying whether the context
    still holds an entry. Only an entry that does not :func:`depend on the context <depends_on_context>` is kept,
    and only while the context holds an entry: once it is empty the memory is served after no turn under its
    in-context key (one encoding, one entry), so its context-free copy would not be looked up again (with
    ``kv.context_window=0`` the two keys are one, which is then encoded again). One rule for the ``kv_entries``
    rows and the files, so they never drift apart."""
    return context_left and not depends_on_context(key)


def is_current_encoding(key: str) -> bool:
    """Whether an encoding key was written in this version's :data:`ENCODING_FORMAT` and, for 8-bit K/V, in a
    storage layout this version writes (an ``int8`` entry from before int8 became affine never matches again)."""
    return key.startswith(f"{ENCODING_FORMAT};") and tag_of_encoding_key(key) in CURRENT_STORAGE_TAGS
