"""A model's prompt layout and context window from its tokenizer and config files alone, without its weights.

``add`` measures the positions each new memory's K/V encoding will need (:mod:`inferscale.encoding_layout`) before
anything is stored, and must not load the model to do it: a background or lazy ``add`` costs the SQL write and the
embedding, not a model load. An engine that is not loaded yet answers its token-layout questions
(:class:`~inferscale.engines.hf.prompt.LayoutTokensMixin`) and its context window from a :class:`LayoutOnly`, loaded
by a :class:`LayoutOnlyCache` the first time one is asked and kept until the engine loads its model; from then on
the engine's own tokenizer answers (read from the same files, so it gives the same ids).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale.config import EngineConfig
from inferscale.engines.hf.prompt import PromptLayout
from inferscale.errors import UnsupportedModelError
from inferscale.kv import max_static_position
from inferscale.kv.encode import sliding_window
from inferscale.model_load import loading_model
from inferscale.models import resolve_llm_path


def max_positions(model_config: Any) -> int:
    """The context window of a transformers model config for InferScale's engines (tokens): its
    ``max_position_embeddings``, capped at the last position its RoPE is static for (``longrope``'s
    ``original_max_position_embeddings``, :func:`~inferscale.kv.max_static_position`). Past that bound transformers
    rotates every position of a longer sequence with the long factors, so neither a stored key nor a cached system
    prefix would match what the model computes for that request. The engines read it here from the loaded model's
    config and from the config file alone, so the two never differ.

    Args:
        model_config: a ``transformers.PretrainedConfig`` (typed ``Any``: each model class has its own).
    """
    declared = int(model_config.max_position_embeddings)
    try:
        static = max_static_position(model_config)
    except UnsupportedModelError:
        return declared  # a RoPE that is never static is refused where keys are rotated (RopeTable.from_model)
    return declared if static is None else min(declared, static)


@dataclass(frozen=True, slots=True)
class LayoutOnly:
    """What an engine's token layout needs, without the weights.

    Attributes:
        layout: the prompt layout over the model's tokenizer and the engine's system prompt.
        max_positions: the model's context window (tokens), :func:`max_positions` of its config.
        sliding_window: :func:`~inferscale.kv.encode.sliding_window` of its config (tokens), or ``None``.
    """

    layout: PromptLayout
    max_positions: int
    sliding_window: int | None = None


FILE_CACHE_SIZE = 8
"""How many ``(model folder or hub name, system prompt)`` pairs :func:`load_layout_only` keeps for the process."""


def load_layout_only(config: EngineConfig, system_prompt: str, home: Path | None) -> LayoutOnly:
    """``config.model``'s tokenizer and config (the embedded SmolLM2 when ``None``), not its weights, laid out after
    ``system_prompt``. Read once per process for each model and system prompt (the last :data:`FILE_CACHE_SIZE`
    pairs are kept), so clients built one after another on the same model do not read its tokenizer again (about
    0.2 s each); the tokenizer is only ever read (encoding a text changes no state of it).

    The embedded model's folder is converted on its first use on a machine, as a model load would (once, tens of
    seconds: :func:`~inferscale.models.defaults.default_llm_path`); a later model load reads the same folder.

    Raises:
        ModelNotAvailableError: when the configured model cannot be found.
        ConfigError: when its tokenizer has no usable chat template.
    """
    return _layout_from_files(resolve_llm_path(config.model, home), system_prompt)


@functools.lru_cache(maxsize=FILE_CACHE_SIZE)
def _layout_from_files(path: str, system_prompt: str) -> LayoutOnly:
    """:func:`load_layout_only` for a resolved model folder or hub name (an error is not kept: the next call reads
    again)."""
    from transformers import AutoConfig, AutoTokenizer

    with loading_model("engine.model", path):
        tokenizer = AutoTokenizer.from_pretrained(path)
        model_config = AutoConfig.from_pretrained(path)
    return LayoutOnly(PromptLayout(tokenizer, system_prompt), max_positions(model_config), sliding_window(model_config))


class LayoutOnlyCache:
    """One :class:`LayoutOnly`, loaded by ``load`` when first asked for and kept until :meth:`drop`. Thread-safe:
    concurrent first calls load it once. Holds a lock of its own (never the engine's, which a forward pass holds).

    Args:
        load: builds the :class:`LayoutOnly` (from files, or from a tokenizer and model the caller passed in).
    """

    def __init__(self, load: Callable[[], LayoutOnly]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._value: LayoutOnly | None = None

    def get(self) -> LayoutOnly:
        """The layout and context window, loaded on the first call.

        Raises:
            the errors of ``load`` (nothing is kept then; the next call tries again).
        """
        with self._lock:
            if self._value is None:
                self._value = self._load()
            return self._value

    def drop(self) -> None:
        """Forget what was loaded (the engine loaded its model: its own tokenizer answers from now on)."""
        with self._lock:
            self._value = None
