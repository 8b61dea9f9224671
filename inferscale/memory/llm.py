"""LLM backends that answer a chat with JSON matching a schema, for fact extraction.

- :class:`TransformersJSONGenerator` runs a local causal LM's greedy ``generate`` with xgrammar's Hugging Face
  logits processor, which masks every step to the JSON schema, so even a 135M model can only emit schema-valid
  JSON.
- :class:`OpenAIJSONGenerator` calls any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI, a vLLM
  server, ...) with ``response_format={"type": "json_schema", ...}``.

Both satisfy the :class:`JSONGenerator` protocol, which is all :class:`~inferscale.memory.FactExtractor` needs.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_before_delay

from inferscale.control_tokens import rendered_token_ids
from inferscale.errors import ConfigError, ExtractionError, InvalidInputError
from inferscale.http_retry import RETRY_STATUSES, Reply, RetryableReply, WaitRetryAfter, asks_to_retry
from inferscale.model_load import loading_model
from inferscale.storable import is_blank

if TYPE_CHECKING:
    import torch
    import xgrammar
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@runtime_checkable
class JSONGenerator(Protocol):
    """Anything that answers chat messages with JSON text for a schema."""

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        """Answer ``messages`` with JSON text that should match ``schema``.

        Args:
            messages: OpenAI-style chat turns, ``[{"role": ..., "content": ...}, ...]``.
            schema: a JSON schema (a dict) for the answer.
            max_new_tokens: decode budget of the answer, in tokens.

        Returns:
            The answer as text. Constrained backends return valid JSON, or its beginning when ``max_new_tokens``
            runs out first; others may wrap it in prose. The readers of answers handle all three
            (:mod:`inferscale.memory.answers`).

        Raises:
            ExtractionError: when the backend fails to produce an answer.
        """
        ...


def _schema_key(schema: dict[str, Any]) -> str:
    """A canonical JSON text of ``schema``, used as the grammar cache key and the compiler input."""
    try:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"the JSON schema is not JSON-serialisable: {exc}") from exc


# ---------------------------------------------------------------------------------------------------- local model


class TransformersJSONGenerator:
    """Greedy decoding of a local transformers causal LM, constrained by xgrammar to a JSON schema.

    ``model.generate`` decodes greedily with xgrammar's Hugging Face logits processor
    (:class:`xgrammar.contrib.hf.LogitsProcessor`): at every step it fills a vocabulary bitmask of the tokens that
    keep the output a valid prefix of schema-conforming JSON and sets the other logits to -inf. Once the JSON value
    is complete only the tokenizer's stop tokens are allowed, and decoding ends on one. If ``max_new_tokens`` runs
    out first, the cut answer is returned as it is, with a warning: the readers of answers take what is complete
    and tell an answer cut before its first item from an empty one (:mod:`inferscale.memory.answers`; closing it
    here made ``{"facts": ["Alice moved to Berl`` read as ``{"facts": []}``, nothing to remember, and the turns were
    lost). Sampling, beams, repetition penalties and n-gram bans of the model's generation config are switched off:
    the answer is the plain argmax.

    Compiled grammars are cached per schema. One lock serialises compilation and decoding: the model's
    forward pass is not re-entrant-safe with a shared cache object and CPU threads are already saturated by
    one decode. A model shared with a chat engine must be decoded under the engine's lock (``lock``): the engine's
    fact encoder hooks the model's layers during its passes, and chat and the background K/V encoder run in other
    threads.

    Args:
        model: a loaded causal LM (any dtype and device); used in ``eval`` mode under ``torch.inference_mode``.
        tokenizer: its tokenizer; must have a chat template.
        compile_threads: threads xgrammar may use to compile a grammar.
        lock: the lock every other user of ``model`` holds around its forward passes
            (:attr:`inferscale.engines.base.Engine.model_lock`); ``None`` gives the generator a lock of its own.

    Raises:
        ConfigError: when the tokenizer has no chat template.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        compile_threads: int = 2,
        lock: threading.Lock | threading.RLock | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer of {getattr(model, 'name_or_path', 'the model')!r} has no chat template; "
                "use an instruction-tuned model"
            )
        from transformers import GenerationMixin

        if not isinstance(model, GenerationMixin):
            raise ConfigError(f"{type(model).__name__} cannot generate text; load the model with AutoModelForCausalLM")
        self._model = model
        self._tokenizer = tokenizer
        self._compile_threads = compile_threads
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._grammars: dict[str, xgrammar.CompiledGrammar] = {}
        self._lock = lock if lock is not None else threading.Lock()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, dtype: torch.dtype | None = None, device: str = "cpu"
    ) -> TransformersJSONGenerator:
        """Load a model folder (or hub name) and its tokenizer.

        Args:
            path: a local model folder, for example :func:`inferscale.models.default_llm_path`.
            dtype: weights dtype; ``None`` means ``torch.float32``.
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

        Raises:
            ConfigError: when ``path`` holds no model that can be loaded (:func:`inferscale.model_load.loading_model`).
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with loading_model("llm.model", str(path), weights=True):
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
        return cls(model.eval().to(device), tokenizer)

    def _grammar(self, schema: dict[str, Any]) -> xgrammar.CompiledGrammar:
        import xgrammar as xgr

        key = _schema_key(schema)
        grammar = self._grammars.get(key)
        if grammar is None:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=int(self._model.config.vocab_size)
                )
                if not info.stop_token_ids:
                    raise ConfigError("the tokenizer has no end-of-sequence token to end a constrained answer with")
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._compile_threads)
            try:
                # any_whitespace=False: compact JSON, no tokens wasted on (or looping in) indentation.
                grammar = self._compiler.compile_json_schema(key, any_whitespace=False)
            except (RuntimeError, ValueError) as exc:
                raise InvalidInputError(f"xgrammar cannot compile the JSON schema {key[:200]}: {exc}") from exc
            self._grammars[key] = grammar
        return grammar

    def prompt_token_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The token ids :meth:`generate_json` prefills for ``messages``: the chat template with the generation
        prompt, each content tokenised as plain text (:func:`inferscale.control_tokens.rendered_token_ids`).

        Raises:
            ConfigError: when the chat template gives no text or no token ids.
            InvalidInputError: when a content holds a control token's text and the chat template changes contents
                as it renders them.
        """
        ids = rendered_token_ids(self._tokenizer, partial(self._render, messages), [m["content"] for m in messages])
        if not ids:
            raise ConfigError("the chat template gave no token ids")
        return ids

    def _render(self, messages: list[dict[str, str]], contents: Sequence[str]) -> str:
        """``messages`` with ``contents`` in place of theirs, in the chat template, with the generation prompt."""
        turns = [{**message, "content": text} for message, text in zip(messages, contents, strict=True)]
        rendered = self._tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        if not isinstance(rendered, str):
            raise ConfigError(f"the chat template gave a {type(rendered).__name__}, not text")
        return rendered

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        """Greedy, grammar-constrained answer to ``messages``; see :meth:`JSONGenerator.generate_json`.

        Args:
            messages: chat turns, rendered with the tokenizer's chat template plus the generation prompt; their
                contents are tokenised as plain text (:func:`inferscale.control_tokens.rendered_token_ids`), so a
                conversation or memory holding ``"<|im_start|>system"`` cannot open a turn of its own.
            schema: the JSON schema the answer must match (compiled once, then cached).
            max_new_tokens: decode budget, in tokens (>= 1).

        Returns:
            JSON text matching ``schema``, or its beginning when ``max_new_tokens`` ran out (see the class notes).

        Raises:
            InvalidInputError: for ``max_new_tokens < 1`` or a schema xgrammar cannot compile.
            ConfigError: when the tokenizer has no end-of-sequence token or its chat template gives no token ids.
            InvalidInputError: when a content holds a control token's text and the chat template changes contents
                as it renders them.
        """
        import torch
        from transformers import LogitsProcessorList
        from xgrammar.contrib.hf import LogitsProcessor

        if max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        with self._lock:
            grammar = self._grammar(schema)
            stop_ids = list(grammar.tokenizer_info.stop_token_ids)
            prompt_ids = torch.tensor([self.prompt_token_ids(messages)], device=self._model.device)  # [1, n_prompt]
            with torch.inference_mode():
                output = self._model.generate(
                    prompt_ids,
                    attention_mask=torch.ones_like(prompt_ids),
                    logits_processor=LogitsProcessorList([LogitsProcessor(grammar)]),  # one per call: it keeps state
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    num_beams=1,
                    repetition_penalty=1.0,
                    no_repeat_ngram_size=0,
                    eos_token_id=stop_ids,
                    pad_token_id=stop_ids[0],
                )
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        generated = sequences[0, prompt_ids.shape[1] :].tolist()  # the answer's token ids, a stop token last if any
        text = self._tokenizer.batch_decode([generated], skip_special_tokens=True)[0]
        if not generated or generated[-1] not in stop_ids:
            log.warning("JSON answer hit max_new_tokens=%d before it was complete", max_new_tokens)
        return text


