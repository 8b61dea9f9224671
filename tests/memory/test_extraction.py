"""Fact extraction: tolerant parsing, the OpenAI-compatible backend (mocked HTTP) and the constrained local model."""

from __future__ import annotations

import json
import time
from datetime import date
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from inferscale import http_retry
from inferscale.config import LLMConfig
from inferscale.errors import ConfigError, ExtractionError, InvalidInputError
from inferscale.memory import (
    ExtractedFacts,
    Extraction,
    FactExtractor,
    JSONGenerator,
    Message,
    OpenAIJSONGenerator,
    TransformersJSONGenerator,
    build_extraction_messages,
    facts_json_schema,
    normalize_messages,
    parse_facts,
)
from inferscale.memory.answers import Reading, tolerant_json_reads
from inferscale.memory.extraction import read_facts

TODAY = date(2025, 6, 2)
CONVERSATION = [
    Message("system", "You are a travel agent."),
    Message("user", "I'm Maya and I moved to Lisbon with my husband Carlos."),
    Message("assistant", "Welcome to Lisbon!"),
    Message("user", "I'm vegetarian."),
]


class FakeGenerator:
    """Returns a fixed answer and records what it was asked."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any], int]] = []

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        self.calls.append((messages, schema, max_new_tokens))
        return self.answer


# ------------------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("answer", "facts"),
    [
        ('{"facts": ["Maya lives in Lisbon", "Maya is vegetarian"]}', ["Maya lives in Lisbon", "Maya is vegetarian"]),
        ('{"facts": []}', []),
        (
            'Sure! Here are the facts:\n```json\n{"facts": ["Maya lives in Lisbon"]}\n```\nAnything else?',
            ["Maya lives in Lisbon"],
        ),
        ('```\n{"facts": ["a fact"]}\n```', ["a fact"]),
        ('The answer is {"facts": ["Maya is vegetarian"]} as requested.', ["Maya is vegetarian"]),
        ('{"facts": ["Maya lives in Lisbon", "Maya is veg', ["Maya lives in Lisbon"]),  # truncated mid-fact
        ('```json\n{"facts": ["Carlos is Maya\'s husband", "Ma', ["Carlos is Maya's husband"]),  # unclosed fence
        ('["Maya lives in Lisbon"]', ["Maya lives in Lisbon"]),  # bare list
        ('{"facts": ["x"], "note": "extra keys are ignored"}', ["x"]),
        (
            '{"facts": ["  Maya   is vegetarian ", "", "   ", "maya is VEGETARIAN", "Carlos is Maya\'s husband"]}',
            ["Maya is vegetarian", "Carlos is Maya's husband"],
        ),
    ],
)
def test_parse_facts_is_tolerant_and_cleans(answer: str, facts: list[str]) -> None:
    assert parse_facts(answer) == facts


@pytest.mark.parametrize(
    "answer",
    ["", "I could not find any facts.", "{not json at all", '{"memories": 3}', '{"facts": [1, 2]}', '{"facts": "x"}'],
)
def test_parse_facts_raises_when_nothing_parseable(answer: str) -> None:
    with pytest.raises(ExtractionError, match="facts"):
        parse_facts(answer)


# ------------------------------------------------------------------------------------------------ extractor


def test_extractor_prompt_schema_and_budget() -> None:
    fake = FakeGenerator('{"facts": ["Maya lives in Lisbon"]}')
    assert isinstance(fake, JSONGenerator)
    extractor = FactExtractor(fake, max_new_tokens=99, max_facts=5, max_fact_chars=120)
    assert extractor.extract(CONVERSATION, today=TODAY) == Extraction(["Maya lives in Lisbon"])
    (messages, schema, budget) = fake.calls[0]
    assert budget == 99
    assert schema == facts_json_schema(5, 120)
    assert schema["properties"]["facts"]["maxItems"] == 5
    assert messages[0]["role"] == "system" and "2025-06-02" in messages[0]["content"]
    last = messages[-1]
    assert last["role"] == "user"
    assert "Maya" in last["content"] and "vegetarian" in last["content"]
    assert "travel agent" not in last["content"]  # system turns are never shown
    assert "Welcome to Lisbon" not in last["content"]  # assistant turns are off by default


def test_extractor_can_show_assistant_turns() -> None:
    fake = FakeGenerator('{"facts": []}')
    FactExtractor(fake, include_assistant=True).extract(CONVERSATION, today=TODAY)
    assert "assistant: Welcome to Lisbon!" in fake.calls[0][0][-1]["content"]


def test_extractor_never_shows_tool_results() -> None:
    fake = FakeGenerator('{"facts": []}')
    FactExtractor(fake, include_assistant=True).extract([*CONVERSATION, Message("tool", "Sunny, 24C")], today=TODAY)
    assert "Sunny" not in fake.calls[0][0][-1]["content"]  # as Mem0 leaves them out of extraction


def test_extractor_returns_empty_without_calling_the_llm_when_nothing_to_show() -> None:
    fake = FakeGenerator("garbage")
    assert FactExtractor(fake).extract([Message("system", "rules")], today=TODAY) == Extraction([])
    assert fake.calls == []


def test_extractor_asks_once_more_then_keeps_the_user_turns_on_garbage() -> None:
    fake = FakeGenerator("no JSON here")
    got = FactExtractor(fake).extract(CONVERSATION, today=TODAY)
    assert got == Extraction(["I'm Maya and I moved to Lisbon with my husband Carlos.", "I'm vegetarian."], True)
    assert len(fake.calls) == 2  # the retry shows the unusable answer and names its problem
    retry = fake.calls[1][0]
    assert retry[:-2] == fake.calls[0][0]
    assert retry[-2] == {"role": "assistant", "content": "no JSON here"}
    assert retry[-1]["role"] == "user" and 'no {"facts": [...]} JSON object' in retry[-1]["content"]
    fake = FakeGenerator("no JSON here")
    assert FactExtractor(fake, retries=0).extract(CONVERSATION, today=TODAY).verbatim
    assert len(fake.calls) == 1


def test_extractor_keeps_at_most_max_facts_of_an_answer_ignoring_the_schema(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeGenerator(json.dumps({"facts": [f"Likes colour {i}" for i in range(12)]}))
    with caplog.at_level("WARNING"):
        got = FactExtractor(fake, max_facts=5).extract(CONVERSATION, today=TODAY)
    assert got == Extraction([f"Likes colour {i}" for i in range(5)])
    assert "gave 12 facts; keeping the first 5" in caplog.text


def test_extractor_cuts_an_over_long_user_turn_it_keeps_verbatim() -> None:
    turn = " ".join(f"w{i}" for i in range(40))  # 149 characters
    got = FactExtractor(FakeGenerator("no JSON"), max_memory_chars=50).extract([Message("user", turn)], today=TODAY)
    assert got.verbatim and len(got.facts) == 4 and all(len(f) <= 50 for f in got.facts)
    assert " ".join(got.facts) == turn
    with pytest.raises(InvalidInputError, match="max_memory_chars"):
        FactExtractor(FakeGenerator("{}"), max_memory_chars=0)


def test_extractor_refuses_empty_input_and_bad_limits() -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        FactExtractor(FakeGenerator("{}")).extract([], today=TODAY)
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        FactExtractor(FakeGenerator("{}"), max_new_tokens=0)
    with pytest.raises(InvalidInputError, match="retries"):
        FactExtractor(FakeGenerator("{}"), retries=-1)


def test_facts_schema_is_strict() -> None:
    schema = facts_json_schema(5, 120)
    assert schema["title"] == "ExtractedFacts"
    assert schema["additionalProperties"] is False and schema["required"] == ["facts"]  # OpenAI strict mode
    assert schema["properties"]["facts"]["maxItems"] == 5
    assert schema["properties"]["facts"]["items"] == {"type": "string", "minLength": 1, "maxLength": 120}


def test_extracted_facts_model() -> None:
    assert ExtractedFacts.model_validate_json('{"facts": ["a"]}').facts == ["a"]


# ------------------------------------------------------------------------------------------------ OpenAI backend


def _completion(content: str | None, **message: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content, **message}}
        ],
    }


def _generator(handler: Any, base_url: str = "http://llm.local:8000") -> OpenAIJSONGenerator:
    return OpenAIJSONGenerator(base_url, "sk-test", "qwen-7b", timeout_s=5, transport=httpx.MockTransport(handler))


def test_openai_request_body_and_parsing() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=_completion('{"facts": ["Maya is vegetarian"]}'))

    extractor = FactExtractor(_generator(handler), max_new_tokens=77)
    assert extractor.extract(CONVERSATION, today=TODAY).facts == ["Maya is vegetarian"]

    request = seen[0]
    assert request.method == "POST"
    assert str(request.url) == "http://llm.local:8000/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    body = json.loads(request.content)
    assert body["model"] == "qwen-7b"
    assert body["max_tokens"] == 77
    assert body["temperature"] == 0
    assert body["messages"] == build_extraction_messages(CONVERSATION, TODAY)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "ExtractedFacts", "schema": extractor.schema, "strict": True},
    }


def test_openai_base_url_with_v1_suffix_and_fenced_answer() -> None:
    urls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return httpx.Response(200, json=_completion('```json\n{"facts": ["Carlos is Maya\'s husband"]}\n```'))

    generator = _generator(handler, base_url="https://api.example.com/v1/")
    facts = FactExtractor(generator).extract(CONVERSATION, today=TODAY).facts
    assert facts == ["Carlos is Maya's husband"]
    assert urls == ["https://api.example.com/v1/chat/completions"]


@pytest.mark.parametrize(
    ("response", "needle"),
    [
        (httpx.Response(500, text="upstream exploded"), "HTTP 500: upstream exploded"),
        (httpx.Response(401, json={"error": "bad key"}), "HTTP 401"),
        (httpx.Response(200, text="<html>not json</html>"), "did not return a chat completion"),
        (httpx.Response(200, json={"choices": []}), "did not return a chat completion"),
        (httpx.Response(200, json=_completion(None, refusal="I can't")), 'refusal="I can\'t"'),
    ],
)
def test_openai_errors_are_typed(response: httpx.Response, needle: str) -> None:
    generator = _generator(lambda request: response)
    with pytest.raises(ExtractionError, match=r"http://llm\.local:8000") as info:
        generator.generate_json([{"role": "user", "content": "x"}], facts_json_schema(8, 200), 16)
    assert needle in str(info.value)


def test_openai_transport_failure_is_an_extraction_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ExtractionError, match="ConnectError"):
        _generator(handler).generate_json([{"role": "user", "content": "x"}], {"type": "object"}, 16)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"base_url": "llm.local:8000"}, "base_url"),
        ({"model": ""}, "model"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_openai_config_errors(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"base_url": "http://x", "api_key": None, "model": "m", **kwargs}
    with pytest.raises(ConfigError, match=needle):
        OpenAIJSONGenerator(**args)


def test_openai_without_api_key_sends_no_authorization() -> None:
    headers: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers)
        return httpx.Response(200, json=_completion('{"facts": []}'))

    with OpenAIJSONGenerator("http://x", None, "m", transport=httpx.MockTransport(handler)) as generator:
        assert generator.generate_json([{"role": "user", "content": "x"}], {"type": "object"}, 8) == '{"facts": []}'
    assert "authorization" not in headers[0]


@pytest.fixture
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Back-off waits of 10 ms, doubling, with no jitter."""
    monkeypatch.setattr(http_retry, "FIRST_WAIT_S", 0.01)
    monkeypatch.setattr(http_retry, "JITTER_S", 0.0)


