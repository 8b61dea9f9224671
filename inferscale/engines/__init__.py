"""Chat engines. Each implements :class:`inferscale.engines.base.Engine`."""

from inferscale.engines.base import Engine, Generation

__all__ = ["Engine", "Generation"]
