"""``SentTexts``: which retrieved memories a chat leaves out as repeating its conversation, and how far retrieval
widens so that ``limit`` others remain (the search sizes asked for, against a scripted ranking)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from inferscale.chat_request import SentTexts
from inferscale.conversation import ChatMessage

RANKED = ["q", "q", " q\n", "a", "b", "c"]  # the scope's memories, best first: three copies of the question "q"


def searching(ranked: list[str], asked: list[int]) -> Any:
    def search(k: int) -> list[Any]:
        asked.append(k)
        return [SimpleNamespace(text=t) for t in ranked[:k]]

    return search


@pytest.mark.parametrize(
    ("ranked", "limit", "most", "kept", "asked"),
    [
        (RANKED, 2, None, ["a", "b"], [3, 6]),  # limit + one per text, then doubled
        (RANKED, 1, None, ["a"], [2, 4]),
        (RANKED, 2, 4, ["a"], [3, 4]),  # never past most
        (["q"], 2, None, [], [3]),  # the scope holds no more
        (RANKED, 0, None, [], [0]),
        (["a", "b", "c"], 2, None, ["a", "b"], [3]),  # no copy: one search
    ],
)
def test_retrieval_widens_until_limit_memories_repeat_no_message(
    ranked: list[str], limit: int, most: int | None, kept: list[str], asked: list[int]
) -> None:
    sent = SentTexts.of([ChatMessage("system", "a"), ChatMessage("user", " q "), ChatMessage("assistant", "")])
    assert sent.texts == frozenset({"q"})  # user and assistant texts, stripped; empty ones and system text not
    sync_asked: list[int] = []
    assert [m.text for m in sent.retrieve_unsent(searching(ranked, sync_asked), limit, most)] == kept
    assert sync_asked == asked

    async_asked: list[int] = []
    search = searching(ranked, async_asked)

    async def asearch(k: int) -> list[Any]:
        return search(k)  # type: ignore[no-any-return]

    assert [m.text for m in asyncio.run(sent.aretrieve_unsent(asearch, limit, most))] == kept
    assert async_asked == asked
