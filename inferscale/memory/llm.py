"""LLM backends that answer a chat with JSON matching a schema, for fact extraction.

- :class:`TransformersJSONGenerator` runs a local causal LM with greedy decoding whose every step is masked by
  an xgrammar matcher compiled from the JSON schema, so even a 135M model can only emit schema-valid JSON.
- :class:`OpenAIJSONGenerator` calls any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI, a vLLM
  server, ...) with ``response_format={"type": "json_schema", ...}``.

Both satisfy the :class:`JSONGenerator` protocol, which is all :class:`~inferscale.memory.FactExtractor` needs.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import httpx

from inferscale.errors import ConfigError, ExtractionError, InvalidInputError

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
            The answer as text. Constrained backends return valid JSON; others may wrap it in prose.

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


def close_truncated_json(text: str) -> str:
    """Cut JSON text that stopped mid-way back to its last complete element and close what is still open.

    ``'{"facts": ["a", "b'`` becomes ``'{"facts": ["a"]}'``: the half-written element is dropped, never
    completed, so no invented text is returned. Complete JSON is returned unchanged.

    Args:
        text: the prefix of a JSON value, as produced by a grammar-constrained decoder that ran out of tokens.

    Returns:
        Valid JSON text, or ``""`` when ``text`` never opened an object or array.
    """
    closers: list[str] = []
    cut, cut_closers = 0, ""
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            closers.append("]" if char == "[" else "}")
            cut, cut_closers = index + 1, "".join(reversed(closers))
        elif char in "]}":
            if closers:
                closers.pop()
            cut, cut_closers = index + 1, "".join(reversed(closers))
            if not closers:
                return text[:cut]
        elif char == ",":
            # The element (or key/value pair) before a top-level-of-container comma is complete.
            cut, cut_closers = index, "".join(reversed(closers))
    return text[:cut].rstrip() + cut_closers


# ---------------------------------------------------------------------------------------------------- local model


class TransformersJSONGenerator:
    """Greedy decoding of a local transformers causal LM, constrained by xgrammar to a JSON schema.

    At every step the grammar matcher fills a vocabulary bitmask of the tokens that keep the output a valid
    prefix of schema-conforming JSON; masked logits are set to -inf before the argmax. The matcher terminates
    as soon as the JSON value is complete (no end-of-sequence token is decoded). If ``max_new_tokens`` runs out
    first, the output is cut back to its last complete element and closed (see :func:`close_truncated_json`),
    so the answer is valid JSON either way (it may then miss ``required`` keys only if the budget ended before
    they were written, which needs a budget of a handful of tokens).

    Compiled grammars are cached per schema. One lock serialises compilation and decoding: the model's
    forward pass is not re-entrant-safe with a shared cache object and CPU threads are already saturated by
    one decode.

    Args:
        model: a loaded causal LM (any dtype and device); used in ``eval`` mode under ``torch.inference_mode``.
        tokenizer: its tokenizer; must have a chat template.
        compile_threads: threads xgrammar may use to compile a grammar.

    Raises:
        ConfigError: when the tokenizer has no chat template.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, compile_threads: int = 2) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"the tokenizer of {getattr(model, 'name_or_path', 'the model')!r} has no chat template; "
                "use an instruction-tuned model"
            )
        self._model = model
        self._tokenizer = tokenizer
        self._compile_threads = compile_threads
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._grammars: dict[str, xgrammar.CompiledGrammar] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, dtype: torch.dtype | None = None, device: str = "cpu"
    ) -> TransformersJSONGenerator:
        """Load a model folder (or hub name) and its tokenizer.

        Args:
            path: a local model folder, for example :func:`inferscale.models.default_llm_path`.
            dtype: weights dtype; ``None`` means ``torch.float32``.
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32).to(device).eval()
        return cls(model, tokenizer)

    def _grammar(self, schema: dict[str, Any]) -> xgrammar.CompiledGrammar:
        import xgrammar as xgr

        key = _schema_key(schema)
        grammar = self._grammars.get(key)
        if grammar is None:
            if self._compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=int(self._model.config.vocab_size)
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._compile_threads)
            try:
                # any_whitespace=False: compact JSON, no tokens wasted on (or looping in) indentation.
                grammar = self._compiler.compile_json_schema(key, any_whitespace=False)
            except (RuntimeError, ValueError) as exc:
                raise InvalidInputError(f"xgrammar cannot compile the JSON schema {key[:200]}: {exc}") from exc
            self._grammars[key] = grammar
        return grammar

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        """Greedy, grammar-constrained answer to ``messages``; see :meth:`JSONGenerator.generate_json`.

        Args:
            messages: chat turns, rendered with the tokenizer's chat template plus the generation prompt.
            schema: the JSON schema the answer must match (compiled once, then cached).
            max_new_tokens: decode budget, in tokens (>= 1).

        Returns:
            Valid JSON text matching ``schema`` (see the class notes for a budget that runs out).

        Raises:
            InvalidInputError: for ``max_new_tokens < 1`` or a schema xgrammar cannot compile.
        """
        import torch
        import xgrammar as xgr
        from transformers import DynamicCache

        if max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        with self._lock:
            grammar = self._grammar(schema)
            matcher = xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)
            bitmask = xgr.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)
            device = self._model.device
            encoded = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            step_ids = encoded["input_ids"].to(device)  # [1, n_prompt_tokens]
            cache = DynamicCache(config=self._model.config)
            generated: list[int] = []
            with torch.inference_mode():
                for _ in range(max_new_tokens):
                    out = self._model(input_ids=step_ids, cache=cache, use_cache=True, logits_to_keep=1)
                    logits = out.logits[:, -1, :].float()  # [1, vocab]
                    matcher.fill_next_token_bitmask(bitmask)
                    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device))
                    token = int(logits.argmax(dim=-1).item())
                    if not matcher.accept_token(token):  # cannot happen with a correct mask
                        raise ExtractionError(f"the grammar rejected token {token} it had allowed")
                    generated.append(token)
                    if matcher.is_terminated():
                        break
                    step_ids = torch.tensor([[token]], device=device)
        text = self._tokenizer.decode(generated, skip_special_tokens=True)
        if not matcher.is_terminated():
            log.warning("JSON answer hit max_new_tokens=%d; closing it at its last complete element", max_new_tokens)
            text = close_truncated_json(text)
        return text


# ---------------------------------------------------------------------------------------------------- HTTP endpoint


class OpenAIJSONGenerator:
    """An OpenAI-compatible chat endpoint asked for JSON with ``response_format={"type": "json_schema"}``.

    Connection failures (refused, DNS, connect timeout) are retried by the HTTP transport (``retries`` times);
    HTTP errors and read timeouts are not retried and raise :class:`~inferscale.errors.ExtractionError`.
    Decoding is greedy (``temperature=0``).

    Args:
        base_url: the server root, with or without the ``/v1`` suffix (``http://localhost:8000`` and
            ``http://localhost:8000/v1`` both post to ``http://localhost:8000/v1/chat/completions``).
        api_key: sent as ``Authorization: Bearer <api_key>``; ``None`` sends no header (local servers).
        model: the model name the server expects.
        timeout_s: per-request timeout, in seconds.
        retries: connection retries of the transport.
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
                status, a body that is not a chat completion, or an answer without text content (for example
                a refusal).
        """
        if max_new_tokens < 1:
            raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        body = self.request_body(messages, schema, max_new_tokens)
        try:
            response = self._client.post(self.url, json=body)
            response.raise_for_status()
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
        if not isinstance(content, str) or not content.strip():
            refusal = choice.get("message", {}).get("refusal")
            raise ExtractionError(
                f"{self.url} returned no text content (finish_reason={choice.get('finish_reason')!r}, "
                f"refusal={refusal!r})"
            )
        return content
