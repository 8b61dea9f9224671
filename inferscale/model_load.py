"""How every model load runs: weights one load at a time in the process (:data:`MODEL_LOADS`), and with the one
translation of model loaders' errors (transformers' ``from_pretrained``, sentence-transformers) into InferScale's: a
configured source that holds no loadable model is a :class:`~inferscale.errors.ConfigError`, on every path that loads
one (the engine, its layout-only tokenizer, the embedder, the extraction LLM)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from inferscale.errors import ConfigError, InferScaleError


class _ProcessLock:
    """A reentrant lock (``with``), made again in a forked child: a fork while another thread held it would leave it
    held there for good, and the child's first load would hang."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        os.register_at_fork(after_in_child=self._made_again)

    def _made_again(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


MODEL_LOADS = _ProcessLock()
"""Held by every load of a model's weights in the process (:func:`loading_model` with ``weights=True``).
transformers' ``from_pretrained`` patches process-wide state while it builds a model (``PreTrainedModel.tie_weights``,
``torch.nn.init``'s functions) and puts back what it found when it ends: two loads at once on two threads (two
clients' first chats) put back each other's patches, so tying stayed disabled, both loads failed ("Cannot copy out of
meta tensor", ``lm_head`` missing) and so did every later load in the process. Tokenizers and configs patch nothing
and load without it: a prompt's layout never waits for a model's load."""


@contextlib.contextmanager
def loading_model(
    what: str, source: str, errors: tuple[type[Exception], ...] = (OSError, ValueError), *, weights: bool = False
) -> Iterator[None]:
    """Run a model load (``from_pretrained``, ``SentenceTransformer(...)``), turning the loaders' own errors for a
    source that holds no loadable model into :class:`~inferscale.errors.ConfigError`; one that builds a model from its
    weights (``weights=True``) holds :data:`MODEL_LOADS`.

    Args:
        what: the setting that named it, for the message (e.g. ``"engine.model"``).
        source: the folder or hub name being loaded.
        errors: the loader errors that mean the source holds no model: by default ``OSError`` (a folder without a
            ``config.json`` or weights, a hub name that cannot be fetched offline) and ``ValueError`` (an unreadable
            ``config.json``, an unknown architecture, a folder without a tokenizer). Loading the weights once the
            config was read takes ``(OSError,)``: its ``ValueError`` means an option the model does not support (an
            attention implementation), which is not this.
        weights: whether the load builds a model from its weights (not a tokenizer or a config alone).

    Raises:
        ConfigError: for ``errors``. InferScale's own errors raised inside the block (a ``ConfigError`` is a
            ``ValueError``: the weights load's own, naming the attention setting) pass through as they are.
    """
    try:
        with MODEL_LOADS if weights else contextlib.nullcontext():
            yield
    except InferScaleError:
        raise  # already says what is wrong: wrapping it would blame a folder that holds a loadable model
    except errors as exc:
        reason = str(exc).strip().splitlines()
        raise ConfigError(
            f"{what} {source!r} holds no model that can be loaded ({reason[0] if reason else type(exc).__name__}); "
            "point it at a Hugging Face model folder (config.json, tokenizer and weights) or at a model already in "
            "the local Hugging Face cache"
        ) from exc


__all__ = ["MODEL_LOADS", "loading_model"]
