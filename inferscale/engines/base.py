"""The interface every chat engine implements (transformers here, vLLM beside it).

An engine owns the model. It lays out prompts, encodes facts into pre-RoPE K/V, and generates either with the
memory segment's K/V injected into its KV cache (``mode="kv"``) or with the memory tokens prefilled like any other
prompt tokens (``mode="prompt"``). Both modes see exactly the same token ids.

:class:`Engine` is the whole contract the rest of InferScale uses (client, async client, bench, eval): callers never
probe an engine with ``hasattr``/``getattr``. Both engines implement all of it: mypy checks it at the end of each
engine's module, where a ``_conforms_to_engine`` function returns the engine as an :class:`Engine`.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self

import torch

from inferscale.conversation import ChatMessage, SamplingSettings
from inferscale.errors import ContextLengthError
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
        finish_reason: ``"stop"`` (an end-of-turn token or a stop string) or ``"length"`` (the token budget ran
            out), as OpenAI's API names them.
    """

    text: str
    token_ids: list[int]
    kv_assembly_ms: float
    prefill_ms: float
    total_ms: float
    prompt_tokens: int
    memory_tokens: int
    recomputed_tokens: int = 0
    finish_reason: Literal["stop", "length"] = "stop"


@dataclass(frozen=True, slots=True)
class TextDelta:
    """One step of a streamed answer: the token(s) just generated and the text they made stable.

    Attributes:
        text: new answer text (may be ``""`` while a multi-byte character, trailing whitespace or a possible stop
            string is held back; see :mod:`inferscale.engines.hf.answer_text`).
        token_ids: the generated ids this step added.
    """

    text: str
    token_ids: list[int]


StreamEvent = TextDelta | Generation
"""What a streaming call yields: :class:`TextDelta` per step, then one :class:`Generation` (the whole answer, whose
``text`` is the deltas joined)."""


def drain(events: Iterator[StreamEvent]) -> Generation:
    """The :class:`Generation` that ends an engine's stream (the deltas are dropped): what ``generate_*`` return.

    Raises:
        RuntimeError: when the stream ends without one (an engine bug).
    """
    for event in events:
        if isinstance(event, Generation):
            return event
    raise RuntimeError("an engine stream ended without its Generation")


Conversation = str | Sequence[ChatMessage]
"""A one-turn query, or messages checked by :func:`inferscale.conversation.check_messages`."""


def check_prompt_fits(prefix_tokens: int, memory_tokens: int, rest_tokens: int, context_tokens: int) -> None:
    """Refuse a request whose system prefix + memory segment + conversation and answer budget (all in tokens) pass
    the model's context window of ``context_tokens``: it could only fail slowly, or answer from positions the model
    never saw. Both engines check this before they prefill; the clients check it before they load or encode any
    memory's K/V.

    Raises:
        inferscale.errors.ContextLengthError: naming each part's token count, and what would make it fit: fewer
            memories only when there are memories in it, and ``max_new_tokens`` as the budget (an OpenAI route
            renames it: :meth:`~inferscale.errors.ContextLengthError.for_budget`).
    """
    total = prefix_tokens + memory_tokens + rest_tokens
    if total > context_tokens:
        raise ContextLengthError.of(
            f"the prompt needs {total} tokens (system prefix {prefix_tokens}, memories {memory_tokens}, "
            f"conversation and answer budget {rest_tokens}) but the model's maximum context length is "
            f"{context_tokens} tokens",
            memory_tokens,
        )


