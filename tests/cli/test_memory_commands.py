"""``inferscale add | search | list | delete | history`` on a real MemoryClient (fake models): ``--json`` prints
exactly what the client returns for the same call, the tables show the facts people need."""

from __future__ import annotations

from collections.abc import Callable

from cli_runner import Fakes, Ran
from mem0_fakes import facts

from inferscale import MemoryClient
from inferscale.memory.prompts import CUSTOM_INSTRUCTIONS_HEADER

FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]


def _add_facts(cli: Callable[..., Ran], user: str = "alice") -> list[str]:
    ids = []
    for fact in FACTS:
        ran = cli("add", fact, "--user", user, "--no-infer", "--json")
        assert ran.code == 0, ran.err
        ids += [r["id"] for r in ran.json()["results"]]
    return ids


def test_add_json_is_the_clients_return_and_the_memories_are_stored(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    ran = cli("add", FACTS[0], "--user", "alice", "--no-infer", "--metadata", '{"topic": "pets"}', "--json")
    assert ran.code == 0 and ran.err == ""
    results = ran.json()["results"]
    assert [(r["memory"], r["event"]) for r in results] == [(FACTS[0], "ADD")]
    stored = reference().get_all(user_id="alice")["results"]
    assert [(m["id"], m["memory"], m["metadata"], m["role"]) for m in stored] == [
        (results[0]["id"], FACTS[0], {"topic": "pets"}, "user")
    ]


def test_add_with_infer_stores_the_extracted_facts(
    cli: Callable[..., Ran], fakes: Fakes, reference: Callable[[], MemoryClient]
) -> None:
    fakes.generator.answers["ExtractedFacts"] = [facts("Lives in Porto", "Has a beagle")]
    ran = cli("add", "I live in Porto and I have a beagle.", "--user", "alice", "--json")
    assert ran.code == 0, ran.err
    assert [(r["memory"], r["event"]) for r in ran.json()["results"]] == [
        ("Lives in Porto", "ADD"),
        ("Has a beagle", "ADD"),
    ]
    assert fakes.generator.titles()[0] == "ExtractedFacts"
    assert sorted(m["memory"] for m in reference().get_all(user_id="alice")["results"]) == [
        "Has a beagle",
        "Lives in Porto",
    ]


def test_add_prompt_gives_the_extraction_its_custom_instructions(cli: Callable[..., Ran], fakes: Fakes) -> None:
    fakes.generator.answers["ExtractedFacts"] = [facts("Alice is vegetarian")]
    ran = cli("add", "I'm vegetarian and I work at Acme.", "--user", "alice", "--prompt", "Only food.", "--json")
    assert ran.code == 0, ran.err
    assert [r["memory"] for r in ran.json()["results"]] == ["Alice is vegetarian"]
    system = fakes.generator.calls[0][1][0]["content"]
    assert system.endswith(f"\n{CUSTOM_INSTRUCTIONS_HEADER}\nOnly food.")
    refused = cli("add", "I'm vegetarian.", "--user", "alice", "--no-infer", "--prompt", "Only food.")
    assert refused.code == 2 and "needs infer=True" in refused.err


def test_add_table_names_each_change(cli: Callable[..., Ran]) -> None:
    ran = cli("add", FACTS[1], "--user", "alice", "--run", "r1", "--no-infer")
    assert ran.code == 0
    assert "1 change for user=alice run=r1" in ran.out
    row = next(line for line in ran.out.splitlines() if FACTS[1] in line)
    assert "ADD" in row


def test_search_json_equals_the_clients_search(cli: Callable[..., Ran], reference: Callable[[], MemoryClient]) -> None:
    _add_facts(cli)
    _add_facts(cli, user="bob")
    ran = cli("search", "Where does my sister live?", "--user", "alice", "--limit", "2", "--json")
    assert ran.code == 0 and ran.err == ""
    expected = reference().search("Where does my sister live?", user_id="alice", limit=2)
    assert ran.json() == expected
    assert len(expected["results"]) == 2 and all(m["user_id"] == "alice" for m in expected["results"])


def test_search_threshold_and_filters_reach_the_client(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    cli("add", FACTS[0], "--user", "alice", "--no-infer", "--metadata", '{"topic": "pets"}')
    cli("add", FACTS[1], "--user", "alice", "--no-infer", "--metadata", '{"topic": "home"}')
    ran = cli("search", "beagle Porto", "--user", "alice", "--filters", '{"topic": "home"}', "--json")
    assert [m["memory"] for m in ran.json()["results"]] == [FACTS[1]]
    ref = reference()
    top = ref.search("My dog is a beagle", user_id="alice")["results"][0]["score"]
    high = cli("search", "My dog is a beagle", "--user", "alice", "--threshold", str(top + 1e-6), "--json")
    assert high.json() == {"results": []}
    at = cli("search", "My dog is a beagle", "--user", "alice", "--threshold", str(top), "--json")
    assert [m["memory"] for m in at.json()["results"]] == [FACTS[0]]


def test_search_table_shows_id_text_scope_and_score(
    cli: Callable[..., Ran], reference: Callable[[], MemoryClient]
) -> None:
    _add_facts(cli)
    ran = cli("search", "I live in Porto.", "--user", "alice", "--limit", "1")
    assert ran.code == 0
    best = reference().search("I live in Porto.", user_id="alice", limit=1)["results"][0]
    assert "1 memory of user=alice for 'I live in Porto.'" in ran.out
    row = next(line for line in ran.out.splitlines() if best["id"] in line)
    assert "I live in Porto." in row and "user=alice" in row and f"{best['score']:.3f}" in row
    assert best["created_at"][:10] in row


def test_list_json_and_table(cli: Callable[..., Ran], reference: Callable[[], MemoryClient]) -> None:
    ids = _add_facts(cli)
    _add_facts(cli, user="bob")
    ran = cli("list", "--user", "alice", "--json")
    assert ran.json() == reference().get_all(user_id="alice")
    assert [m["id"] for m in ran.json()["results"]] == ids
    limited = cli("list", "--user", "alice", "--limit", "2", "--json")
    assert [m["id"] for m in limited.json()["results"]] == ids[:2]
    table = cli("list", "--user", "alice")
    assert "3 memories of user=alice" in table.out
    for memory_id, fact in zip(ids, FACTS, strict=True):
        row = next(line for line in table.out.splitlines() if memory_id in line)
        assert fact in row and "user=alice" in row
    assert "bob" not in table.out


def test_delete_one_and_all(cli: Callable[..., Ran], reference: Callable[[], MemoryClient]) -> None:
    ids = _add_facts(cli)
    _add_facts(cli, user="bob")
    one = cli("delete", ids[0], "--json")
    assert one.json() == {"message": "Memory deleted successfully!"}
    table = cli("delete", ids[1], "--user", "alice")
    assert table.code == 0 and f"deleted memory {ids[1]}" in table.out
    every = cli("delete", "--all", "--user", "alice", "--json")
    assert every.json() == {"message": "Memories deleted successfully!", "deleted": 1}
    ref = reference()
    assert ref.get_all(user_id="alice")["results"] == []
    assert len(ref.get_all(user_id="bob")["results"]) == 3


def test_delete_all_table_counts(cli: Callable[..., Ran]) -> None:
    _add_facts(cli)
    ran = cli("delete", "--all", "--user", "alice")
    assert ran.code == 0 and "deleted 3 memories of user=alice" in ran.out


def test_history_json_and_table(cli: Callable[..., Ran], reference: Callable[[], MemoryClient]) -> None:
    memory_id = _add_facts(cli)[0]
    cli("delete", memory_id)
    ran = cli("history", memory_id, "--json")
    expected = reference().history(memory_id)
    assert ran.json() == expected
    assert [h["event"] for h in expected] == ["ADD", "DELETE"]
    table = cli("history", memory_id)
    assert f"2 changes to memory {memory_id}" in table.out
    events = [line for line in table.out.splitlines() if "ADD" in line or "DELETE" in line]
    assert len(events) == 2 and FACTS[0] in events[0] and FACTS[0] in events[1]
