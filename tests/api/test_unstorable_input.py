"""Text no backend or JSON wire can hold, and filters beyond their limits, are refused with InvalidInputError
before anything is written, the same way on SQLite and PostgreSQL and on every client (tester1 #2 and #3; issue 15,
item 4). Each case counts the rows of both tables before and after, and reads the scope afterwards: a refused value
must neither be stored nor break reads of the scope it was aimed at. An LLM answer holding such text is repaired
instead (issue 15, item 6: test_malformed_llm_answers.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from client_adapter import ClientAdapter, ClientKind, MakeClient
from mem0_fakes import ScriptedGenerator, facts
from sqlalchemy import event
from sqlalchemy.engine import Engine

from inferscale.errors import InvalidInputError, ScopeError
from inferscale.filters import MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_FILTER_VALUES
from inferscale.scope import MAX_ID_LENGTH

S = "\ud800"  # a lone high surrogate
LOW = "\udc00"  # a lone low surrogate
NUL = "\x00"

Call = Callable[[ClientAdapter, str], Any]


def _deep(value: object) -> dict[str, Any]:
    return {"a": {"b": [1, {"c": value}]}}


# (id, call on (client, id of the kept memory), a word the message must hold)
CASES: list[tuple[str, Call, str]] = [
    # lone surrogates: what add writes
    ("add-text", lambda m, i: m.add(f"x {S} y", user_id="a", infer=False), "messages"),
    ("add-low-surrogate", lambda m, i: m.add(f"x {LOW}", user_id="a", infer=False), "U\\+DC00"),
    ("add-message", lambda m, i: m.add([{"role": "user", "content": f"hi {S}"}], user_id="a"), r"messages\[0\]"),
    ("add-infer-text", lambda m, i: m.add(f"I like {S}", user_id="a"), "messages"),
    ("metadata-key", lambda m, i: m.add("ok", user_id="a", metadata={f"k{S}": "v"}, infer=False), "metadata"),
    ("metadata-value", lambda m, i: m.add("ok", user_id="a", metadata={"k": S}, infer=False), "metadata"),
    ("metadata-deep", lambda m, i: m.add("ok", user_id="a", metadata=_deep(S), infer=False), r"\['c'\]"),
    ("metadata-deep-key", lambda m, i: m.add("ok", user_id="a", metadata={"a": [{S: 1}]}, infer=False), "key"),
    ("user-id", lambda m, i: m.add("ok", user_id=f"a{S}", infer=False), "user_id"),
    ("agent-id", lambda m, i: m.add("ok", user_id="a", agent_id=S, infer=False), "agent_id"),
    ("run-id", lambda m, i: m.add("ok", user_id="a", run_id=S, infer=False), "run_id"),
    # lone surrogates: reads
    ("filter-key", lambda m, i: m.search("q", user_id="a", filters={f"k{S}": "v"}), "filters"),
    ("filter-value", lambda m, i: m.search("q", user_id="a", filters={"k": S}), "filters"),
    ("filter-in", lambda m, i: m.get_all(filters={"user_id": "a", "k": {"in": ["v", S]}}), "filters"),
    ("filter-nested", lambda m, i: m.get_all(filters={"AND": [{"user_id": "a"}, {"OR": [{"k": S}]}]}), "OR"),
    ("filter-id", lambda m, i: m.get_all(filters={"user_id": S}), "user_id"),
    ("query", lambda m, i: m.search(f"q {S}", user_id="a"), "Unicode"),
    ("get-all-user-id", lambda m, i: m.get_all(user_id=S), "user_id"),
    ("delete-all-user-id", lambda m, i: m.delete_all(user_id=S), "user_id"),
    ("get-id", lambda m, i: m.get(f"{i}{S}"), "memory_id"),
    ("history-id", lambda m, i: m.history(f"{i}{S}"), "memory_id"),
    ("delete-id", lambda m, i: m.delete(f"{i}{S}"), "memory_id"),
    # lone surrogates: update and chat
    ("update-text", lambda m, i: m.update(i, f"new {S}"), "text"),
    ("update-data", lambda m, i: m.update(i, data=f"new {S}"), "text"),
    ("update-metadata", lambda m, i: m.update(i, metadata={"note": "\ud83d"}), "metadata"),
    ("update-deep-metadata", lambda m, i: m.update(i, metadata=_deep(S)), "metadata"),
    (
        "chat-message",
        lambda m, i: m.chat(messages=[{"role": "user", "content": f"hi {S}"}], user_id="a"),
        "messages",
    ),
    ("chat-query", lambda m, i: m.chat(f"hi {S}", user_id="a"), "query|messages"),
    ("chat-search-query", lambda m, i: m.chat("hi", user_id="a", search_query=S), "query"),
    # NUL: PostgreSQL cannot store it, so neither backend takes it
    ("nul-text", lambda m, i: m.add(f"Door code is 12{NUL}34", user_id="a", infer=False), "NUL"),
    ("nul-message", lambda m, i: m.add([{"role": "user", "content": f"a{NUL}"}], user_id="a"), "NUL"),
    ("nul-user-id", lambda m, i: m.add("ok", user_id=f"z{NUL}1", infer=False), "user_id"),
    ("nul-metadata-key", lambda m, i: m.add("ok", user_id="a", metadata={f"k{NUL}": 1}, infer=False), "NUL"),
    ("nul-metadata-value", lambda m, i: m.add("ok", user_id="a", metadata=_deep(NUL), infer=False), "NUL"),
    ("nul-filter-key", lambda m, i: m.get_all(user_id="a", filters={f"k{NUL}": "v"}), "NUL"),
    ("nul-filter-value", lambda m, i: m.get_all(user_id="a", filters={"k": f"v{NUL}"}), "NUL"),
    ("nul-filter-id", lambda m, i: m.search("q", filters={"user_id": f"a{NUL}"}), "user_id"),
    ("nul-update-text", lambda m, i: m.update(i, f"new{NUL}"), "NUL"),
    ("nul-get-all-user-id", lambda m, i: m.get_all(user_id=f"a{NUL}"), "user_id"),
    ("nul-get-id", lambda m, i: m.get(f"{i}{NUL}"), "memory_id"),
    # NUL in a query: refused like every other string (tester report: a search and a chat's search_query took it)
    ("nul-query", lambda m, i: m.search(f"dog{NUL}", user_id="a"), "query holds a NUL character .* at index 3"),
    ("nul-search-query", lambda m, i: m.chat("hi", user_id="a", search_query=f"d{NUL}"), "search_query holds a NUL"),
    # a speaker name longer than the actor column: refused before the LLM is asked (it was refused only after the
    # whole extraction, and taken when another speaker's turns made the actor None)
    (
        "long-name",
        lambda m, i: m.add({"role": "user", "content": "I have a dog.", "name": "n" * 256}, user_id="a"),
        "message 0's name is 256 characters",
    ),
    (
        "long-name-beside-another",
        lambda m, i: m.add(
            [{"role": "user", "content": "Hi.", "name": "bo"}, {"role": "user", "content": "Yo.", "name": "n" * 300}],
            user_id="a",
        ),
        "message 1's name",
    ),
    (
        "long-name-verbatim",
        lambda m, i: m.add({"role": "user", "content": "ok", "name": "n" * 256}, user_id="a", infer=False),
        "name",
    ),
    # scope ids longer than their column
    ("long-user-id", lambda m, i: m.add("ok", user_id="u" * (MAX_ID_LENGTH + 1), infer=False), "user_id"),
    ("long-run-id", lambda m, i: m.add("ok", user_id="a", run_id="r" * 1000, infer=False), "run_id"),
    ("long-filter-id", lambda m, i: m.get_all(filters={"agent_id": "g" * (MAX_ID_LENGTH + 1)}), "agent_id"),
]


@pytest.mark.parametrize(("call", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_unstorable_text_is_refused_and_writes_nothing(
    make: MakeClient,
    client_kind: ClientKind,
    row_counts: Callable[[], tuple[int, int]],
    call: Call,
    match: str,
) -> None:
    # Extraction answers a plain fact, so an infer=True case that got past the checks would store something.
    m = make(ScriptedGenerator(facts=facts("Likes tea")))
    kept = m.add("kept", user_id="a", metadata={"k": "v"}, infer=False)["results"][0]["id"]
    before = row_counts()
    with pytest.raises(InvalidInputError, match=match) as refused:
        call(m, kept)
    assert type(refused.value) is InvalidInputError  # not ScopeError: the server answers 400 invalid_input
    assert row_counts() == before == (1, 1)
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["kept"]
    got = m.get(kept)
    assert got is not None and (got["metadata"], got["role"]) == ({"k": "v"}, "user")
    assert [h["event"] for h in m.history(kept)] == ["ADD"]


# Text that shows nothing: str.strip() keeps invisible format characters, so these were taken where whitespace is
# refused (a memory of one zero-width space was stored and listed as an empty line).
INVISIBLE = ["\u200b", " \u2060\ufeff\u00ad\u200d\t\u200c "]
BLANK_CASES: list[tuple[str, Call, type[Exception]]] = [
    ("add-text", lambda m, t: m.add(t, user_id="a", infer=False), InvalidInputError),
    ("add-message", lambda m, t: m.add([{"role": "user", "content": t}], user_id="a", infer=False), InvalidInputError),
    ("add-infer", lambda m, t: m.add(t, user_id="a"), InvalidInputError),
    ("update-text", lambda m, t: m.update(m.get_all(user_id="a")["results"][0]["id"], t), InvalidInputError),
    ("search-query", lambda m, t: m.search(t, user_id="a"), InvalidInputError),
    ("chat-query", lambda m, t: m.chat(t, user_id="a"), InvalidInputError),
    ("user-id", lambda m, t: m.add("ok", user_id=t, infer=False), ScopeError),
    ("run-id", lambda m, t: m.get_all(user_id="a", run_id=t), ScopeError),
]


@pytest.mark.parametrize("text", INVISIBLE, ids=ascii)
@pytest.mark.parametrize(("call", "error"), [c[1:] for c in BLANK_CASES], ids=[c[0] for c in BLANK_CASES])
def test_text_of_invisible_characters_only_is_refused_as_blank(
    make: MakeClient,
    row_counts: Callable[[], tuple[int, int]],
    call: Call,
    error: type[Exception],
    text: str,
) -> None:
    m = make(ScriptedGenerator(facts=facts("Likes tea")))
    m.add("kept", user_id="a", infer=False)
    with pytest.raises(error, match=r"empty|whitespace|non-empty") as refused:
        call(m, text)
    assert type(refused.value) is error
    assert row_counts() == (1, 1)
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["kept"]


def test_an_extracted_fact_of_invisible_characters_is_dropped(make: MakeClient) -> None:
    """The extraction LLM's blank-looking fact is dropped as an empty one is, and the rest of the answer stored."""
    m = make(ScriptedGenerator(facts=json.dumps({"facts": ["\u200b", "Likes tea", "\u2060 \ufeff"]})))
    assert [r["memory"] for r in m.add("I like tea", user_id="a")["results"]] == ["Likes tea"]
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["Likes tea"]


