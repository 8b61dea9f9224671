"""Loading a Hugging Face causal LM and its tokenizer, as every engine does (the vLLM engine for its fact encoder)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from inferscale.config import EngineConfig, inferscale_home
from inferscale.devices import checked_device
from inferscale.engines.hf.attention import resolve_attention
from inferscale.engines.hf.dtype import choose_dtype, probe_cpu_dtype
from inferscale.errors import ConfigError
from inferscale.model_load import loading_model
from inferscale.models import resolve_llm_path

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""``EngineConfig.dtype`` names → torch dtypes."""

log = logging.getLogger(__name__)

DTYPE_RECORD = "dtype-choice.json"
"""The file under the InferScale home where ``dtype="auto"`` records its timed CPU choice, so it never flips."""


def resolve_device(device: str) -> torch.device:
    """The engine's device: ``"auto"`` → CUDA when available, else CPU; anything else as given
    (:func:`inferscale.devices.checked_device`).

    Raises:
        ConfigError: for a CUDA device this machine does not have.
    """
    return torch.device(checked_device(device, "engine.device"))


def load_causal_lm(config: EngineConfig, home: Path | None) -> tuple[str, Any, Any]:
    """Load ``config.model`` (the embedded SmolLM2 when ``None``) with its tokenizer, in ``config.dtype`` (``"auto"``
    resolved by :func:`~inferscale.engines.hf.dtype.choose_dtype`, timed on the loaded model by
    :func:`~inferscale.engines.hf.dtype.probe_cpu_dtype` where the CPU may run bfloat16 natively, and recorded in
    ``<home>/`` :data:`DTYPE_RECORD`), with
    ``config.attn_implementation``, on ``config.device``, in eval mode.

    Returns:
        ``(path, model, tokenizer)``: the resolved model folder or name, the causal LM and its tokenizer (typed
        ``Any``: any ``AutoModelForCausalLM`` / ``AutoTokenizer`` class).

    Raises:
        ModelNotAvailableError: when the configured folder does not exist, or the embedded default is not installed.
        ConfigError: when the folder or name holds no model that can be loaded
            (:func:`inferscale.model_load.loading_model`), or the model cannot run ``config.attn_implementation``
            (Gemma 2 and other models without SDPA support: ``"eager"`` runs them).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = resolve_llm_path(config.model, home)
    device = resolve_device(config.device)
    with loading_model("engine.model", path):
        tokenizer = AutoTokenizer.from_pretrained(path)
        stored = str(AutoConfig.from_pretrained(path).dtype or "").removeprefix("torch.") or None
    choice = choose_dtype(config.dtype, device, stored)

    def load(dtype: str) -> Any:
        attention = resolve_attention(config.attn_implementation)
        with loading_model("engine.model", path, weights=True):  # any other ValueError: no model that can be loaded
            try:
                return AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation=attention)
            except ValueError as exc:
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                if config.attn_implementation == "eager" or "attention" not in reason:
                    raise
                raise ConfigError(  # the config was read: the model lacks this attention implementation
                    f"engine.model {path!r} cannot run engine.attn_implementation={config.attn_implementation!r} "
                    f"({reason}); set engine.attn_implementation='eager'"
                ) from exc

    model = load(choice.dtype)
    if choice.probe:
        provisional, choice = choice.dtype, probe_cpu_dtype(model, (home or inferscale_home()) / DTYPE_RECORD)
        if choice.dtype != provisional:
            # Loaded again rather than cast: buffers a model computes at init (rotary frequencies) depend on the
            # dtype it is loaded in, and must equal those of a model loaded in the final dtype directly.
            model = load(choice.dtype)
    if config.dtype == "auto":
        log.info("dtype auto: %s (%s)", choice.dtype, choice.reason)
    model = model.to(device)
    return path, model.eval(), tokenizer
