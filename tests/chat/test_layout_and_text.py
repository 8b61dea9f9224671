"""The conversation after the memory segment (the model's chat template, caller system text kept, the fixed prefix
untouched) and the streamed answer's text (no half characters, stop strings cut), on the byte-level tiny
tokenizer: every UTF-8 byte is a token, so a character can span several."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from tiny_models import CHATML_TEMPLATE, LAST_TURN_SYSTEM_TEMPLATE, ONE_SYSTEM_TEMPLATE, byte_chat_tokenizer

from inferscale.conversation import ChatMessage
from inferscale.engines.hf import PromptLayout
from inferscale.engines.hf.answer_text import AnswerText
from inferscale.errors import InvalidInputError

CONVERSATION = (
    ChatMessage("system", "Answer in French."),
    ChatMessage("user", "My cat is called Pixel."),
    ChatMessage("assistant", "Nice, Pixel is a lovely name."),
    ChatMessage("user", " What is my cat called? "),
)


def _rest(layout: PromptLayout, conversation: str | Sequence[ChatMessage]) -> str:
    text: str = layout._tokenizer.decode(layout.conversation_ids(conversation))
    return text


def test_every_turn_reaches_the_prompt_after_the_memory_in_template_order() -> None:
    layout = PromptLayout(byte_chat_tokenizer(CHATML_TEMPLATE), "Memories:\n")
    assert layout.system_turns
    assert layout._tokenizer.decode(layout.prefix_ids) == "system: Memories:\n"
    assert _rest(layout, CONVERSATION) == (
        "<|end|>\nsystem: Answer in French.<|end|>\nuser: My cat is called Pixel.<|end|>\n"
        "assistant: Nice, Pixel is a lovely name.<|end|>\nuser: What is my cat called?<|end|>\nassistant: "
    )
    # a query string is a one-user-turn conversation, with the same tokens
    assert layout.query_ids(" Where? ") == layout.conversation_ids([ChatMessage("user", "Where?")])
    assert _rest(layout, "Where?") == "<|end|>\nuser: Where?<|end|>\nassistant: "


def test_a_one_system_template_gets_the_callers_system_text_after_the_memory() -> None:
    layout = PromptLayout(byte_chat_tokenizer(ONE_SYSTEM_TEMPLATE), "Memories:\n")
    assert not layout.system_turns
    prefix = list(layout.prefix_ids)
    assert _rest(layout, CONVERSATION) == (
        "\n\nAnswer in French.<|end|>\nuser: My cat is called Pixel.<|end|>\n"
        "assistant: Nice, Pixel is a lovely name.<|end|>\nuser: What is my cat called?<|end|>\nassistant: "
    )
    assert layout.prefix_ids == prefix  # the fixed prefix (and so every stored fact's K/V) is untouched
    late_system = [ChatMessage("user", "Hi"), ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    with pytest.raises(InvalidInputError, match="system text only before the first user turn"):
        layout.conversation_ids(late_system)
    with pytest.raises(InvalidInputError, match="chat template refused"):
        layout.conversation_ids([ChatMessage("user", "Hi"), ChatMessage("user", "Again")])


def test_a_template_that_moves_the_system_message_serves_one_turn_and_refuses_more() -> None:
    layout = PromptLayout(byte_chat_tokenizer(LAST_TURN_SYSTEM_TEMPLATE), "Memories:\n")
    assert layout._tokenizer.decode(layout.prefix_ids) == "[INST] Memories:\n"
    assert _rest(layout, "Where?") == "\n\nWhere?[/INST]"
    with pytest.raises(InvalidInputError, match="one user turn"):
        layout.conversation_ids(CONVERSATION)


def _stream(tokenizer: Any, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], str, bool]:
    answer = AnswerText(tokenizer, stop)
    deltas = []
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        deltas.append(answer.push(token))
        if answer.stopped:
            break
    deltas.append(answer.finish())
    return deltas, answer.text, answer.stopped


def test_streamed_text_never_holds_half_a_character_and_joins_to_the_answer() -> None:
    tokenizer = byte_chat_tokenizer()
    deltas, text, stopped = _stream(tokenizer, "  Olá, 林晓雨! 🐶  ")
    assert text == "".join(deltas) == "Olá, 林晓雨! 🐶"
    assert not stopped
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # the continuation bytes of 林 (3 bytes) and 🐶 (4 bytes) were held back


def test_a_stop_string_ends_the_answer_and_is_never_shown() -> None:
    tokenizer = byte_chat_tokenizer()
    deltas, text, stopped = _stream(tokenizer, "Pixel.\nUser: more text", stop=("\nUser:",))
    assert stopped
    assert text == "".join(deltas) == "Pixel."
    assert not any("User" in d or "\n" in d for d in deltas)  # the stop string's start was held, then dropped
    # a prefix of a stop string that does not complete it is shown in the end
    _, text, stopped = _stream(tokenizer, "Pixel.\nUs", stop=("\nUser:",))
    assert (text, stopped) == ("Pixel.\nUs", False)


def test_text_before_a_possible_stop_string_is_stripped_too(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = byte_chat_tokenizer()
    deltas, text, stopped = _stream(tokenizer, "My dog's name is Biscuit.", stop=("dog's name",))
    assert stopped and text == "".join(deltas) == "My"
    _, text, _ = _stream(tokenizer, "My dog's name is Biscuit.", stop=("Biscuit.",))
    assert text == "My dog's name is"
    assert "rewrote" not in caplog.text


def test_a_stop_string_is_never_matched_in_half_a_character() -> None:
    """The partial decode of a character split across tokens ends in U+FFFD: ``stop="\ufffd"`` (or one ending in
    it) cut the answer at its first multi-byte character, although the answer never contains U+FFFD."""
    tokenizer = byte_chat_tokenizer()
    deltas, text, stopped = _stream(tokenizer, "שלום 🐱 ok", stop=("\ufffd", "ok\ufffd"))
    assert (text, stopped) == ("שלום 🐱 ok", False)
    assert text == "".join(deltas)


def test_a_budget_that_ends_inside_a_character_drops_it() -> None:
    tokenizer = byte_chat_tokenizer()
    ids = tokenizer("ok 林", add_special_tokens=False)["input_ids"]
    answer = AnswerText(tokenizer)
    for token in ids[:-1]:  # the last byte of 林 never comes
        answer.push(token)
    answer.finish()
    assert answer.text == "ok"
