"""Chinese text with the real default embedder (all-MiniLM-L6-v2, English-centric): what works and what does not.

Measured (see docs/migration.md): a Chinese query that shares characters with a Chinese memory finds it first;
a Chinese query about an English memory does not rank it first without a filter. The walnut case relies on the
metadata filter, which restricts the search to matching memories inside SQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import ScriptedGenerator, facts, fake_config

from inferscale import MemoryClient

pytestmark = pytest.mark.slow  # every test loads the MiniLM embedder

DISTRACTORS = [
    "My dog is a beagle named Pip.",
    "I live in Porto.",
    "我喜欢在周末去爬山。",
    "我的猫叫小白。",
    "Works as a nurse at the city hospital.",
]


def test_walnut_allergy_found_by_a_chinese_query_with_filters(tmp_path: Path, embedder: Any) -> None:
    m = MemoryClient(fake_config(tmp_path), embedder=embedder)
    scope = {"user_id": "a", "agent_id": "g1", "run_id": "s1"}
    m.add("I'm allergic to walnuts", **scope, metadata={"food": "walnut"}, infer=False)
    for text in DISTRACTORS:
        m.add(text, **scope, metadata={"food": "other"}, infer=False)
    query = "我对坚果过敏吗？"
    hits = m.search(query, user_id="a", agent_id="g1", filters={"food": "walnut"})["results"]
    assert [h["memory"] for h in hits] == ["I'm allergic to walnuts"]
    assert m.search(query, user_id="a", agent_id="g1", filters={"food": "peanut"})["results"] == []
    # v2 shape, ids inside the filter.
    v2 = m.search(query, filters={"AND": [{"user_id": "a"}, {"agent_id": "g1"}, {"food": "walnut"}]}, top_k=3)
    assert [h["memory"] for h in v2["results"]] == ["I'm allergic to walnuts"]
    # Without the filter MiniLM does not bridge Chinese to English: the English memory is not ranked first.
    unfiltered = m.search(query, user_id="a", agent_id="g1", limit=1)["results"]
    assert unfiltered[0]["memory"] != "I'm allergic to walnuts"


def test_chinese_memory_kept_verbatim_and_found(tmp_path: Path, embedder: Any) -> None:
    content = "我叫林晓雨，在青木科技做产品经理。"
    fact = "林晓雨在青木科技做产品经理"
    add = json.dumps({"memory": [{"id": "new", "text": fact, "event": "ADD"}]}, ensure_ascii=False)
    gen = ScriptedGenerator(facts=facts(fact), decisions=add)
    m = MemoryClient(fake_config(tmp_path), embedder=embedder, generator=gen)
    for text in DISTRACTORS:
        m.add(text, user_id="cn1", infer=False)
    added = m.add([{"role": "user", "content": content}], user_id="cn1")["results"]
    assert [r["memory"] for r in added] == [fact]
    stored = m.get(added[0]["id"])
    assert stored is not None and "林晓雨" in stored["memory"] and "青木科技" in stored["memory"]
    for query in ("林晓雨在哪家公司工作？", "青木科技"):
        top = m.search(query, user_id="cn1", limit=1)["results"]
        assert top[0]["memory"] == fact, query
    # infer=False keeps the message itself, byte for byte.
    verbatim = m.add(content, user_id="cn2", infer=False)["results"][0]
    assert m.get(verbatim["id"])["memory"] == content  # type: ignore[index]
