"""The LLM judge J of ``inferscale eval locomo``: 0/1 correctness of an answer against the gold answer.

The judge is a chat model behind an OpenAI-compatible endpoint, called through the project's one HTTP client,
:class:`inferscale.memory.llm.OpenAIJSONGenerator` (connection retries, timeouts, greedy decoding), with its
answer constrained to the JSON schema of :class:`JudgeVerdict` and parsed by that model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from inferscale.errors import ExtractionError
from inferscale.memory.llm import OpenAIJSONGenerator

if TYPE_CHECKING:
    import httpx

__all__ = ["JUDGE_SYSTEM", "JudgeVerdict", "LLMJudge"]

log = logging.getLogger(__name__)

JUDGE_SYSTEM = (
    "You grade answers to questions about a long conversation. You are given the question, the gold answer and "
    "a generated answer. Be generous: the generated answer is CORRECT when it refers to the same thing as the "
    "gold answer, even if it is longer, worded differently or gives a date in another format; it is WRONG when "
    "it misses the gold answer, contradicts it or says the information is not available. Reply with JSON only: "
    '{"label": "CORRECT"} or {"label": "WRONG"}.'
)
"""The judge's system prompt."""

JUDGE_MAX_TOKENS = 32
"""Answer budget of the judge (tokens); ``{"label": "CORRECT"}`` takes about eight."""


class JudgeVerdict(BaseModel):
    """The judge's answer; its ``model_json_schema()`` is the schema the endpoint is asked to follow."""

    model_config = ConfigDict(extra="forbid", title="judge_verdict")

    label: Literal["CORRECT", "WRONG"]

    @property
    def score(self) -> int:
        """1 for ``CORRECT``, 0 for ``WRONG``."""
        return int(self.label == "CORRECT")


class LLMJudge:
    """A 0/1 LLM judge over an OpenAI-compatible ``/chat/completions`` endpoint (temperature 0, JSON schema).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (with or without ``/v1``).
        model: the judge model name.
        api_key: sent as a bearer token when given.
        timeout_s: per-request timeout (s).
        transport: an httpx transport instead of a real one (tests pass ``httpx.MockTransport``).

    Raises:
        ConfigError: for a ``base_url`` that is not an http(s) URL, an empty ``model`` or a ``timeout_s <= 0``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._llm = OpenAIJSONGenerator(base_url, api_key, model, timeout_s, transport=transport)
        self._schema = JudgeVerdict.model_json_schema()

    def verdict(self, question: str, gold: str, answer: str) -> JudgeVerdict | None:
        """The judge's verdict on ``answer``, or ``None`` when the endpoint fails or the reply does not parse
        (logged as a warning)."""
        user = f"Question: {question}\nGold answer: {gold}\nGenerated answer: {answer}"
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]
        try:
            text = self._llm.generate_json(messages, self._schema, JUDGE_MAX_TOKENS)
        except ExtractionError as exc:  # connection, HTTP status or a body that is not a chat completion
            log.warning("LLM judge failed: %s", exc)
            return None
        try:
            return JudgeVerdict.model_validate_json(text)
        except ValidationError:
            log.warning("LLM judge reply is not a verdict: %r", text[:200])
            return None

    def score(self, question: str, gold: str, answer: str) -> int | None:
        """1 (correct), 0 (wrong), or ``None`` when the endpoint fails or the reply cannot be read (logged)."""
        verdict = self.verdict(question, gold, answer)
        return None if verdict is None else verdict.score

    def close(self) -> None:
        """Close the HTTP client."""
        self._llm.close()

    def __enter__(self) -> LLMJudge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
