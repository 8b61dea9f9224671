"""What users and servers wrote is printed as it is, never read as rich markup: memory text, scope ids, queries,
memory ids, key names and chat answers holding ``[bold]...[/bold]`` keep their brackets, and a stray ``[/x]`` is no
error (rich raised ``MarkupError`` on it), in wide and narrow tables and in every line the commands print."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cli_runner import Fakes, Ran

from inferscale import MemoryClient
from inferscale.commands.options import StoreOptions
from inferscale.server.keys import KeyStore
from inferscale.types import ChatChunk

TEXT = "[bold]Rex[/bold] [/x] dog"
USER = "[red]al[/red]"
QUERY = "[/q] beagle?"
ANSWER = "[bold]Biscuit[/bold], [/x]"


def _row_with(out: str, needle: str) -> str:
    return next(line for line in out.splitlines() if needle in line)


@pytest.fixture
def memory_id(cli: Callable[..., Ran]) -> str:
    ran = cli("add", TEXT, "--user", USER, "--no-infer")
    assert ran.code == 0, ran.err
    assert f"1 change for user={USER}" in ran.out and "ADD" in _row_with(ran.out, TEXT)
    found = cli("list", "--user", USER, "--json").json()["results"]
    assert [m["memory"] for m in found] == [TEXT]
    return str(found[0]["id"])


@pytest.mark.parametrize("columns", ["200", "80"])
def test_list_and_search_tables_print_markup_as_text(
    cli: Callable[..., Ran], memory_id: str, monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    listed = cli("list", "--user", USER)
    assert listed.code == 0, listed.err
    assert f"1 memory of user={USER}" in listed.out
    assert TEXT in _row_with(listed.out, memory_id) and f"user={USER}" in listed.out
    found = cli("search", QUERY, "--user", USER)
    assert found.code == 0, found.err
    assert f"1 memory of user={USER} for {QUERY!r}" in found.out and TEXT in found.out


def test_add_history_and_delete_lines_print_markup_as_text(cli: Callable[..., Ran], memory_id: str) -> None:
    again = cli("add", TEXT, "--user", USER, "--no-infer")
    assert again.code == 0 and f"nothing changed for user={USER}" in again.out
    cli("delete", memory_id, "--user", USER)
    history = cli("history", memory_id)
    assert history.code == 0, history.err
    events = [line for line in history.out.splitlines() if "ADD" in line or "DELETE" in line]
    assert len(events) == 2 and all(TEXT in line for line in events)
    cli("add", TEXT, "--user", USER, "--no-infer")
    deleted = cli("delete", "--all", "--user", USER)
    assert deleted.code == 0 and f"deleted 1 memory of user={USER}" in deleted.out


@pytest.fixture
def store(fakes: Fakes) -> Iterator[KeyStore]:
    keys = KeyStore.for_config(StoreOptions(data_dir=str(fakes.data_dir)).config())
    yield keys
    keys.close()


def test_key_names_and_scopes_print_as_text(cli: Callable[..., Ran], store: KeyStore) -> None:
    name = "[bold]ops[/bold] [/x]"
    created = cli("keys", "create", name, "--user", USER)
    assert created.code == 0, created.err
    key_id = store.list()[0].key_id
    assert f"created API key {key_id} ({name}):" in created.out
    listed = cli("keys", "list")
    assert listed.code == 0, listed.err
    row = _row_with(listed.out, key_id)
    assert name in row and f'user="{USER}"' in row  # an id that is not plain ASCII is shown quoted, as text
    revoked = cli("keys", "revoke", key_id)
    assert revoked.code == 0 and f"revoked API key {key_id} ({name})" in revoked.out


@pytest.mark.parametrize("stream", [False, True])
def test_chat_answers_and_memories_print_as_text(
    cli: Callable[..., Ran], memory_id: str, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    real_chat = MemoryClient.chat

    def chat(self: MemoryClient, query: str, **kwargs: Any) -> Any:  # the model's answer holds markup
        result = dataclasses.replace(real_chat(self, query, **{**kwargs, "stream": False}), answer=ANSWER)
        return iter([ChatChunk(ANSWER[:9]), ChatChunk(ANSWER[9:]), ChatChunk("", result)]) if stream else result

    monkeypatch.setattr(MemoryClient, "chat", chat)
    ran = cli("chat", QUERY, "--user", USER, "--max-new-tokens", "4", *(["--stream"] if stream else []))
    assert ran.code == 0, ran.err
    assert ran.out == ANSWER + "\n"
    assert f"• {TEXT}" in ran.err


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_answer_prints_unwrapped_with_its_emoji_codes_when_stdout_is_not_a_terminal(
    cli: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Piped, the plain answer was hard-wrapped at 80 columns and ``:thumbs_up:`` became an emoji, on stdout and in
    the memories listed on stderr (a CLI user's report): ``ans=$(inferscale chat ...)`` got another text than
    ``--json`` or ``--stream`` gave."""
    memory = "My favourite code is :thumbs_up: and I type it every day."
    answer = "Your code is :thumbs_up:. " + "It is a long answer that runs on " * 6
    assert cli("add", memory, "--user", "emo", "--no-infer").code == 0
    real_chat = MemoryClient.chat

    def chat(self: MemoryClient, query: str, **kwargs: Any) -> Any:
        result = dataclasses.replace(real_chat(self, query, **{**kwargs, "stream": False}), answer=answer)
        return iter([ChatChunk(answer[:30]), ChatChunk(answer[30:]), ChatChunk("", result)]) if stream else result

    monkeypatch.setattr(MemoryClient, "chat", chat)
    monkeypatch.setenv("COLUMNS", "80")
    ran = cli("chat", "Which code?", "--user", "emo", "--max-new-tokens", "4", *(["--stream"] if stream else []))
    assert ran.code == 0, ran.err
    assert len(answer) > 80 and ran.out == answer + "\n"
    assert f"• {memory}" in ran.err
