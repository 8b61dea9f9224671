"""The Hugging Face pieces every engine shares: the prompt layout from the chat template, the stop ids, model
loading and the grouped-query SDPA kernel. Engine-neutral: imported by the transformers and the vLLM engines, it
imports neither."""

from inferscale.engines.hf.attention import SDPA_GQA, resolve_attention
from inferscale.engines.hf.loading import load_causal_lm, resolve_device
from inferscale.engines.hf.prompt import LayoutTokensMixin, PromptLayout, stop_token_ids

__all__ = [
    "SDPA_GQA",
    "LayoutTokensMixin",
    "PromptLayout",
    "load_causal_lm",
    "resolve_attention",
    "resolve_device",
    "stop_token_ids",
]
