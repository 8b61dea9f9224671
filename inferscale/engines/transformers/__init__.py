"""Hugging Face transformers engine."""

from inferscale.engines.transformers.engine import TransformersEngine, resolve_device
from inferscale.engines.transformers.prompt import PromptLayout

__all__ = ["PromptLayout", "TransformersEngine", "resolve_device"]
