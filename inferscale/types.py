"""Result types returned by the public API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from inferscale.storage import MemoryRecord

ChatMode = Literal["kv", "prompt"]


@dataclass(frozen=True, slots=True)
class Timings:
    """Wall-clock timings of one ``chat`` call, in milliseconds.

    Attributes:
        retrieval_ms: embedding the query and the scoped FAISS top-k search.
        kv_assembly_ms: loading (or encoding, on a miss) the k facts' KV, rotating keys to their positions and
            building the cache, plus the serve-time remedies that run before the query (the recompute of chosen
            memory tokens, ``selective:r``'s probe; 0 in ``prompt`` mode).
        prefill_ms: the engine's prefill up to the first token's logits: the query in ``kv`` mode (with the
            memory's last n tokens under ``kv.recompute="tail:n"``, prefilled in the same pass); facts + query in
            ``prompt`` mode.
        ttft_ms: time to first token: wall-clock time from the start of the call until the engine produced the
            first token (retrieval, K/V load, assembly, prefill, choosing the token, and everything in between).
            A streamed call yields that token's text at once.
        total_ms: the whole call, decode included.
    """

    retrieval_ms: float
    kv_assembly_ms: float
    prefill_ms: float
    ttft_ms: float
    total_ms: float


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The answer of ``MemoryClient.chat``.

    Attributes:
        answer: the generated text.
        memory_ids: ids of the retrieved memories, in the order they were laid out.
        memories: their texts, same order.
        mode: ``"kv"`` (KV injection) or ``"prompt"`` (facts pasted into the prompt).
        timings: see :class:`Timings`.
        prompt_tokens: tokens in the whole prompt, memory segment included (tokens).
        memory_tokens: tokens in the memory segment (tokens).
        generated_tokens: tokens decoded (tokens).
        recomputed_tokens: memory tokens prefilled again at serve time by ``kv.recompute`` (and a selective
            policy's probe of the query), on top of the query (tokens); 0 in ``prompt`` mode and for pure
            injection.
        finish_reason: ``"stop"`` (the model ended its turn or a stop string was reached) or ``"length"`` (the
            ``max_new_tokens`` budget ran out), as OpenAI's API names them.
        extra: room for engine-specific reports (empty today).
    """

    answer: str
    memory_ids: list[str]
    memories: list[str]
    mode: ChatMode
    timings: Timings
    prompt_tokens: int
    memory_tokens: int
    generated_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)
    finish_reason: Literal["stop", "length"] = "stop"
    recomputed_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ChatChunk:
    """One piece of a streamed ``chat`` answer (``chat(..., stream=True)``).

    Attributes:
        delta: new answer text; never ends inside a character. The deltas joined are the answer.
        result: ``None`` on every chunk but the last, whose ``delta`` is ``""`` and whose result carries the whole
            answer, the memory ids used, the token counts, the finish reason and the timings (ms; ``ttft_ms`` as
            in :class:`Timings`: when the engine produced the first token, whose text is yielded at once unless
            it is half a character, whitespace or the start of a possible stop string).
    """

    delta: str
    result: ChatResult | None = None


@dataclass(frozen=True, slots=True)
class RecalledMemory:
    """One memory found by ``MemoryClient.recall``.

    Attributes:
        record: the stored memory (id, text, scope ids, metadata, context, vector id, timestamps).
        score: its cosine similarity to the query (higher is closer; at most 1).
    """

    record: MemoryRecord
    score: float