def test_text_with_something_to_show_beside_invisible_characters_is_stored(m: ClientAdapter) -> None:
    for text in ("a\u200b", "\U0001f468\u200d\U0001f469", "\u0915\u094d\u200d"):  # a ZWJ emoji, Devanagari with ZWJ
        added = m.add(text, user_id="a", infer=False)["results"][0]
        assert m.get(added["id"])["memory"] == text  # type: ignore[index]


def test_a_refused_update_leaves_the_scope_readable(
    m: ClientAdapter, row_counts: Callable[[], tuple[int, int]]
) -> None:
    """The tester's case: a lone surrogate in metadata used to be stored, and every read of the scope then failed."""
    kept = m.add("Lives in Lisbon", user_id="u1", metadata={"city": "Lisbon"}, infer=False)["results"][0]["id"]
    with pytest.raises(InvalidInputError, match="metadata"):
        m.add("x", user_id="u1", metadata={f"k{NUL}": S}, infer=False)
    with pytest.raises(InvalidInputError, match="metadata"):
        m.update(kept, metadata={"note": "\ud83d"})
    assert row_counts() == (1, 1)
    assert [r["memory"] for r in m.get_all(user_id="u1")["results"]] == ["Lives in Lisbon"]
    assert [r["id"] for r in m.search("Lisbon", user_id="u1")["results"]] == [kept]
    got = m.get(kept)
    assert got is not None and (got["metadata"], got["role"]) == ({"city": "Lisbon"}, "user")
    assert [h["event"] for h in m.history(kept)] == ["ADD"]


