"""An ``add(infer=True)`` whose reconcile decision was made on a memory's text that another call changes or deletes
while the LLM answers (tester report: an async service, seconds of LLM latency). The UPDATE or DELETE was applied to
whatever the memory held by then: an acknowledged ``update()`` was overwritten, or its memory deleted; and an UPDATE
whose memory was deleted meanwhile was skipped with its new fact, which was stored nowhere. A decision now applies
only to the text the LLM was shown, and a skipped UPDATE adds its fact. Two clients on one database stand for the
two calls; the other call lands inside the reconcile LLM's answer, deterministically."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config, shown_memories

from inferscale import MemoryClient

OLD, NEWER, FACT = "Lives in Lisbon", "Lives in Lisbon with my dog Rex", "Lives in Porto"


def _decide(event: str, meanwhile: Callable[[], None]) -> Callable[[list[dict[str, str]]], str]:
    """A reconcile answer deciding ``event`` on the one memory shown, after ``meanwhile`` ran (the other call)."""

    def answer(messages: list[dict[str, str]]) -> str:
        (shown,) = shown_memories(messages)
        assert shown["text"] == OLD
        meanwhile()
        return json.dumps({"memory": [{"id": shown["id"], "text": FACT, "event": event, "old_memory": OLD}]})

    return answer


@pytest.mark.parametrize("event", ["UPDATE", "DELETE"])
def test_a_decision_on_a_text_updated_meanwhile_leaves_the_update_standing(
    tmp_path: Path, db_url: str, event: str
) -> None:
    config = fake_config(tmp_path, db_url)
    with MemoryClient(config, embedder=HashEmbedder()) as other:
        memory_id = other.add(OLD, user_id="u", infer=False)["results"][0]["id"]
        generator = ScriptedGenerator(
            facts=facts(FACT), decisions=_decide(event, lambda: other.update(memory_id, NEWER))
        )
        with MemoryClient(config, embedder=HashEmbedder(), generator=generator) as adding:
            results = adding.add("I moved to Porto.", user_id="u")["results"]
        assert [(r["memory"], r["event"]) for r in results] == [(FACT, "ADD")]
        assert other.get(memory_id)["memory"] == NEWER
        assert sorted(r["memory"] for r in other.get_all(user_id="u")["results"]) == [NEWER, FACT]
        assert [h["event"] for h in other.history(memory_id)] == ["ADD", "UPDATE"]


def test_the_fact_of_an_update_whose_memory_was_deleted_meanwhile_is_added(tmp_path: Path, db_url: str) -> None:
    config = fake_config(tmp_path, db_url)
    with MemoryClient(config, embedder=HashEmbedder()) as other:
        memory_id = other.add(OLD, user_id="u", infer=False)["results"][0]["id"]
        generator = ScriptedGenerator(facts=facts(FACT), decisions=_decide("UPDATE", lambda: other.delete(memory_id)))
        with MemoryClient(config, embedder=HashEmbedder(), generator=generator) as adding:
            results = adding.add("I moved to Porto.", user_id="u")["results"]
        assert [(r["memory"], r["event"]) for r in results] == [(FACT, "ADD")]
        assert [r["memory"] for r in other.get_all(user_id="u")["results"]] == [FACT]
