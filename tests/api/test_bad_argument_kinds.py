"""A bad argument gets the same typed error on every client, naming the argument, and writes nothing (tester
report on remote/local differences): a scope id that is not a string, on every method that takes one; a non-str
object key anywhere in ``metadata`` or ``filters`` (JSON would quietly send ``1`` as ``"1"``); a bool argument given
something else; a count given a bool or a string; a number that is NaN or an infinity. The remote clients refuse
what JSON cannot carry before sending, with the local client's own check, and the server's strict schemas refuse
the rest, so all four client kinds give one answer."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from typing import Any

import pytest
from client_adapter import ClientAdapter, MakeClient
from mem0_fakes import ScriptedGenerator, facts

from inferscale.errors import InvalidInputError, ScopeError

INF = float("inf")
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"
NAN = float("nan")

Call = Callable[[ClientAdapter, str], Any]

# Every method that takes scope ids, each given a non-str id ("kept" is the id of a stored memory).
SCOPED_CALLS: dict[str, Callable[[ClientAdapter, str, dict[str, Any]], Any]] = {
    "add": lambda m, i, ids: m.add("x", infer=False, **ids),
    "search": lambda m, i, ids: m.search("x", **ids),
    "get_all": lambda m, i, ids: m.get_all(**ids),
    "get_all-v2": lambda m, i, ids: m.get_all(filters={"k": "v"}, **ids),
    "delete_all": lambda m, i, ids: m.delete_all(**ids),
    "get": lambda m, i, ids: m.get(i, **ids),
    "update": lambda m, i, ids: m.update(i, "new text", **ids),
    "delete": lambda m, i, ids: m.delete(i, **ids),
    "history": lambda m, i, ids: m.history(i, **ids),
    "chat": lambda m, i, ids: m.chat("hi", **ids),
}
BAD_IDS: list[tuple[str, Any]] = [("user_id", b"5"), ("agent_id", ["a"]), ("run_id", 1.5), ("user_id", True)]


def _with_user(key: str, value: Any) -> dict[str, Any]:
    return {"user_id": "a", key: value} if key != "user_id" else {key: value}


SCOPE_CASES: list[Any] = [
    pytest.param(call, _with_user(key, value), key, id=f"{name}-{key}={value!r}")
    for name, call in SCOPED_CALLS.items()
    for key, value in BAD_IDS
]

# (id, call on (client, id of the kept memory), the argument the message must name)
INVALID_CASES: list[tuple[str, Call, str]] = [
    # non-str object keys, at any depth: JSON has none
    ("metadata-int-key", lambda m, i: m.add("x", user_id="a", metadata={1: "x"}, infer=False), "metadata"),
    ("metadata-tuple-key", lambda m, i: m.add("x", user_id="a", metadata={(1, 2): "x"}, infer=False), "metadata"),
    ("metadata-nested-key", lambda m, i: m.add("x", user_id="a", metadata={"a": {1: "x"}}, infer=False), r"\['a'\]"),
    ("metadata-list-key", lambda m, i: m.add("x", user_id="a", metadata={"a": [{2: 1}]}, infer=False), r"\[0\]"),
    ("metadata-nan", lambda m, i: m.add("x", user_id="a", metadata={"a": NAN}, infer=False), r"metadata\['a'\]"),
    ("update-metadata-key", lambda m, i: m.update(i, metadata={1: "x"}), "metadata"),
    ("update-metadata-deep", lambda m, i: m.update(i, metadata={"a": [{None: 1}]}), "metadata"),
    ("filters-int-key", lambda m, i: m.search("x", user_id="a", filters={1: "v"}), "filters"),
    ("filters-nested-key", lambda m, i: m.get_all(filters={"AND": [{"user_id": "a"}, {2: "v"}]}), "filters"),
    # an integer a filter cannot compare exactly (float() of it overflowed: a bare OverflowError, a 500 remotely)
    ("filters-int-beyond-64-bit", lambda m, i: m.search("x", user_id="a", filters={"k": {"gt": 10**400}}), "64-bit"),
    ("chat-filters-key", lambda m, i: m.chat("hi", user_id="a", filters={1: "v"}), "filters"),
    # a date is a filter's timestamp operand only, never metadata or a metadata operand
    ("metadata-date", lambda m, i: m.add("x", user_id="a", metadata={"on": date(2026, 1, 1)}, infer=False), "on"),
    ("filters-date-operand", lambda m, i: m.get_all(user_id="a", filters={"on": date(2026, 1, 1)}), "date"),
    # a new text that is no str, checked before the memory is looked up: a local client answered an unknown id's
    # MemoryNotFoundError, a remote one InvalidInputError (a differential fuzzer's find)
    ("update-unknown-data-false", lambda m, i: m.update(UNKNOWN_ID, data=False, user_id="a"), r"(^|body\.)data\b"),
    ("update-unknown-text-bytes", lambda m, i: m.update(UNKNOWN_ID, b"x"), "^text"),
    ("update-data-int", lambda m, i: m.update(i, data=5), r"(^|body\.)data\b"),
    # bool arguments given something else
    ("infer-str", lambda m, i: m.add("x", user_id="a", infer="yes"), "infer"),
    ("infer-int", lambda m, i: m.add("x", user_id="a", infer=1), "infer"),
    # None where the local default is not None: a remote client would leave it out and get the server's default
    ("infer-none", lambda m, i: m.add("x", user_id="a", infer=None), "infer must be True or False"),
    ("show_expired-none", lambda m, i: m.search("x", user_id="a", show_expired=None), "show_expired must be True"),
    ("chat-mode-none", lambda m, i: m.chat("hi", user_id="a", mode=None), "mode must be 'kv' or 'prompt', got None"),
    ("stream-none", lambda m, i: m.chat("hi", user_id="a", stream=None), "stream must be True or False"),
    ("encode_kv-str", lambda m, i: m.add("x", user_id="a", infer=False, encode_kv="yes"), "encode_kv"),
    ("encode_kv-int", lambda m, i: m.add("x", user_id="a", infer=False, encode_kv=1), "encode_kv"),
    ("show_expired-str", lambda m, i: m.search("x", user_id="a", show_expired="yes"), "show_expired"),
    ("rerank-str", lambda m, i: m.search("x", user_id="a", rerank="yes"), "rerank"),
    ("explain-int", lambda m, i: m.search("x", user_id="a", explain=1), "explain"),
    ("stream-int", lambda m, i: m.chat("hi", user_id="a", stream=1), "stream"),
    ("stream-str", lambda m, i: m.chat("hi", user_id="a", stream="yes"), "stream"),
    # counts given a bool, a string or a float
    ("search-limit-bool", lambda m, i: m.search("x", user_id="a", limit=True), "limit"),
    ("search-limit-str", lambda m, i: m.search("x", user_id="a", limit="5"), "limit"),
    ("search-top_k-bool", lambda m, i: m.search("x", user_id="a", top_k=False), "top_k"),
    ("get_all-limit-bool", lambda m, i: m.get_all(user_id="a", limit=True), "limit"),
    ("get_all-limit-float", lambda m, i: m.get_all(user_id="a", limit=1.0), "limit"),
    ("chat-limit-bool", lambda m, i: m.chat("hi", user_id="a", limit=True), "limit"),
    (
        "chat-max_new_tokens-bool",
        lambda m, i: m.chat("hi", user_id="a", max_new_tokens=True),
        "max_new_tokens|max_tokens",
    ),
    (
        "chat-max_new_tokens-str",
        lambda m, i: m.chat("hi", user_id="a", max_new_tokens="5"),
        "max_new_tokens|max_tokens",
    ),
    # each message names the argument the caller gave (tester report: chat named "query", "limit/top_k", "not both")
    ("chat-neither", lambda m, i: m.chat(user_id="a"), "neither was given"),
    ("chat-both", lambda m, i: m.chat("hi", messages=[{"role": "user", "content": "x"}], user_id="a"), "not both"),
    ("chat-search_query-empty", lambda m, i: m.chat("hi", user_id="a", search_query=""), "^search_query must be"),
    ("chat-limit-negative", lambda m, i: m.chat("hi", user_id="a", limit=-1), "^limit must be a non-negative int"),
    ("search-limit-negative", lambda m, i: m.search("x", user_id="a", limit=-1), "^limit must be a non-negative"),
    ("search-top_k-negative", lambda m, i: m.search("x", user_id="a", top_k=-1), "^top_k must be a non-negative"),
    # numbers that are not finite, and a threshold that is no number
    ("threshold-inf", lambda m, i: m.search("x", user_id="a", threshold=INF), "threshold"),
    ("threshold-minus-inf", lambda m, i: m.search("x", user_id="a", threshold=-INF), "threshold"),
    ("threshold-nan", lambda m, i: m.search("x", user_id="a", threshold=NAN), "threshold"),
    ("threshold-bool", lambda m, i: m.search("x", user_id="a", threshold=True), "threshold"),
    ("threshold-str", lambda m, i: m.search("x", user_id="a", threshold="0.5"), "threshold"),
    ("temperature-inf", lambda m, i: m.chat("hi", user_id="a", temperature=INF), "temperature"),
    ("top_p-nan", lambda m, i: m.chat("hi", user_id="a", top_p=NAN), "top_p"),
    ("repetition_penalty-inf", lambda m, i: m.chat("hi", user_id="a", repetition_penalty=INF), "repetition_penalty"),
    # an int past the float range (float() of it overflowed: a bare OverflowError) and a top_k past vLLM's int32
    ("temperature-int-beyond-float", lambda m, i: m.chat("hi", user_id="a", temperature=10**400), "temperature"),
    ("top_p-int-beyond-float", lambda m, i: m.chat("hi", user_id="a", top_p=10**400), "top_p"),
    ("top_k-beyond-int32", lambda m, i: m.chat("hi", user_id="a", top_k=2**31), "top_k"),
    # ints past Python's 4,300-digit str limit: the message's repr raised a bare ValueError (a review)
    ("threshold-5001-digits", lambda m, i: m.search("x", user_id="a", threshold=10**5000), "threshold"),
    ("limit-5001-digits", lambda m, i: m.search("x", user_id="a", limit=10**5000), "limit"),
    ("temperature-5001-digits", lambda m, i: m.chat("hi", user_id="a", temperature=10**5000), "temperature"),
    ("seed-5001-digits", lambda m, i: m.chat("hi", user_id="a", seed=10**5000), "seed"),
    ("top_k-5001-digits", lambda m, i: m.chat("hi", user_id="a", top_k=10**5000), "top_k"),
    ("metadata-5001-digits", lambda m, i: m.add("x", user_id="a", metadata={"n": 10**5000}, infer=False), "metadata"),
    ("update-metadata-5001-digits", lambda m, i: m.update(i, metadata={"n": [10**5000]}), r"metadata\['n'\]\[0\]"),
]


def _refused(
    m: ClientAdapter, row_counts: Callable[[], tuple[int, int]], call: Call, error: type[Exception], match: str
) -> None:
    """``call`` raises exactly ``error`` with a message matching ``match``, and the kept memory is all there is."""
    kept = m.add("kept", user_id="a", metadata={"k": "v"}, infer=False)["results"][0]["id"]
    before = row_counts()
    with pytest.raises(error, match=match) as refused:
        call(m, kept)
    assert type(refused.value) is error
    assert row_counts() == before == (1, 1)
    assert [r["memory"] for r in m.get_all(user_id="a")["results"]] == ["kept"]
    got = m.get(kept)
    assert got is not None and (got["metadata"], got["role"]) == ({"k": "v"}, "user")
    assert [h["event"] for h in m.history(kept)] == ["ADD"]


@pytest.mark.parametrize(("call", "ids", "key"), SCOPE_CASES)
def test_a_scope_id_that_is_not_a_string_is_a_scope_error_on_every_method(
    make: MakeClient,
    row_counts: Callable[[], tuple[int, int]],
    call: Callable[[ClientAdapter, str, dict[str, Any]], Any],
    ids: dict[str, Any],
    key: str,
) -> None:
    # Extraction answers a fact, so a call that got past the checks would store something.
    m = make(ScriptedGenerator(facts=facts("Likes tea")))
    message = f"{key} must be a non-empty string or an int, got "
    _refused(m, row_counts, lambda m, i: call(m, i, ids), ScopeError, message)


@pytest.mark.parametrize(("call", "match"), [c[1:] for c in INVALID_CASES], ids=[c[0] for c in INVALID_CASES])
def test_a_bad_argument_is_the_same_invalid_input_error_on_every_client(
    make: MakeClient, row_counts: Callable[[], tuple[int, int]], call: Call, match: str
) -> None:
    m = make(ScriptedGenerator(facts=facts("Likes tea")))
    _refused(m, row_counts, call, InvalidInputError, match)


def test_a_finite_threshold_still_filters(m: ClientAdapter) -> None:
    """The finite extremes of a threshold keep their meaning: below every score keeps all, above none."""
    m.add("Likes tea", user_id="a", infer=False)
    assert [r["memory"] for r in m.search("tea", user_id="a", threshold=-1e308)["results"]] == ["Likes tea"]
    assert m.search("tea", user_id="a", threshold=1e308)["results"] == []
    assert [r["memory"] for r in m.search("tea", user_id="a", threshold=-1)["results"]] == ["Likes tea"]
