"""Metadata filters answer alike on SQLite and PostgreSQL for any key (issue 15, item 5).

A key is compared as the text it is, never spliced into a JSON path: non-ASCII letters, emoji, quotes,
backslashes, dots, spaces, ``$``, brackets and SQL wildcards all work. Each key is stored in a row set built to
catch the ways a path goes wrong (a nested path that looks like the key, a near-miss key, each JSON type of value,
a missing key), and every operator is checked against a Python reference of the documented semantics.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from inferscale.filters import And, Condition, Filter, Not, Or, parse_filters
from inferscale.scope import Scope
from inferscale.storage import MemoryStore

SCOPE = Scope(user_id="u8")


def _escaped(key: str) -> str:
    """``key`` as ASCII-only JSON spells it, quotes left off (``"café"`` → ``caf\\u00e9``): another key, stored
    as text that holds what ``key``'s stored text holds."""
    return json.dumps(key)[1:-1]


KEYS = [
    "café",
    "名前",
    "ключ",
    "😀",
    "e\u0301",  # "é" decomposed: another key than "café"'s precomposed é, on both backends
    "a.b",
    "a b",
    'we"ird',
    "it's",
    "back\\slash",
    '\\"',
    "$",
    "$.a",
    "[0]",
    "a[0]",
    "*",
    "%_",
    "tab\tand\nnewline",
    "1",
    "ASCII",
]

# (text, metadata) for key ``k``: every JSON type under the key, and rows that hold the same value elsewhere
ROWS: list[tuple[str, Any]] = [
    ("string", lambda k: {k: "Lumen"}),
    ("other string", lambda k: {k: "Other"}),
    ("integer", lambda k: {k: 5}),
    ("real", lambda k: {k: 2.5}),
    ("true", lambda k: {k: True}),
    ("null", lambda k: {k: None}),
    ("object", lambda k: {k: {k: "Lumen"}}),
    ("list", lambda k: {k: ["Lumen"]}),
    ("missing", lambda k: {"unrelated": "Lumen"}),
    ("no metadata", lambda k: {}),
    ("near miss", lambda k: {k + "x": "Lumen", "x" + k: 5}),
    ("nested under a dot", lambda k: {k.split(".")[0]: {k.split(".")[-1]: "Lumen"}} if "." in k else {"y": 1}),
    ("escaped twin", lambda k: {_escaped(k): "Lumen"} if _escaped(k) != k else {"z": 0}),
]

FILTERS: list[Any] = [
    lambda k: {k: "Lumen"},
    lambda k: {k: {"eq": "Lumen"}},
    lambda k: {k: {"ne": "Lumen"}},
    lambda k: {k: {"in": ["Lumen", 5]}},
    lambda k: {k: {"nin": ["Lumen", 5]}},
    lambda k: {k: {"gt": 3}},
    lambda k: {k: {"gte": 2.5}},
    lambda k: {k: {"lt": 5}},
    lambda k: {k: {"lte": 5, "gt": 2.5}},
    lambda k: {k: {"contains": "ume"}},
    lambda k: {k: {"icontains": "LUM"}},
    lambda k: {k: "*"},
    lambda k: {k: True},
    lambda k: {k: None},
    lambda k: {"NOT": [{k: "Lumen"}]},
    lambda k: {"NOT": {k: "*"}},
    lambda k: {"AND": [{k: "*"}, {k: {"ne": "Other"}}]},
    lambda k: {"OR": [{k: "Lumen"}, {k: {"gte": 5}}]},
]


# ---- the reference: the semantics docs/api.md states, in Python --------------------------------------------------


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "container"


def _equal(stored: object, operand: object) -> bool:
    return _json_type(stored) == _json_type(operand) and stored == operand


def _holds(cond: Condition, metadata: Mapping[str, Any]) -> bool:
    present = cond.field in metadata
    stored = metadata.get(cond.field)
    operands = cond.value if isinstance(cond.value, tuple) else ()
    if cond.op == "exists":
        return present and stored is not None
    if cond.op == "eq":
        return present and _equal(stored, cond.value)
    if cond.op == "ne":
        return not (present and _equal(stored, cond.value))
    if cond.op == "in":
        return present and any(_equal(stored, v) for v in operands)
    if cond.op == "nin":
        return not (present and any(_equal(stored, v) for v in operands))
    if not present or _json_type(stored) != _json_type(cond.value):
        return False
    if cond.op == "contains":
        return str(cond.value) in str(stored)
    if cond.op == "icontains":
        return str(cond.value).lower() in str(stored).lower()
    compare = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}[cond.op]
    return bool(compare(stored, cond.value))


