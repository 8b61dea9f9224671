"""``inferscale chat`` on a tiny float32 model (fast, deterministic greedy answers), and once on the embedded
SmolLM2 (slow): ``--json`` is the client's ChatResult, ``--stream`` prints the deltas as they come."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Ran

from inferscale import MemoryClient
from inferscale.cli import main
from inferscale.terminal_text import terminal_safe

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]
QUESTION = "What is my dog called?"


def _without_timings(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "timings"}


@pytest.fixture
def stored(cli: Callable[..., Ran]) -> None:
    for fact in FACTS:
        assert cli("add", fact, "--user", "alice", "--no-infer").code == 0
    assert cli("add", "Bob's dog is a poodle named Rex.", "--user", "bob", "--no-infer").code == 0


@pytest.mark.usefixtures("stored")
@pytest.mark.parametrize("mode", ["kv", "prompt"])
def test_chat_json_is_the_clients_chat_result(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient], mode: str
) -> None:
    ran = cli("chat", QUESTION, "--user", "alice", "--mode", mode, "--limit", "2", "--max-new-tokens", "6", "--json")
    assert ran.code == 0 and ran.err == ""
    got = ran.json()
    expected = reference().chat(QUESTION, user_id="alice", mode=mode, limit=2, max_new_tokens=6).to_dict()
    assert _without_timings(got) == _without_timings(expected)
    assert got["mode"] == mode and len(got["memory_ids"]) == 2 and got["generated_tokens"] <= 6
    assert set(got["timings"]) == set(expected["timings"]) and got["timings"]["ttft_ms"] > 0


@pytest.mark.usefixtures("stored")
def test_chat_sampling_options_reach_the_client(cli: Callable[..., Ran], reference: Callable[[], MemoryClient]) -> None:
    argv = ("chat", QUESTION, "--user", "alice", "--temperature", "1.5", "--seed", "7", "--max-new-tokens", "8")
    first, again = cli(*argv, "--json").json(), cli(*argv, "--json").json()
    assert first["answer"] == again["answer"]  # the seed makes the sample repeatable
    ref = reference()
    sampled = ref.chat(QUESTION, user_id="alice", temperature=1.5, seed=7, max_new_tokens=8)
    assert first["answer"] == sampled.answer
    assert sampled.answer != ref.chat(QUESTION, user_id="alice", max_new_tokens=8).answer  # not the greedy answer


@pytest.mark.usefixtures("stored")
def test_chat_stream_json_lines_are_the_clients_chunks(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    ran = cli("chat", QUESTION, "--user", "alice", "--stream", "--max-new-tokens", "12", "--json")
    assert ran.code == 0 and ran.err == ""
    chunks = [json.loads(line) for line in ran.out.splitlines()]
    assert all(c["result"] is None for c in chunks[:-1]) and chunks[-1]["delta"] == ""
    final = chunks[-1]["result"]
    assert "".join(c["delta"] for c in chunks) == final["answer"]
    whole = reference().chat(QUESTION, user_id="alice", max_new_tokens=12).to_dict()
    assert _without_timings(final) == _without_timings(whole)


@pytest.mark.usefixtures("stored")
def test_chat_prints_the_answer_then_the_memories_used(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    expected = reference().chat(QUESTION, user_id="alice", limit=1, max_new_tokens=8)
    for extra in ((), ("--stream",)):
        ran = cli("chat", QUESTION, "--user", "alice", "--limit", "1", "--max-new-tokens", "8", *extra)
        assert ran.code == 0
        assert ran.out.rstrip("\n") == terminal_safe(expected.answer).rstrip("\n")  # the tiny model's controls
        assert f"• {expected.memories[0]}" in ran.err
        assert "kv · 1 memory · TTFT" in ran.err and f"{expected.generated_tokens} tokens" in ran.err


def test_chat_without_a_scope_fails_before_generating(cli: Callable[..., Ran]) -> None:
    ran = cli("chat", QUESTION, "--stream")
    assert ran.code == 2 and ran.out == ""
    assert ran.err.startswith("error: ") and ran.err.count("\n") == 1 and "user_id" in ran.err


@pytest.mark.slow
def test_chat_on_the_embedded_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real client: MiniLM embeds, SmolLM2 encodes the K/V on add and answers."""
    data = ["--data-dir", str(tmp_path), "--dtype", "float32"]
    assert main(["add", "My dog is a beagle named Biscuit.", "--user", "maya", "--no-infer", *data]) == 0
    assert main(["add", "I live in Porto.", "--user", "maya", "--no-infer", *data]) == 0
    capsys.readouterr()
    assert main(["chat", "What is my dog's name?", "--user", "maya", "--limit", "1", "--json", *data]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["memories"] == ["My dog is a beagle named Biscuit."]
    assert "Biscuit" in result["answer"]
    assert result["memory_tokens"] > 0 and result["timings"]["kv_assembly_ms"] > 0
