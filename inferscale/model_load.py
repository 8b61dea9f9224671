"""The one translation of model loaders' errors (transformers' ``from_pretrained``, sentence-transformers) into
InferScale's: a configured source that holds no loadable model is a :class:`~inferscale.errors.ConfigError`, on every
path that loads one (the engine, its layout-only tokenizer, the embedder, the extraction LLM)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from inferscale.errors import ConfigError


@contextmanager
def loading_model(
    what: str, source: str, errors: tuple[type[Exception], ...] = (OSError, ValueError)
) -> Iterator[None]:
    """Run a model load (``from_pretrained``, ``SentenceTransformer(...)``), turning the loaders' own errors for a
    source that holds no loadable model into :class:`~inferscale.errors.ConfigError`.

    Args:
        what: the setting that named it, for the message (e.g. ``"engine.model"``).
        source: the folder or hub name being loaded.
        errors: the loader errors that mean the source holds no model: by default ``OSError`` (a folder without a
            ``config.json`` or weights, a hub name that cannot be fetched offline) and ``ValueError`` (an unreadable
            ``config.json``, an unknown architecture, a folder without a tokenizer). Loading the weights once the
            config was read takes ``(OSError,)``: its ``ValueError`` means an option the model does not support (an
            attention implementation), which is not this.

    Raises:
        ConfigError: for ``errors``.
    """
    try:
        yield
    except errors as exc:
        reason = str(exc).strip().splitlines()
        raise ConfigError(
            f"{what} {source!r} holds no model that can be loaded ({reason[0] if reason else type(exc).__name__}); "
            "point it at a Hugging Face model folder (config.json, tokenizer and weights) or at a model already in "
            "the local Hugging Face cache"
        ) from exc


__all__ = ["loading_model"]
