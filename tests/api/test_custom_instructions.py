"""Custom instructions for fact extraction (Mem0 2.x's ``custom_instructions`` config and ``add(prompt=...)``), on
every client (sync, async, and both remote ones over HTTP), SQLite and PostgreSQL. Before they existed, a Mem0 user's
``add(..., prompt=...)`` was a TypeError and a config with ``custom_instructions`` a ConfigError."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pytest
from client_adapter import MakeClient
from mem0_fakes import ScriptedGenerator, facts, fake_config

from inferscale import MemoryConfig
from inferscale.config import MAX_INSTRUCTIONS_CHARS, LLMConfig
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.mem0_config import from_mem0_dict
from inferscale.memory.prompts import CUSTOM_INSTRUCTIONS_HEADER, fact_extraction_system_prompt

FOOD_ONLY = "Only save food preferences. Skip everything else."
TODAY = re.compile(r"Today is (\d{4}-\d{2}-\d{2})")


def extraction_system_prompts(gen: ScriptedGenerator) -> list[str]:
    """The system prompt of each extraction call the LLM was given, in order."""
    return [messages[0]["content"] for title, messages in gen.calls if title == "ExtractedFacts"]


def expected_system_prompt(shown: str, instructions: str | None) -> str:
    """The extraction system prompt of the day ``shown`` names, with ``instructions``."""
    day = TODAY.search(shown)
    assert day is not None
    return fact_extraction_system_prompt(date.fromisoformat(day[1]), instructions)


def test_add_prompt_is_shown_to_the_extraction_llm_after_its_rules(make: MakeClient) -> None:
    gen = ScriptedGenerator(facts=facts("Maya is vegetarian"))
    m = make(gen)
    added = m.add("I'm vegetarian and I work at Acme.", user_id="maya", prompt=FOOD_ONLY)
    assert [r["memory"] for r in added["results"]] == ["Maya is vegetarian"]
    [shown] = extraction_system_prompts(gen)
    assert shown == expected_system_prompt(shown, FOOD_ONLY)
    assert shown.endswith(f"\n{CUSTOM_INSTRUCTIONS_HEADER}\n{FOOD_ONLY}")
    m.add("I also love Thai food.", user_id="maya")  # the next call without a prompt has none
    assert extraction_system_prompts(gen)[1] == expected_system_prompt(shown, None)
    assert CUSTOM_INSTRUCTIONS_HEADER not in extraction_system_prompts(gen)[1]


def test_configured_instructions_apply_to_every_add_and_a_call_prompt_replaces_them(
    make: MakeClient, tmp_path: Path, db_url: str
) -> None:
    configured = "Write every fact in the third person."
    gen = ScriptedGenerator(facts=facts("Maya is vegetarian"))
    m = make(gen, config=fake_config(tmp_path, db_url, llm=LLMConfig(custom_instructions=configured)))
    m.add("I'm vegetarian.", user_id="maya")
    m.add("I love Thai food.", user_id="maya", prompt=FOOD_ONLY)
    first, second = extraction_system_prompts(gen)
    assert first == expected_system_prompt(first, configured)
    assert second == expected_system_prompt(second, FOOD_ONLY)  # replaced, not appended: Mem0's prompt or config
    assert configured not in second


def test_instructions_reach_every_chunk_of_a_long_conversation_and_not_the_reconcile_llm(
    make: MakeClient, tmp_path: Path, db_url: str
) -> None:
    """A conversation longer than ``llm.max_input_tokens`` is extracted chunk by chunk: each chunk's call follows the
    instructions. The reconcile LLM decides against stored memories and is not shown them (as in Mem0)."""
    update = json.dumps({"memory": [{"id": "0", "text": "Loves Thai food", "event": "UPDATE", "old_memory": None}]})
    gen = ScriptedGenerator(facts=[facts("Likes Thai food"), facts("Loves Thai food")], decisions=update)
    m = make(gen, config=fake_config(tmp_path, db_url, llm=LLMConfig(max_input_tokens=64)))
    m.add("I like Thai food.", user_id="maya")
    turns = [{"role": "user", "content": f"Turn {i}: " + "the weather was mild and grey " * 4} for i in range(4)]
    m.add(turns, user_id="maya", prompt=FOOD_ONLY)
    prompts = extraction_system_prompts(gen)
    assert len(prompts) > 2  # the second add was cut into chunks
    assert all(shown == expected_system_prompt(shown, FOOD_ONLY) for shown in prompts[1:])
    reconciled = [messages for title, messages in gen.calls if title == "MemoryDecisions"]
    assert reconciled and not any(FOOD_ONLY in turn["content"] for messages in reconciled for turn in messages)


@pytest.mark.parametrize(
    ("prompt", "infer", "says"),
    [
        ("", True, "prompt must be None or a non-blank str"),
        ("  \n ", True, "whitespace only"),
        (5, True, "prompt must be None or a non-blank str"),
        (["Only food"], True, "prompt must be None or a non-blank str"),
        ("x" * (MAX_INSTRUCTIONS_CHARS + 1), True, f"at most {MAX_INSTRUCTIONS_CHARS:,} characters"),
        ("\ud800 lone surrogate", True, "prompt must be None or a non-blank str"),
        (FOOD_ONLY, False, "prompt .* needs infer=True"),
    ],
    ids=["empty", "blank", "int", "list", "too-long", "surrogate", "without-infer"],
)
def test_a_bad_prompt_is_refused_before_the_llm_and_writes_nothing(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]], prompt: object, infer: bool, says: str
) -> None:
    gen = ScriptedGenerator(facts=facts("Maya is vegetarian"))
    m = make(gen)
    m.add("I'm Maya.", user_id="maya", infer=False)
    before = row_counts()
    with pytest.raises(InvalidInputError, match=says):
        m.add("I'm vegetarian.", user_id="maya", infer=infer, prompt=prompt)
    assert gen.calls == [] and row_counts() == before


def test_the_longest_prompt_allowed_is_taken(make: MakeClient) -> None:
    gen = ScriptedGenerator(facts=facts("Maya is vegetarian"))
    longest = "y" * MAX_INSTRUCTIONS_CHARS
    make(gen).add("I'm vegetarian.", user_id="maya", prompt=longest)
    assert extraction_system_prompts(gen)[0].endswith(longest)


# ---- the config: ours and Mem0's -------------------------------------------------------------------------------


def test_mem0s_custom_instructions_become_the_llm_sections() -> None:
    assert from_mem0_dict({"custom_instructions": FOOD_ONLY}).llm.custom_instructions == FOOD_ONLY
    with_llm = {
        "custom_instructions": FOOD_ONLY,
        "llm": {"provider": "openai", "config": {"model": "gpt-4o-mini", "openai_base_url": "http://127.0.0.1:9/v1"}},
    }
    llm = from_mem0_dict(with_llm).llm
    assert (llm.provider, llm.model, llm.custom_instructions) == ("openai", "gpt-4o-mini", FOOD_ONLY)
    ours = {"custom_instructions": FOOD_ONLY, "llm": {"max_new_tokens": 100}}  # an llm section in our fields
    assert from_mem0_dict(ours).llm == LLMConfig(max_new_tokens=100, custom_instructions=FOOD_ONLY)
    assert from_mem0_dict({"custom_instructions": None}).llm.custom_instructions is None  # Mem0's default


@pytest.mark.parametrize(
    "bad",
    [
        {"custom_instructions": "   "},
        {"custom_instructions": 5},
        {"custom_instructions": "z" * (MAX_INSTRUCTIONS_CHARS + 1)},
        {"custom_instructions": "a", "llm": {"custom_instructions": "b"}},
        {"custom_fact_extraction_prompt": "Extract only food."},  # Mem0 1.x's whole-prompt replacements
        {"custom_update_memory_prompt": "Always ADD."},
    ],
    ids=["blank", "int", "too-long", "twice", "1.x-extraction", "1.x-update"],
)
def test_bad_or_unsupported_instructions_in_a_config_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        from_mem0_dict(bad)


def test_our_config_checks_custom_instructions_as_add_checks_prompt() -> None:
    assert MemoryConfig(llm=LLMConfig(custom_instructions=FOOD_ONLY)).llm.custom_instructions == FOOD_ONLY
    for bad in ("", " ", "z" * (MAX_INSTRUCTIONS_CHARS + 1)):
        with pytest.raises(ValueError, match="custom_instructions"):
            LLMConfig(custom_instructions=bad)
