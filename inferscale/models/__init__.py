"""Resolution of model folders: the embedded defaults (no hub access) and user-configured paths or names."""

from inferscale.models.defaults import default_embedder_path, default_llm_path, resolve_llm_path

__all__ = ["default_embedder_path", "default_llm_path", "resolve_llm_path"]
