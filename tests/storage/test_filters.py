"""The Mem0 filter grammar: parsing into a tree, errors that name the fix, and the ids a filter pins."""

from __future__ import annotations

import pytest

from inferscale.errors import InvalidInputError, ScopeError
from inferscale.filters import And, Condition, Not, Or, parse_filters, parse_timestamp, required_ids


def test_filters_parse_into_a_tree() -> None:
    assert parse_filters(None) is None and parse_filters({}) is None
    assert parse_filters({"food": "walnut"}) == Condition("food", "eq", "walnut")
    assert parse_filters({"food": "*"}) == Condition("food", "exists", None)
    assert parse_filters({'we"ird\\': 1}) == Condition('we"ird\\', "eq", 1)  # any key: it is never spliced into SQL
    tree = parse_filters({"AND": [{"user_id": "a"}, {"OR": [{"n": {"gt": 1}}, {"NOT": {"k": {"in": ["x"]}}}]}]})
    assert tree == And(
        (Condition("user_id", "eq", "a"), Or((Condition("n", "gt", 1), Not(Condition("k", "in", ("x",))))))
    )
    assert parse_filters({"$or": [{"a": 1}, {"b": 2}]}) == Or((Condition("a", "eq", 1), Condition("b", "eq", 2)))
    when = parse_filters({"created_at": {"gte": "2024-07-01"}})
    assert isinstance(when, Condition) and when.value == parse_timestamp("2024-07-01T00:00:00Z")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"a": {"between": 1}}, "unknown operator"),
        ({"a": ["x"]}, "'in'"),
        ({"a": {"in": "x"}}, "non-empty list"),
        ({"a": {"contains": 3}}, "string"),
        ({"a": {"gt": None}}, "compare"),
        ({"AND": []}, "non-empty list"),
        ({"user_id": {"gt": "a"}}, "does not support"),
        ({"created_at": {"gte": "yesterday"}}, "ISO 8601"),
        ({"a": float("nan")}, "finite"),
    ],
)
def test_bad_filters_name_the_fix(bad: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_filters(bad)


def test_required_ids_are_the_anded_equalities() -> None:
    assert required_ids(parse_filters({"AND": [{"user_id": "a"}, {"agent_id": "g"}], "run_id": "r"})) == {
        "user_id": "a",
        "agent_id": "g",
        "run_id": "r",
    }
    assert required_ids(parse_filters({"OR": [{"user_id": "a"}]})) == {"user_id": "a"}  # a one-item OR is the item
    assert required_ids(parse_filters({"OR": [{"user_id": "a"}, {"user_id": "b"}]})) == {}
    assert required_ids(parse_filters({"NOT": [{"user_id": "a"}]})) == {}
    assert required_ids(parse_filters({"user_id": {"in": ["a"]}})) == {}
    with pytest.raises(ScopeError):
        required_ids(parse_filters({"AND": [{"user_id": "a"}, {"user_id": "b"}]}))