def test_text_that_is_storable_round_trips(m: ClientAdapter) -> None:
    """The checks refuse only what cannot be held: paired surrogates (an emoji), control characters other than NUL,
    CJK text and a scope id of exactly the column's width are stored and read back unchanged."""
    text = "Loves 😀 and 東京\t(tab)\x01"
    user = "u" * MAX_ID_LENGTH
    meta = {"ключ": ["😀", {"名前": "x\x1f"}], "tag": "😀"}
    added = m.add(text, user_id=user, metadata=meta, infer=False)["results"][0]
    got = m.get(added["id"])
    assert (
        got is not None
        and got["memory"] == text
        and got["user_id"] == user
        and (got["metadata"], got["role"]) == (meta, "user")
    )
    assert [r["memory"] for r in m.get_all(filters={"user_id": user, "tag": {"in": ["😀", "x"]}})["results"]] == [text]
    assert [r["memory"] for r in m.search("Loves", user_id=user)["results"]] == [text]


# ---- filter limits (tester1 #3) -------------------------------------------------------------------------------


def _conditions(n: int) -> dict[str, Any]:
    return {"AND": [{"user_id": "a"}, *({f"k{i}": i} for i in range(n - 1))]}


def _nested(depth: int, value: object = "v") -> dict[str, Any]:
    """``{"user_id": "a", "OR": [{"OR": [... {"k": value} ...]}]}`` with ``depth`` nested ORs."""
    node: dict[str, Any] = {"k": value}
    for _ in range(depth):
        node = {"OR": [node]}
    return {"user_id": "a", **node}


