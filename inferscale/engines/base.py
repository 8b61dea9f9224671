"""The interface every chat engine implements (transformers here, vLLM beside it).

An engine owns the model. It lays out prompts, encodes facts into pre-RoPE K/V, and generates either with the
memory segment's K/V injected into its KV cache (``mode="kv"``) or with the memory tokens prefilled like any other
prompt tokens (``mode="prompt"``). Both modes see exactly the same token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.kv.serving import ServingSettings


@dataclass(frozen=True, slots=True)
class Generation:
    """One generated answer with its engine-side timings.

    Attributes:
        text: decoded answer (special tokens removed).
        token_ids: generated ids.
        kv_assembly_ms: rotating and writing the facts' K/V into the cache (ms); 0 in prompt mode.
        prefill_ms: prefill up to the first token's logits and its argmax (ms).
        total_ms: assembly + prefill + decode (ms).
        prompt_tokens: tokens of the whole prompt, memory included.
        memory_tokens: tokens of the memory segment.
        recomputed_tokens: extra tokens prefilled in KV mode by the serving remedies (recomputed memory tokens, a
            selective policy's probe of the query); 0 in prompt mode and for pure injection.
    """

    text: str
    token_ids: list[int]
    kv_assembly_ms: float
    prefill_ms: float
    total_ms: float
    prompt_tokens: int
    memory_tokens: int
    recomputed_tokens: int = 0


class Engine(Protocol):
    """What :class:`inferscale.MemoryClient` needs from an engine."""

    serving: ServingSettings
    """The request-time fidelity remedies the engine applies in KV mode (:mod:`inferscale.kv.serving`)."""

    @property
    def fingerprint(self) -> str:
        """:func:`inferscale.kv.fingerprint.model_fingerprint` of the loaded model (32 hex characters)."""
        ...

    def system_prefix_ids(self) -> list[int]:
        """Token ids of the chat template up to the memory segment (the system prefix)."""
        ...

    def fact_token_ids(self, text: str) -> list[int]:
        """Token ids a fact occupies in the memory segment."""
        ...

    def context_token_ids(self, turns: Sequence[str]) -> list[int]:
        """Token ids of preceding conversation turns, used as encoding context (context-window encoding)."""
        ...

    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Encode facts (batched) into pre-RoPE K/V on the engine's device."""
        ...

    def generate_kv(
        self, query: str, facts: Sequence[FactKV], max_new_tokens: int, cache_scope: str = ""
    ) -> Generation:
        """Answer ``query`` with the facts' K/V injected after the system prefix.

        ``cache_scope`` names the tenant (:meth:`inferscale.scope.Scope.key`); engines with a shared prefix cache
        (vLLM) salt injected blocks with it so that no other tenant can hit them. In-process engines ignore it.
        """
        ...

    def generate_prompt(
        self, query: str, fact_ids: Sequence[Sequence[int]], max_new_tokens: int, cache_scope: str = ""
    ) -> Generation:
        """Answer ``query`` with the same fact tokens prefilled as ordinary prompt tokens (the baseline).

        ``cache_scope`` names the tenant; engines with a shared prefix cache salt the request with it, so tenants
        never share cached blocks. In-process engines ignore it.
        """
        ...