def _replies(*replies: httpx.Response) -> tuple[list[httpx.Request], Any]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return replies[min(len(seen), len(replies)) - 1]

    return seen, handler


@pytest.mark.usefixtures("short_waits")
def test_openai_rate_limits_and_proxy_errors_are_waited_out() -> None:
    """An extraction tester's find: a 429 with ``Retry-After`` (as OpenAI sends) failed the add with ExtractionError at
    once. Now it and a proxy's 503 are sent again, after the wait asked for (here 0 s) or a short back-off."""
    ok = httpx.Response(200, json=_completion('{"facts": ["Likes tea"]}'))
    seen, handler = _replies(httpx.Response(429, headers={"Retry-After": "0"}), httpx.Response(503), ok)
    assert (
        _generator(handler).generate_json([{"role": "user", "content": "x"}], {"title": "T"}, 8)
        == ok.json()["choices"][0]["message"]["content"]
    )
    assert len(seen) == 3 and all(request.read() == seen[0].read() for request in seen)


@pytest.mark.usefixtures("short_waits")
@pytest.mark.parametrize(
    ("reply", "attempts"),
    [
        (httpx.Response(429, headers={"Retry-After": "120"}, text="slow down"), 1),  # a wait over a minute: at once
        (httpx.Response(500, text="boom"), 1),  # the endpoint's own error: the same on every attempt
        (httpx.Response(429, text="slow down"), 3),  # the first attempt and the two retries
    ],
    ids=["retry-after-120", "500", "429-every-time"],
)
def test_openai_replies_not_waited_out_are_an_extraction_error(reply: httpx.Response, attempts: int) -> None:
    seen, handler = _replies(reply)
    with pytest.raises(ExtractionError, match=f"HTTP {reply.status_code}"):
        _generator(handler).generate_json([{"role": "user", "content": "x"}], {"title": "T"}, 8)
    assert len(seen) == attempts