class Engine(Protocol):
    """What the clients, the benchmarks and the evaluation need from an engine.

    Lifecycle: construction does no I/O. :meth:`load` loads the model (once); every other method loads it on first
    use if :meth:`load` was not called, except the token-layout methods and :attr:`max_context_tokens`, which read
    the tokenizer and config alone until the model is loaded (:mod:`inferscale.engines.hf.layout_only`).
    :meth:`close` releases what the engine loaded; a later call loads again.
    An engine serialises its own requests (it is safe to call from several threads, one request at a time runs).
    """

    serving: ServingSettings
    """The request-time fidelity remedies the engine applies in KV mode (:mod:`inferscale.kv.serving`)."""

    # ---------------------------------------------------------------- lifecycle
    def load(self) -> Self:
        """Load the model, tokenizer and whatever the engine prepares once (system prefix K/V, fingerprint; vLLM:
        start its engine). Idempotent: calls after the first return at once. Callers call it before timing a
        request, so model loading is never part of a request's latency.

        Returns:
            ``self``.

        Raises:
            inferscale.errors.ModelNotAvailableError: when the configured model cannot be found.
            inferscale.errors.ConfigError: when the model's tokenizer has no usable chat template.
        """
        ...

    def load_encoder(self) -> Self:
        """Load what encoding facts needs (:meth:`encode_facts`, :attr:`fingerprint`) and no more: the transformers
        engine loads its model (as :meth:`load`); the vLLM engine loads its transformers copy of the weights without
        starting vLLM, so that a process that only adds memories never starts vLLM's engine processes. Idempotent.

        Returns:
            ``self``.

        Raises:
            the errors of :meth:`load`.
        """
        ...

    def close(self) -> None:
        """Release what the engine loaded or started: the model it loaded itself (a model passed in by the caller
        stays the caller's), the vLLM engine and its processes, temporary folders. Idempotent; never raises for an
        engine that was never loaded. Using the engine afterwards loads it again."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forget every cached prompt prefix, for cold-cache measurements. A no-op for engines that keep nothing
        between requests (transformers).

        Raises:
            RuntimeError: when the engine refuses (vLLM with requests running), so a "cold" run would run warm.
        """
        ...

    # ---------------------------------------------------------------- the model
    @property
    def device(self) -> torch.device:
        """Where encoded fact K/V live (:meth:`encode_facts` returns tensors there); the KV store's device tier
        uses it. Loads the model."""
        ...

    @property
    def model(self) -> Any:
        """The Hugging Face causal LM (``transformers.PreTrainedModel``; for vLLM, the transformers copy of the
        served weights that encodes facts). Typed ``Any``: any ``AutoModelForCausalLM`` class. Used to build the
        local JSON generator for fact extraction and for FLOP counts. Loads the model."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (``transformers.PreTrainedTokenizerBase``; typed ``Any`` like
        :attr:`model`). Loads the model."""
        ...

    @property
    def model_lock(self) -> threading.RLock:
        """The reentrant lock the engine holds around each forward pass of :attr:`model` (encoding and generation).
        Anything else that runs :attr:`model` (the local JSON generator of fact extraction) holds it too: the fact
        encoder hooks the model's layers during its passes, and the background K/V encoder runs them on a thread of
        its own. Loads nothing."""
        ...

    @property
    def max_context_tokens(self) -> int:
        """The longest prompt plus answer the engine serves (tokens): the model's window
        (:func:`~inferscale.engines.hf.layout_only.max_positions`: ``max_position_embeddings``, capped where a
        ``longrope`` RoPE stops being static), or vLLM's ``max_model_len`` when it is lower. Loads no weights:
        before the model is loaded, the model's config is read alone (kept, with the tokenizer, for the
        token-layout methods below)."""
        ...

    @property
    def encodes_chains(self) -> bool:
        """Whether facts can be encoded on the stored K/V of the facts before them (``kv.chain_block``): not on a
        model with sliding-window layers, whose cache the chained encoding cannot lay out. Loads no weights, as
        :attr:`max_context_tokens`."""
        ...

    @property
    def fingerprint(self) -> str:
        """:func:`inferscale.kv.fingerprint.model_fingerprint` of the loaded model (32 hex characters). Loads the
        model."""
        ...

    # ---------------------------------------------------------------- token layout
    # These need the tokenizer alone: before the model is loaded they load the tokenizer (once) and no weights, so
    # ``add`` can measure a memory's encoding span without a model load (:mod:`inferscale.encoding_layout`).
    def system_prefix_ids(self) -> list[int]:
        """Token ids of the chat template up to the memory segment (the system prefix), P tokens."""
        ...

    def fact_token_ids(self, text: str) -> list[int]:
        """Token ids a fact occupies in the memory segment (its line ``"- {text}\\n"``), as plain text: a control
        token's text in it is not read as that token (:mod:`inferscale.control_tokens`)."""
        ...

    def context_token_ids(self, turns: Sequence[str]) -> list[int]:
        """Token ids of preceding conversation turns, used as encoding context (context-window encoding); plain
        text, as :meth:`fact_token_ids`."""
        ...

    def control_token_texts(self) -> frozenset[str]:
        """The texts the tokenizer reads as its control tokens (``"<|im_end|>"``, ...): in a fact, a turn or a
        message they are tokenised as plain text, and a fact holding one is keyed apart
        (:func:`inferscale.kv.fingerprint.encoding_key`)."""
        ...

    def query_token_ids(self, query: str) -> list[int]:
        """Token ids after the memory segment: the end of the system turn, the user's query, the assistant
        header."""
        ...

    def conversation_token_ids(self, conversation: Conversation) -> list[int]:
        """Token ids after the memory segment for a conversation: the end of the system turn, the caller's system
        text and turns in the chat template, the assistant header. Both modes prefill exactly these.

        Raises:
            inferscale.errors.InvalidInputError: when the chat template refuses the conversation.
        """
        ...

    # ---------------------------------------------------------------- encoding
    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        """Encode facts (batched) into pre-RoPE K/V, one :class:`FactKV` per request in order: keys and values
        ``[n_layers, n_kv_heads, n_tokens, head_dim]`` in the model's dtype on :attr:`device`.

        Raises:
            inferscale.errors.InvalidInputError: when a fact with its context and position gap reaches past the
                model's context window.
        """
        ...

    # ---------------------------------------------------------------- generation
    def generate_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Generation:
        """Answer the conversation with the facts' K/V injected after the system prefix, in ``facts`` order; the
        conversation tokens (:meth:`conversation_token_ids`) are prefilled after the memory segment.

        Args:
            conversation: the user's question, or the caller's messages.
            facts: pre-RoPE fact K/V (from :meth:`encode_facts` or the KV store).
            max_new_tokens: answer budget (tokens); 0 prefills only (TTFT).
            cache_scope: the tenant (:meth:`inferscale.scope.Scope.key`); engines with a shared prefix cache (vLLM)
                salt injected blocks with it so that no other tenant can hit them. In-process engines ignore it.
            serving: the remedies for this request instead of :attr:`serving`.
            sampling: how tokens are chosen (default greedy) and the stop strings.

        Raises:
            inferscale.errors.ContextLengthError: when prefix + memories + conversation + ``max_new_tokens`` exceed
                the model's context.
            inferscale.errors.InvalidInputError: when the chat template refuses the conversation.
            inferscale.errors.UnsupportedModelError: when a request-time remedy is asked of a model it cannot
                serve exactly (transformers).
            inferscale.errors.ConfigError: when ``serving`` asks for a remedy the engine cannot apply (vLLM).
        """
        ...

    def generate_prompt(
        self,
        conversation: Conversation,
        fact_ids: Sequence[Sequence[int]],
        max_new_tokens: int,
        cache_scope: str = "",
        sampling: SamplingSettings | None = None,
    ) -> Generation:
        """Answer the conversation with the same fact tokens prefilled as ordinary prompt tokens (the baseline).

        Args:
            fact_ids: each fact's token ids (:meth:`fact_token_ids`), in layout order.
            cache_scope: the tenant; engines with a shared prefix cache salt the request with it, so tenants never
                share cached blocks. In-process engines ignore it.
            the rest: as :meth:`generate_kv`.

        Raises:
            inferscale.errors.ContextLengthError: when the prompt and ``max_new_tokens`` exceed the model's context.
            inferscale.errors.InvalidInputError: when the chat template refuses the conversation.
        """
        ...

    def stream_kv(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV],
        max_new_tokens: int,
        cache_scope: str = "",
        serving: ServingSettings | None = None,
        sampling: SamplingSettings | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """:meth:`generate_kv`, streamed: a :class:`TextDelta` per decoding step, then the :class:`Generation`.
        Several streams may be open at once; each forward pass holds the engine, nothing is held between two
        events. Closing the iterator early ends the request. Errors of :meth:`generate_kv` are
        raised before the first event."""
        ...

    def stream_prompt(
        self,
        conversation: Conversation,
        fact_ids: Sequence[Sequence[int]],
        max_new_tokens: int,
        cache_scope: str = "",
        sampling: SamplingSettings | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """:meth:`generate_prompt`, streamed like :meth:`stream_kv`."""
        ...

    def first_token_logits(
        self,
        conversation: Conversation,
        facts: Sequence[FactKV] | None,
        fact_ids: Sequence[Sequence[int]] | None = None,
        serving: ServingSettings | None = None,
    ) -> torch.Tensor:
        """Next-token logits ``[vocab]`` float32 after the prompt, without decoding: KV mode when ``facts`` is
        given (served with ``serving``, default :attr:`serving`, as :meth:`generate_kv` serves them), else prompt
        mode over ``fact_ids``. One prefill per call. An engine may return them shifted by a constant (the vLLM
        engine returns log-probabilities), which softmax, KL and argmax ignore. Used by the fidelity metrics
        (first-token KL between the two modes) and exactness tests.

        Raises:
            inferscale.errors.UnsupportedModelError: when the engine cannot return full-vocabulary logits;
                callers that can do without the metric catch it.
            the errors of :meth:`generate_kv`.
        """
        ...
