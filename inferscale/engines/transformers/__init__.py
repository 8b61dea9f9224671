"""Hugging Face transformers engine."""

from inferscale.engines.hf import PromptLayout, load_causal_lm, resolve_device
from inferscale.engines.transformers.engine import TransformersEngine

__all__ = ["PromptLayout", "TransformersEngine", "load_causal_lm", "resolve_device"]