@pytest.mark.usefixtures("short_waits")
def test_openai_waits_what_retry_after_asks_within_the_calls_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait before a retry is the one ``Retry-After`` asks for; the waits of one call stay within its timeout
    (a review's find: two waits of a minute each could hold an add, and a worker thread, for minutes)."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    ok = httpx.Response(200, json=_completion('{"facts": []}'))
    seen, handler = _replies(httpx.Response(429, headers={"Retry-After": "2"}), ok)
    assert _generator(handler).generate_json([{"role": "user", "content": "x"}], {"title": "T"}, 8) == '{"facts": []}'
    assert slept == [2.0] and len(seen) == 2
    seen, handler = _replies(httpx.Response(429, headers={"Retry-After": "2"}), ok)
    short = OpenAIJSONGenerator("http://x", None, "m", timeout_s=1, transport=httpx.MockTransport(handler))
    with pytest.raises(ExtractionError, match="HTTP 429"):  # a 2 s wait does not fit a 1 s timeout
        short.generate_json([{"role": "user", "content": "x"}], {"title": "T"}, 8)
    assert len(seen) == 1 and slept == [2.0]


def test_the_llm_timeout_is_a_setting() -> None:
    assert LLMConfig().timeout_s == 60.0 and LLMConfig(timeout_s=5).timeout_s == 5.0
    for bad in (0, -1.0, float("inf"), True, "5", 3601):
        with pytest.raises(ValidationError):
            LLMConfig(timeout_s=bad)


# ------------------------------------------------------------------------------------------------ local model


@pytest.mark.slow
def test_transformers_generator_always_returns_schema_valid_json(smollm2_fp32: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2_fp32
    generator = TransformersJSONGenerator(model, tokenizer)
    extractor = FactExtractor(generator, max_new_tokens=64)
    conversation = normalize_messages(
        [
            {"role": "user", "content": "My daughter Lily turns 7 on March 14."},
            {"role": "assistant", "content": "Lovely! Any plans?"},
            {"role": "user", "content": "A dinosaur party. My brother Sam is allergic to peanuts."},
        ]
    )
    prompt = build_extraction_messages(conversation, TODAY)
    started = time.perf_counter()
    parsed = ExtractedFacts.model_validate_json(generator.generate_json(prompt, extractor.schema, 64))
    assert len(parsed.facts) <= 8
    assert all(1 <= len(fact) <= 200 for fact in parsed.facts)
    # 12 tokens run out inside the first fact: the cut answer comes back as it is, and is read as cut, not as
    # {"facts": []} (a review's find: closing it here turned it into "nothing to remember", and the turns were lost)
    cut = generator.generate_json(prompt, extractor.schema, 12)
    assert cut.startswith('{"facts": ["') and not cut.rstrip().endswith("}")
    assert read_facts(cut, 200) == Reading(None, "it was cut off before its first fact was complete")
    assert len(generator._grammars) == 1  # compiled once, reused
    facts = extractor.extract(conversation, today=TODAY).facts
    assert isinstance(facts, list) and all(isinstance(fact, str) and fact for fact in facts)
    assert time.perf_counter() - started < 120  # ~10 s on an idle 2-core CPU


# ------------------------------------------------------------------------------------------------ repair


@pytest.mark.parametrize(
    ("answer", "facts", "repair"),
    [
        ('{"facts": ["a \\ud83d b"]}', ["a b"], "lone surrogate"),  # the JSON escape of a lone surrogate
        ('{"facts": ["a \ud83d b"]}', ["a b"], "lone surrogate"),  # the character itself
        ('{"facts": ["a\\udc00b", "c"]}', ["ab", "c"], "lone surrogate"),  # a lone low surrogate
        ('{"facts": ["x \\ud83d\\ude00 y"]}', ["x \U0001f600 y"], None),  # a pair is kept
        ('{"facts": ["a \\\\ud83d b"]}', ["a \\ud83d b"], None),  # an escaped backslash, not an escape
        ('{"facts": ["Door code 12\\u000034"]}', ["Door code 1234"], "NUL"),
        ('{"facts": ["Door code 12\x0034"]}', ["Door code 1234"], "NUL"),
        ('{"facts": ["Likes\x01tea"]}', ["Likes tea"], "control character"),
        ('{"facts": ["Likes\ntea"]}', ["Likes tea"], None),  # a raw line break in a string is read as a space
        ('{"facts": [1, "Likes tea", {"a": 1}]}', ["Likes tea"], "valid string"),
        ('{"facts": ["Likes tea", "' + "x" * 201 + '"]}', ["Likes tea"], "at most 200"),
    ],
)
def test_read_facts_repairs_what_it_can(answer: str, facts: list[str], repair: str | None) -> None:
    reading = read_facts(answer, max_fact_chars=200)
    assert reading.value == facts
    assert any(repair in r for r in reading.repairs) if repair else reading.repairs == ()


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("", "no {"),
        ("I cannot help with that.", "no {"),
        ('{"facts": "Likes tea"}', "no {"),
        ('{"memories": 3}', "no {"),
        ('{"facts": [1, null]}', "none of its 2 facts"),
        ('{"facts": ["\\ud83d", "  "]}', "none of its 2 facts"),
        ('{"facts": ["' + "x" * 201 + '"]}', "none of its 1 facts"),
    ],
)
def test_read_facts_names_what_is_unusable(answer: str, problem: str) -> None:
    reading = read_facts(answer, max_fact_chars=200)
    assert reading.value is None and problem in reading.problem
    assert read_facts('{"facts": []}') == Reading([])  # nothing to remember is a usable answer


