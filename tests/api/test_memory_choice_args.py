"""Arguments that choose memories by id: ``memory_kv``'s list, and the scope-only filters ``chat`` allows beside
``memory_ids``, judged alike on the sync and async clients (an API contract review, 6 Dec 2026)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, fake_config

from inferscale import AsyncMemoryClient, InvalidInputError, MemoryClient
from inferscale.chat_request import resolve_chat

BAD_MEMORIES: list[tuple[Any, str]] = [
    (None, "memories must be a list of memory records or id strings, got NoneType"),  # was TypeError
    ("abc", "got str"),  # was read one character per id: MemoryNotFoundError for 'a'
    (b"ab", "got bytes"),
    ([5], "memory_id must be a non-empty str, got 5"),
    ([""], "memory_id must be a non-empty str"),
]


@pytest.mark.parametrize(("memories", "match"), BAD_MEMORIES)
def test_memory_kv_refuses_what_is_not_a_list_of_records_or_ids(tmp_path: Path, memories: Any, match: str) -> None:
    with (
        MemoryClient(fake_config(tmp_path / "sync"), embedder=HashEmbedder()) as client,
        pytest.raises(InvalidInputError, match=match),
    ):
        client.memory_kv(memories)

    async def run() -> None:
        async with AsyncMemoryClient(fake_config(tmp_path / "async"), embedder=HashEmbedder()) as client:
            with pytest.raises(InvalidInputError, match=match):
                await client.memory_kv(memories)

    asyncio.run(run())


def _chat(filters: dict[str, Any]) -> Any:
    return resolve_chat(
        "hi",
        messages=None,
        user_id=None,
        agent_id=None,
        run_id=None,
        filters=filters,
        limit=None,
        memory_ids=["m1"],
        search_query=None,
        mode="kv",
        stream=False,
        max_new_tokens=None,
        temperature=None,
        top_p=None,
        top_k=None,
        seed=None,
        repetition_penalty=None,
        stop=None,
    )


def test_an_int_scope_id_in_filters_names_the_scope_beside_memory_ids_as_its_string_does() -> None:
    """``filters={"user_id": 42}`` with ``memory_ids`` was refused as filters that memory_ids would ignore, while
    ``{"user_id": "42"}`` passed; an int id is its decimal string everywhere else (docs/api.md)."""
    assert _chat({"user_id": 42}).scope == _chat({"user_id": "42"}).scope
    with pytest.raises(InvalidInputError, match="memory_ids chooses the memories, so filters would be ignored"):
        _chat({"user_id": 42, "agent_id": "*"})  # a wildcard chooses memories
    with pytest.raises(InvalidInputError, match="filters would be ignored"):
        _chat({"user_id": 42, "topic": "tea"})
