"""A tester's find: a memory's text holding terminal escape sequences (stored from an untrusted conversation) reached
the terminal as they were, so ``inferscale list`` could clear the operator's screen or set the window title, and a
U+202E reversed the rest of a table's row. Every human line now prints control and bidirectional formatting
characters as escapes; ``--json`` keeps the text exact (JSON escapes them itself)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from cli_runner import Ran

from inferscale import MemoryClient
from inferscale.terminal_text import json_for_terminal, terminal_safe
from inferscale.types import ChatChunk

TEXT = "osc \x1b]0;PWNED\x1b\\ then \x1b[2J clear, \u202eright to left\x07 and\r back"
SHOWN = "osc \\x1b]0;PWNED\\x1b\\ then \\x1b[2J clear, \\u202eright to left\\x07 and\\r back"
RAW = ("\x1b", "\u202e", "\x07", "\r")


def _no_controls(printed: str) -> None:
    assert not any(char in printed for char in RAW), ascii(printed)


def test_shown_escapes_what_a_terminal_acts_on_and_keeps_the_rest() -> None:
    assert terminal_safe(TEXT) == SHOWN
    kept = "tab\there\nnew line · é 東京 👨\u200d👩 \u200b"  # a ZWJ (and a zero-width space) is shown as it is
    assert terminal_safe(kept) == kept
    assert terminal_safe("\x00\x7f\x85\u2066\u061c") == "\\x00\\x7f\\x85\\u2066\\u061c"


@pytest.mark.parametrize("columns", ["200", "80"])
def test_tables_and_history_print_the_escapes(
    cli: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    added = cli("add", TEXT, "--user", "esc", "--no-infer")
    assert added.code == 0, added.err
    _no_controls(added.out)
    memory_id = cli("list", "--user", "esc", "--json").json()["results"][0]["id"]
    assert cli("list", "--user", "esc", "--json").json()["results"][0]["memory"] == TEXT
    listed = cli("list", "--user", "esc", "--json")
    _no_controls(listed.out)
    assert listed.json()["results"][0]["memory"] == TEXT
    for argv in (("list", "--user", "esc"), ("search", "clear", "--user", "esc"), ("history", memory_id)):
        ran = cli(*argv)
        assert ran.code == 0, ran.err
        _no_controls(ran.out)
        assert "\\x1b]0;PWNED" in ran.out and "\\u202eright" in ran.out


@pytest.mark.parametrize("stream", [False, True])
def test_chat_answers_and_the_memories_used_print_the_escapes(
    cli: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    assert cli("add", TEXT, "--user", "esc", "--no-infer").code == 0
    real_chat = MemoryClient.chat

    def chat(self: MemoryClient, query: str, **kwargs: Any) -> Any:  # the model's answer holds them too
        result = dataclasses.replace(real_chat(self, query, **{**kwargs, "stream": False}), answer=TEXT)
        return iter([ChatChunk(TEXT[:6]), ChatChunk(TEXT[6:]), ChatChunk("", result)]) if stream else result

    monkeypatch.setattr(MemoryClient, "chat", chat)
    ran = cli("chat", "clear?", "--user", "esc", "--max-new-tokens", "4", *(["--stream"] if stream else []))
    assert ran.code == 0, ran.err
    assert ran.out == SHOWN + "\n"
    assert f"• {SHOWN}" in ran.err
    _no_controls(ran.err)


def test_json_escapes_what_it_would_leave_raw_and_parses_to_the_same_text() -> None:
    """A review's find: ``json.dumps(ensure_ascii=False)`` escapes C0 controls but leaves DEL, C1 controls (a U+009B
    is a CSI) and bidirectional controls raw on the terminal."""
    value = {"memory": "a\x9b2J \u202eb\x7f \x1b 東京 \u2028 \u2029"}  # and the separators splitlines cuts at
    line = json_for_terminal(value)
    assert line == '{"memory": "a\\u009b2J \\u202eb\\u007f \\u001b 東京 \\u2028 \\u2029"}'
    assert json.loads(line) == value and len(line.splitlines()) == 1


def test_key_names_print_the_escapes(cli: Callable[..., Ran]) -> None:
    shown = cli("keys", "create", TEXT, "--user", "esc")  # a review's find: the line it prints was left raw
    assert shown.code == 0, shown.err
    _no_controls(shown.out)
    assert f"({SHOWN}):" in shown.out
    created = cli("keys", "create", TEXT, "--user", "esc", "--json")
    assert created.code == 0, created.err
    _no_controls(created.out)
    assert created.json()["api_key"]["name"] == TEXT
    revoked = cli("keys", "revoke", created.json()["api_key"]["key_id"])
    assert revoked.code == 0 and f"({SHOWN})" in revoked.out
    listed = cli("keys", "list")
    _no_controls(listed.out)


def test_an_error_line_prints_the_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    """An error's message may quote what a user wrote, or come from a server (``--host``): its line is escaped too."""
    from inferscale.apps_extra import fail
    from inferscale.errors import InvalidInputError

    assert fail(InvalidInputError(f"no memory {TEXT}")) == 2
    printed = capsys.readouterr().err
    _no_controls(printed)
    assert SHOWN in printed.replace("\n", "")