@pytest.mark.parametrize(
    ("answer", "reads"),
    [
        ('{"facts": ["a"]}', [({"facts": ["a"]}, False)]),
        ('{"facts": ["a", "b', [({"facts": ["a"]}, True)]),  # cut: the half-written fact dropped
        ('{"facts": [', [({"facts": []}, True)]),  # cut before its first fact: not {"facts": []}
        ('{"items": ["a"]} and ["b"]', [({"items": ["a"]}, False), ({"facts": ["b"]}, False)]),  # inner list skipped
        ('I found [2] facts: {"facts": ["a"]}', [({"facts": [2]}, False), ({"facts": ["a"]}, False)]),
        ('["a"] trailing', [({"facts": ["a"]}, False)]),  # text after a complete value is not read
        # a review's finds: a wrapped answer is still read, and a closed empty list is not cut
        ('{"result": {"facts": ["a"]}}', [({"result": {"facts": ["a"]}}, False), ({"facts": ["a"]}, False)]),
        ('{"facts": [] ', [({"facts": []}, False)]),
        ("[ ]  and", [({"facts": []}, False)]),
        # the answer's own list cut: an inner empty list under the same key is not read as the answer
        ('{"a": {"facts": []}, "facts": ["b', [({"a": {"facts": []}, "facts": []}, True)]),
    ],
)
def test_tolerant_json_reads_say_what_was_cut_and_skip_what_a_value_holds(
    answer: str, reads: list[tuple[object, bool]]
) -> None:
    assert [(r.value, r.cut) for r in tolerant_json_reads(answer, "facts")] == reads


@pytest.mark.parametrize(
    ("answer", "facts"),
    [
        ('{"result": {"facts": ["Likes tea"]}}', ["Likes tea"]),
        ('{"response": {"facts": ["Likes tea"]}, "note": "x"}', ["Likes tea"]),
        ('{"facts": [] ', []),  # the list closed, the object cut: nothing to remember, not cut before a fact
    ],
)
def test_a_wrapped_or_closed_answer_reads_as_before(answer: str, facts: list[str]) -> None:
    """A review found these refused by the rule that skips a list inside another value: each cost a retry, then
    the turns were stored verbatim instead of the facts."""
    assert read_facts(answer, 200) == Reading(facts)