LIMIT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("conditions", _conditions(MAX_FILTER_CONDITIONS + 1), "conditions"),
    ("depth", _nested(MAX_FILTER_DEPTH + 1), "deeper"),
    ("one-list", {"user_id": "a", "k": {"in": list(range(MAX_FILTER_VALUES + 1))}}, "at most"),
    ("huge-list", {"user_id": "a", "k": {"in": list(range(60_000))}}, "at most"),
    (
        "lists-together",
        {"user_id": "a", "AND": [{f"k{i}": {"nin": list(range(300))}} for i in range(4)]},
        "together",
    ),
    ("tester-300x50", {"AND": [{"user_id": "a"}, *({f"k{i}": {"in": list(range(50))}} for i in range(300))]}, "limit"),
]


@pytest.mark.parametrize(("filters", "match"), [c[1:] for c in LIMIT_CASES], ids=[c[0] for c in LIMIT_CASES])
def test_a_filter_beyond_its_limits_is_refused_at_once(
    m: ClientAdapter, row_counts: Callable[[], tuple[int, int]], filters: dict[str, Any], match: str
) -> None:
    m.add("kept", user_id="a", metadata={"k": 1}, infer=False)
    for call in (lambda: m.get_all(filters=filters), lambda: m.search("kept", filters=filters)):
        with (
            _memory_reads() as reads,
            pytest.raises(InvalidInputError, match=match if match != "limit" else "conditions|values") as refused,
        ):
            call()
        assert not isinstance(refused.value, ScopeError)
        assert reads == []  # refused before any SQL reaches the memories, not after minutes of it
    with _memory_reads() as reads:
        m.get_all(user_id="a")
    assert reads  # the check sees the reads an accepted call makes
    assert row_counts() == (1, 1)


