"""Hugging Face transformers engine."""

from inferscale.engines.transformers.engine import TransformersEngine, load_causal_lm, resolve_device
from inferscale.engines.transformers.prompt import PromptLayout

__all__ = ["PromptLayout", "TransformersEngine", "load_causal_lm", "resolve_device"]