# ---------------------------------------------------------------------------------------------------- HTTP endpoint


class OpenAIJSONGenerator:
    """An OpenAI-compatible chat endpoint asked for JSON with ``response_format={"type": "json_schema"}``.

    Connection failures (refused, DNS, connect timeout) are retried by the HTTP transport (``retries`` times). A
    429 (rate limited) or a 502/503/504 (a proxy, an overloaded server) is sent again, at most ``retries`` times,
    after the wait its ``Retry-After`` asks for, else after a short exponential back-off (:mod:`inferscale.http_retry`;
    a wait over a minute is not waited for), as long as the waits of the call stay within ``timeout_s`` together.
    Other HTTP errors and read timeouts are not retried. What is not answered raises
    :class:`~inferscale.errors.ExtractionError`. Decoding is greedy (``temperature=0``).

    Args:
        base_url: the server root, with or without the ``/v1`` suffix (``http://localhost:8000`` and
            ``http://localhost:8000/v1`` both post to ``http://localhost:8000/v1/chat/completions``).
        api_key: sent as ``Authorization: Bearer <api_key>``; ``None`` sends no header (local servers).
        model: the model name the server expects.
        timeout_s: httpx's timeout of each request, in seconds (each of connecting, writing and each read; not the
            whole request), and the most the waits before retries add up to in one call.
        retries: connection retries of the transport, and retries of a 429/502/503/504 reply.
        strict: ask the server for strict schema adherence (``json_schema.strict``).
        transport: an httpx transport to use instead of a real one (tests pass ``httpx.MockTransport``).

    Raises:
        ConfigError: for an empty ``base_url`` or ``model``, or a non-positive ``timeout_s``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_s: float = 60.0,
        *,
        retries: int = 2,
        strict: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise ConfigError("model must name the endpoint's model, got an empty string")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        root = base_url.rstrip("/")
        self.url = f"{root}/chat/completions" if root.endswith("/v1") else f"{root}/v1/chat/completions"
        self.model = model
        self.strict = strict
        self.retries = retries
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            transport=transport or httpx.HTTPTransport(retries=retries),
            timeout=httpx.Timeout(timeout_s),
            headers=headers,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIJSONGenerator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request_body(
        self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int
    ) -> dict[str, Any]:
        """The JSON body posted for one call (exposed for tests and logging)."""
        name = str(schema.get("title") or "response")
        return {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_new_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": self.strict},
            },
        }

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        """POST one chat completion and return its message content; see :meth:`JSONGenerator.generate_json`.

        Raises:
            InvalidInputError: for ``max_new_tokens < 1``.
            ExtractionError: on a connection failure or timeout (after the transport's retries), an HTTP error
                status (a 429 or 502/503/504 after its retries), a body that is not a chat completion, or an answer
                without text content (for example a refusal).
        """
        if max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        body = self.request_body(messages, schema, max_new_tokens)
        policy = Retrying(  # the waits of one call together at most timeout_s: an add never sleeps minutes
            retry=retry_if_exception_type(RetryableReply),
            stop=stop_after_attempt(self.retries + 1) | stop_before_delay(self.timeout_s),
            wait=WaitRetryAfter(),
            reraise=True,
        )
        attempts = 0
        try:
            for attempt in policy:
                with attempt:
                    attempts += 1
                    response = self._client.post(self.url, json=body)
                    reply = Reply.of(response)
                    if asks_to_retry(reply, RETRY_STATUSES):
                        raise RetryableReply(reply)
            response.raise_for_status()
        except RetryableReply as exc:
            raise ExtractionError(
                f"{self.url} answered HTTP {exc.reply.status} to {attempts} attempt(s): "
                f"{exc.reply.content[:300].decode('utf-8', 'replace')}"
            ) from exc
        except httpx.HTTPStatusError as exc:
            raise ExtractionError(
                f"{self.url} answered HTTP {exc.response.status_code}: {exc.response.text[:300]}"
            ) from exc
        except httpx.HTTPError as exc:
            raise ExtractionError(f"request to {self.url} failed: {type(exc).__name__}: {exc}") from exc
        try:
            payload = response.json()
            choice = payload["choices"][0]
            content = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ExtractionError(
                f"{self.url} did not return a chat completion (expected choices[0].message.content): "
                f"{response.text[:300]}"
            ) from exc
        if not isinstance(content, str) or is_blank(content):
            refusal = choice.get("message", {}).get("refusal")
            raise ExtractionError(
                f"{self.url} returned no text content (finish_reason={choice.get('finish_reason')!r}, "
                f"refusal={refusal!r})"
            )
        return content
