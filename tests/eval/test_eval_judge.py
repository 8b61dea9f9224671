"""The LoCoMo LLM judge on a fake OpenAI-compatible endpoint (httpx.MockTransport): what it posts, 0/1 scores, and
None (never an exception) when the endpoint fails or the reply is not a verdict."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from inferscale.errors import ConfigError
from inferscale.eval.judge import JUDGE_SYSTEM, JudgeVerdict, LLMJudge


def _judge(reply: Any, posted: list[dict[str, Any]] | None = None) -> LLMJudge:
    """A judge whose endpoint answers every request with ``reply``: a chat-completion content string, an
    ``httpx.Response``, or an exception to raise."""

    def handler(request: httpx.Request) -> httpx.Response:
        if posted is not None:
            posted.append({"url": str(request.url), "body": json.loads(request.content)})
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, httpx.Response):
            return reply
        return httpx.Response(200, json={"choices": [{"message": {"content": reply}, "finish_reason": "stop"}]})

    return LLMJudge("http://judge.test/v1", "judge-model", api_key="k", transport=httpx.MockTransport(handler))


def test_verdicts_score_one_and_zero_and_the_request_asks_for_the_schema() -> None:
    posted: list[dict[str, Any]] = []
    with _judge('{"label": "CORRECT"}', posted) as judge:
        assert judge.score("Where?", "Porto", "In Porto.") == 1
    assert _judge('{"label":"WRONG"}').score("Where?", "Porto", "Lisbon") == 0
    request = posted[0]
    assert request["url"] == "http://judge.test/v1/chat/completions"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["max_tokens"] == 32
    assert body["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM}
    assert body["messages"][1]["content"] == "Question: Where?\nGold answer: Porto\nGenerated answer: In Porto."
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema == JudgeVerdict.model_json_schema()
    assert schema["properties"]["label"]["enum"] == ["CORRECT", "WRONG"] and schema["additionalProperties"] is False


@pytest.mark.parametrize(
    "reply",
    [
        '{"label": "MAYBE"}',  # not one of the two labels
        "CORRECT",  # not JSON
        '{"label": "CORRECT", "why": "same city"}',  # an extra key the schema forbids
        httpx.Response(500, text="overloaded"),
        httpx.Response(200, json={"unexpected": True}),
        httpx.ConnectError("refused"),
    ],
)
def test_failures_score_none(reply: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert _judge(reply).score("Where?", "Porto", "Lisbon") is None
    assert "LLM judge" in caplog.text


def test_a_bad_endpoint_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="base_url"):
        LLMJudge("judge.test", "judge-model")