def _matches(node: Filter, metadata: Mapping[str, Any]) -> bool:
    if isinstance(node, And):
        return all(_matches(p, metadata) for p in node.parts)
    if isinstance(node, Or):
        return any(_matches(p, metadata) for p in node.parts)
    if isinstance(node, Not):
        return not _matches(node.part, metadata)
    return _holds(node, metadata)


# ---- the test ------------------------------------------------------------------------------------------------------


@pytest.fixture
def store(db_url: str) -> Iterator[MemoryStore]:
    store = MemoryStore(db_url)
    yield store
    store.close()


def test_the_reference_is_not_vacuous() -> None:
    """Each filter selects some rows and leaves others, so an answer of all or nothing fails the test below."""
    rows = {text: make("café") for text, make in ROWS}
    for make_filter in FILTERS:
        node = parse_filters(make_filter("café"))
        assert node is not None
        chosen = {text for text, metadata in rows.items() if _matches(node, metadata)}
        assert chosen and chosen != set(rows), make_filter("café")


@pytest.mark.parametrize("key", KEYS, ids=[k.encode("unicode_escape").decode("ascii") for k in KEYS])
def test_every_operator_on_any_key_matches_the_reference(store: MemoryStore, key: str) -> None:
    rows = {text: make(key) for text, make in ROWS}
    for text, metadata in rows.items():
        store.add(text, SCOPE, metadata)
    wrong = {}
    for make_filter in FILTERS:
        filters = make_filter(key)
        node = parse_filters(filters)
        assert node is not None
        expected = sorted(text for text, metadata in rows.items() if _matches(node, metadata))
        got = sorted(m.text for m in store.list(SCOPE, filters=node))
        if got != expected:
            wrong[repr(filters)] = {"expected": expected, "got": got}
    assert wrong == {}


BIG = {
    "2**53": 2**53,
    "2**53 + 1": 2**53 + 1,
    "2**62 + 1": 2**62 + 1,
    "2**63 - 1": 2**63 - 1,
    "-(2**63)": -(2**63),
    "2.5": 2.5,
    "2.0**60": 2.0**60,  # a real whose JSON text (1.152921504606847e+18) is not its exact value
    "string": "9007199254740993",
}
BIG_FILTERS: list[dict[str, Any]] = [
    {"n": 2**53 + 1},
    {"n": 2**53},
    {"n": {"ne": 2**53}},
    {"n": {"gt": 2**53}},
    {"n": {"gte": 2**62 + 1}},
    {"n": {"lt": 2**53 + 1}},
    {"n": {"lte": -(2**63)}},
    {"n": {"in": [2**53 + 1, 2**63 - 1]}},
    {"n": {"nin": [2**53, 2.5]}},
    {"n": {"gt": 2, "lt": 3}},
    {"n": 2**60},  # equals the real 2.0**60 exactly
    {"n": {"in": [2**60 + 1, 2.5]}},  # no real equals 2**60 + 1
    {"n": {"lt": 2**60 + 1, "gt": 2**53 + 1}},  # the real 2.0**60 lies between
    {"n": {"gte": 2**60 + 1}},
    {"n": {"in": [2**60, 2**53 + 1]}},
    {"n": 9007199254740992.0},  # a float operand: 2**53 exactly, not 2**53 + 1
    {"n": {"gt": 9007199254740992.0}},
]


def test_integers_beyond_what_a_double_holds_compare_exactly(store: MemoryStore) -> None:
    """Integers compare as integers, not as doubles (exact only to 2**53): 64-bit ids kept in metadata, such as
    Snowflake ids, match themselves and not a neighbour (tester report: ``{"order_id": 2**53 + 1}`` matched the
    memory of ``2**53``)."""
    rows = {text: {"n": value} for text, value in BIG.items()}
    for text, metadata in rows.items():
        store.add(text, SCOPE, metadata)
    wrong = {}
    for filters in BIG_FILTERS:
        node = parse_filters(filters)
        assert node is not None
        expected = sorted(text for text, metadata in rows.items() if _matches(node, metadata))
        assert expected and len(expected) < len(rows), filters  # the reference selects some rows, not all
        got = sorted(m.text for m in store.list(SCOPE, filters=node))
        if got != expected:
            wrong[repr(filters)] = {"expected": expected, "got": got}
    assert wrong == {}
