"""The names of the formats fact K/V are kept in at rest, shared by the settings (``kv.storage_format`` in
:mod:`inferscale.config`) and the KV core that implements them (:mod:`inferscale.kv.quantization`): one definition,
below both layers."""

from __future__ import annotations

from typing import Literal

StorageFormat = Literal["model", "float8_e4m3", "int8"]
"""How fact K/V are stored: ``"model"``, in the model's dtype; ``"float8_e4m3"`` or ``"int8"``, in 8 bits with
scales, and for int8 offsets (:mod:`inferscale.kv.quantization`)."""

__all__ = ["StorageFormat"]
