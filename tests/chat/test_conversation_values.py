"""The chat request's values: conversations and sampling settings are checked before anything runs, with typed
errors that name the problem."""

from __future__ import annotations

from typing import Any

import pytest

from inferscale.conversation import ChatMessage, SamplingSettings, check_messages, last_user_text
from inferscale.errors import InvalidInputError

LANGCHAIN_SHAPED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "My cat is called Pixel."},
    {"role": "assistant", "content": "Nice name."},
    {"role": "user", "content": "What is my cat called?"},
]


def test_a_conversation_is_kept_in_order_and_retrieves_with_its_last_user_turn() -> None:
    checked = check_messages(LANGCHAIN_SHAPED)
    assert [m.role for m in checked] == ["system", "user", "assistant", "user"]
    assert checked[1] == ChatMessage("user", "My cat is called Pixel.")
    assert last_user_text(checked) == "What is my cat called?"
    assert check_messages(checked) == checked  # ChatMessage objects pass through


def test_keys_set_to_none_are_accepted_as_the_openai_sdk_sends_its_answers_back() -> None:
    """``completion.choices[0].message.model_dump()`` holds every field of the SDK's message, unset ones as None: a
    multi-turn loop that appended it was refused ("unsupported keys ['annotations', 'audio', ...]"), a helper's find
    with the official SDK against the server."""
    answer = {
        "role": "assistant",
        "content": "Hello!",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": None,
        "parsed": None,
    }
    checked = check_messages([{"role": "user", "content": "Hi"}, answer, {"role": "user", "content": "Again."}])
    assert checked == (ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello!"), ChatMessage("user", "Again."))


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([], "empty"),
        ("What is my cat called?", "list"),
        ([{"role": "tool", "content": "x"}], "role 'tool'"),
        ([{"role": "user"}], "content must be a string"),
        ([{"role": "user", "content": ["parts"]}], "content must be a string"),
        ([{"role": "user", "content": "  "}], "no text"),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": ""},
            ],
            r"messages\[2\] is a user message with no text",
        ),
        ([{"role": "system", "content": "Be brief."}], "no user message"),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}], "ends with an assistant"),
        ([{"role": "user", "content": "Hi", "tool_calls": []}], "unsupported keys"),
        ([{"role": "user", "content": "Hi", "tool_calls": [{"id": "c1", "type": "function"}]}], "unsupported keys"),
        ([{"role": "user", "content": "Hi", "refusal": "No."}], r"unsupported keys \['refusal'\]"),
        (["Hi"], "must be a dict"),
    ],
)
def test_bad_conversations_are_refused(messages: Any, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        check_messages(messages)


def test_sampling_defaults_to_greedy_and_reads_openai_shapes() -> None:
    assert SamplingSettings().is_greedy
    whole = SamplingSettings.of(temperature=1, repetition_penalty=2, top_p=1)  # JSON clients send ints
    assert (whole.temperature, whole.repetition_penalty, whole.top_p) == (1.0, 2.0, 1.0)
    assert all(isinstance(v, float) for v in (whole.temperature, whole.repetition_penalty, whole.top_p))
    assert SamplingSettings.of(temperature=1e-40).is_greedy  # below vLLM's threshold: greedy, not an overflow
    assert not SamplingSettings.of(temperature=1e-4).is_greedy
    assert SamplingSettings.of(temperature=0.0, seed=3).is_greedy
    settings = SamplingSettings.of(temperature=0.7, top_p=0.9, top_k=40, seed=1, repetition_penalty=1.1, stop="\n")
    assert not settings.is_greedy
    assert settings.stop == ("\n",)
    assert SamplingSettings.of(stop=["a", "b"]).stop == ("a", "b")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        (
            {"temperature": 10**400},
            "temperature must be a finite number, got an integer of 401 digits",
        ),  # OverflowError
        ({"top_p": 10**400}, "top_p must be a finite number"),
        ({"repetition_penalty": -(10**400)}, "repetition_penalty must be a finite number"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": 2**31}, r"top_k must be an int in \[1, 2\*\*31\) or None, got 2147483648"),  # vLLM's int32
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop": [""]}, r"stop must be a list of non-empty strings, got \[''\]"),
        ({"stop": ["a", ""]}, r"got \['a', ''\]"),
        ({"stop": ""}, "stop must be a non-empty string or a list of them, got ''"),  # was called a tuple ('',)
        ({"stop": 5}, "stop"),
    ],
)
def test_bad_sampling_values_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        SamplingSettings.of(**kwargs)


def test_a_stop_string_given_to_the_settings_themselves_is_shown_as_given() -> None:
    """``SamplingSettings(stop="abc")`` (not through ``of``) was reported as ``['a', 'b', 'c']``."""
    with pytest.raises(InvalidInputError, match=r"stop must be a list of non-empty strings, got 'abc'$"):
        SamplingSettings(stop="abc")  # type: ignore[arg-type]


def test_a_developer_message_is_a_system_one_in_chat_as_in_add_and_on_the_server() -> None:
    """OpenAI's newer models send their instructions as ``developer`` messages: the server read them as system
    messages and ``add`` (since this stop) too, while the local ``chat`` refused them."""
    messages = [{"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "Hi"}]
    assert check_messages(messages) == (ChatMessage("system", "Answer briefly."), ChatMessage("user", "Hi"))
    with pytest.raises(InvalidInputError, match="has role 'bot'"):
        check_messages([{"role": "bot", "content": "Hi"}])


def test_an_earlier_user_turn_with_no_text_is_taken_as_sent() -> None:
    """A chat engine keeps a question it failed to send in its history (LlamaIndex's SimpleChatEngine, a LangGraph
    checkpoint): refused anywhere, one empty question failed every later turn of the conversation (a new user's
    find). Only the last user message, the one answered, must have text; OpenAI's API takes an empty earlier one."""
    messages = [
        {"role": "user", "content": "What is my dog called?"},
        {"role": "assistant", "content": "Biscuit."},
        {"role": "user", "content": ""},
        {"role": "user", "content": " "},
        {"role": "user", "content": "Hello?"},
    ]
    assert check_messages(messages) == tuple(ChatMessage(m["role"], m["content"]) for m in messages)  # type: ignore[arg-type]
