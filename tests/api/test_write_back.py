"""store_turns / astore_turns: a write-back stores what can be stored and raises only what the caller must fix."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import pytest

from inferscale.errors import (
    DatabaseUnavailableError,
    InvalidInputError,
    MemoryTooLongError,
    RouteNotFoundError,
    ScopeError,
)
from inferscale.write_back import astore_turns, store_turns

USER = {"role": "user", "content": "x" * 5000}
ANSWER = {"role": "assistant", "content": "Here is my answer."}


class Add:
    """Stands for ``client.add``: refuses a batch holding a message longer than 4,000 characters (as
    ``max_memory_chars`` does), or raises ``error`` for every call; records each call's messages."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[list[Mapping[str, str]]] = []

    def __call__(self, turns: Sequence[Mapping[str, str]]) -> dict[str, list[str]]:
        self.calls.append(list(turns))
        if self.error is not None:
            raise self.error
        for i, turn in enumerate(turns):
            if len(turn["content"]) > 4000:
                raise MemoryTooLongError(f"message {i} has {len(turn['content']):,} characters")
        return {"results": [t["role"] for t in turns]}

    async def aadd(self, turns: Sequence[Mapping[str, str]]) -> dict[str, list[str]]:
        return self(turns)


def both(add: Add, turns: Sequence[Mapping[str, str]]) -> list[list[dict[str, list[str]]]]:
    """The results of store_turns and astore_turns on the same ``turns``."""
    return [store_turns(add, turns), asyncio.run(astore_turns(add.aadd, turns))]


def test_turns_add_takes_are_stored_in_one_call() -> None:
    add = Add()
    assert both(add, [ANSWER, ANSWER]) == [[{"results": ["assistant", "assistant"]}]] * 2
    assert add.calls == [[ANSWER, ANSWER]] * 2


def test_a_refused_message_is_left_out_with_a_warning_and_the_rest_stored_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    add = Add()
    with caplog.at_level(logging.WARNING, logger="inferscale.write_back"):
        assert both(add, [USER, ANSWER]) == [[{"results": ["assistant"]}]] * 2
        assert both(add, [USER]) == [[], []]
    assert add.calls == [[USER, ANSWER], [USER], [ANSWER]] * 2 + [[USER]] * 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 4
    assert all(w.startswith("a user message (5,000 characters) was not stored") for w in warnings)
    assert all("message 0 has 5,000 characters" in w for w in warnings)


@pytest.mark.parametrize(
    "error",
    [
        ScopeError("set at least one of user_id, agent_id or run_id"),
        InvalidInputError("user_id is 300 characters; a scope id holds at most 255"),
        RouteNotFoundError("no route POST /api/v1/memories/"),  # a remote client's host with a wrong path
        DatabaseUnavailableError("down"),
    ],
    ids=lambda e: type(e).__name__,
)
@pytest.mark.parametrize("turns", [[ANSWER], [ANSWER, ANSWER]])
def test_every_error_but_a_message_too_long_is_raised(error: Exception, turns: list[Mapping[str, str]]) -> None:
    """A review's find: catching every InvalidInputError but ScopeError logged a bad scope id or a remote client's
    wrong path as "not stored as a memory", and every turn after it went unstored."""
    with pytest.raises(type(error)):
        store_turns(Add(error), turns)
    with pytest.raises(type(error)):
        asyncio.run(astore_turns(Add(error).aadd, turns))