@contextmanager
def _memory_reads() -> Iterator[list[str]]:
    """The SQL statements that name the ``memories`` table, run by any engine of this process (the servers of the
    remote kinds run in a thread of it) while the block runs."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if re.search(r"\bmemories\b", statement):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def test_a_filter_at_its_limits_is_answered(m: ClientAdapter) -> None:
    """The limits themselves are allowed, and answered correctly on both backends."""
    m.add("kept", user_id="a", metadata={"k": 7, "n": 3}, infer=False)
    m.add("other", user_id="a", metadata={"k": -1, "n": 3}, infer=False)
    widest: list[dict[str, Any]] = [{"user_id": "a"}, {"k": {"in": list(range(MAX_FILTER_VALUES))}}]
    widest += [{"n": {"lte": 3 + i}} for i in range(MAX_FILTER_CONDITIONS - 2)]
    assert [r["memory"] for r in m.get_all(filters={"AND": widest})["results"]] == ["kept"]
    assert [r["memory"] for r in m.get_all(filters=_nested(MAX_FILTER_DEPTH, 7))["results"]] == ["kept"]
    assert [r["memory"] for r in m.get_all(filters=_nested(MAX_FILTER_DEPTH, 8))["results"]] == []


def test_in_and_nin_match_by_json_type(m: ClientAdapter) -> None:
    """A long ``in`` list compiles to one SQL ``IN`` per JSON type; values still match only their own type."""
    for text, meta in [
        ("str", {"k": "1"}),
        ("int", {"k": 1}),
        ("real", {"k": 2.5}),
        ("true", {"k": True}),
        ("null", {"k": None}),
        ("none", {}),
    ]:
        m.add(text, user_id="t", metadata=meta, infer=False)

    def found(condition: dict[str, Any]) -> list[object]:
        return [r["memory"] for r in m.get_all(filters={"user_id": "t", "k": condition})["results"]]

    assert found({"in": ["1"]}) == ["str"]
    assert found({"in": [1]}) == ["int"]
    assert found({"in": [1.0, 2.5, "x"]}) == ["int", "real"]
    assert found({"in": [True]}) == ["true"]
    assert found({"in": [None, "1"]}) == ["str", "null"]
    assert found({"nin": [1, True]}) == ["str", "real", "null", "none"]
    assert found({"in": list(range(-MAX_FILTER_VALUES + 2, 2))}) == ["int"]


def test_a_speaker_name_too_long_to_store_is_refused_before_the_llm_is_asked(make: MakeClient) -> None:
    """The failing input: a 300-character ``name`` took the whole extraction (91 s with the embedded model) before
    the actor column refused it; it is refused with no LLM call."""
    generator = ScriptedGenerator(facts=facts("Has a beagle named Biscuit"))
    m = make(generator)
    message = {"role": "user", "content": "I adopted a beagle named Biscuit.", "name": "n" * 300}
    with pytest.raises(InvalidInputError, match="message 0's name is 300 characters; at most 255 are stored"):
        m.add(message, user_id="a")
    assert generator.calls == []
    assert m.add({**message, "name": "n" * 255}, user_id="a")["results"][0]["memory"] == "Has a beagle named Biscuit"
    assert len(generator.calls) == 1
