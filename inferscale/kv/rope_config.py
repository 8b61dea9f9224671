"""Parsing a transformers model config into RoPE parameters: which rope type each layer type uses, and whether
re-rotating stored keys is exact for it (static frequencies) or refused (``dynamic`` NTK, unverified types).

Configs are read duck-typed (``Any``): every transformers ``PretrainedConfig`` subclass names its own attributes,
and older ones keep the rope settings in ``rope_scaling`` instead of ``rope_parameters``.
"""

from __future__ import annotations

from typing import Any

from inferscale.errors import UnsupportedModelError

# Rope types whose frequencies do not depend on the sequence length: re-rotation is exact for them.
STATIC_ROPE_TYPES: frozenset[str] = frozenset({"default", "linear", "llama3", "yarn"})
# ``longrope`` is static below ``original_max_position_embeddings`` only (see :func:`max_static_position`).
SUPPORTED_ROPE_TYPES: frozenset[str] = STATIC_ROPE_TYPES | {"longrope"}


def rope_parameters(config: Any) -> dict[str, Any]:
    """The rope settings of a transformers config as one dict (``rope_parameters``, or legacy ``rope_scaling``).

    For models with per-layer-type rotary parameters (Gemma 3) the dict is nested: ``{layer_type: {...}}``; see
    :func:`rope_parameter_sets`.
    """
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def rope_parameter_sets(config: Any) -> dict[str | None, dict[str, Any]]:
    """The rope settings per layer type: ``{layer_type: params}`` when nested (Gemma 3), else ``{None: params}``.

    Layer types whose settings are ``None`` (transformers skips them) are left out.
    """
    params = rope_parameters(config)
    values = list(params.values())
    if values and any(isinstance(v, dict) for v in values) and all(v is None or isinstance(v, dict) for v in values):
        return {str(kind): dict(v) for kind, v in params.items() if v is not None}
    return {None: params}


def _rope_type(params: dict[str, Any]) -> str:
    return str(params.get("rope_type", params.get("type", "default")))


def max_static_position(config: Any) -> int | None:
    """The largest position count for which the model's RoPE is static, or ``None`` when it always is.

    For per-layer-type settings (Gemma 3) every layer type must be supported; the bound is the smallest one.

    Returns:
        ``None`` for ``default``/``linear``/``llama3``/``yarn``; for ``longrope``, its
        ``original_max_position_embeddings`` (positions ``0 .. bound - 1`` use the short factors; transformers
        switches every position to the long factors once a sequence is longer than that).

    Raises:
        UnsupportedModelError: for ``dynamic`` NTK scaling (its frequencies change with the sequence length, so a
            key rotated for one request length would be silently wrong for another), and for any other rope type
            (not verified).
    """
    bound: int | None = None
    for kind, params in rope_parameter_sets(config).items():
        rope_type = _rope_type(params)
        where = "" if kind is None else f" (layer type {kind!r})"
        if rope_type in STATIC_ROPE_TYPES:
            continue
        if rope_type == "longrope":
            limit = int(
                params.get("original_max_position_embeddings")
                or getattr(config, "original_max_position_embeddings", None)
                or config.max_position_embeddings
            )
            bound = limit if bound is None else min(bound, limit)
            continue
        if "dynamic" in rope_type:
            raise UnsupportedModelError(
                f"rope_type {rope_type!r}{where} is not supported for KV re-rotation: its frequencies depend on the "
                f"sequence length, so stored keys cannot be rotated exactly. Supported: {sorted(SUPPORTED_ROPE_TYPES)}"
            )
        raise UnsupportedModelError(
            f"rope_type {rope_type!r}{where} is not supported for KV re-rotation (not verified to be a static "
            f"rotate-half RoPE). Supported: {sorted(SUPPORTED_ROPE_TYPES)}"
        )
    return bound
