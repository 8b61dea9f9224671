"""The Mem0 filter grammar: parsing into a tree, errors that name the fix, and the ids a filter pins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

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
        # beyond 64 bits: SQLite binds no wider integer, and float() of 10**400 overflowed into a 500
        ({"a": 10**400}, r"filters\['a'\] is an integer of 401 digits; filter integers are 64-bit"),
        ({"a": {"gt": 2**63}}, r"\['gt'\] is 9223372036854775808; filter integers are 64-bit \(-9223"),
        ({"a": {"in": [1, -(2**63) - 1]}}, r"\['in'\]\[1\] is -9223372036854775809;"),
        # found by a new user: messages that sent them the wrong way
        ({"k": {"*": True}}, r"'\*' is a value, not an operator: write \{'k': '\*'\}"),
        ({"k": {"between": 1}}, r"use one of eq, .*, icontains, exists, or the value '\*'"),
        ({"or": [{"a": 1}]}, "to combine filters write 'OR' in upper case"),
        ({"not": {"a": 1}}, r"\['not'\]: to combine filters write 'NOT' in upper case"),
        ({"$And": {"a": 1, "b": 2}}, "write 'AND' in upper case"),
        ({"metadata": {"cat": "hobby"}}, r"metadata keys are filtered at the top level.*write \{'cat': 'hobby'\}"),
        # {"exists": False} matched the memories that have the field
        ({"k": {"exists": False}}, r"must be True .* write \{'NOT': \[\{'k': '\*'\}\]\}"),
        ({"k": {"exists": "no"}}, "must be True"),
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


# Found by the bad-input fuzzing (tests/properties): each of these raised an untyped OverflowError, OSError or
# ValueError out of datetime instead of InvalidInputError, on both backends.
@pytest.mark.parametrize(
    "moment",
    [
        1e300,  # OverflowError: timestamp out of range for platform time_t
        -(2**63),  # OSError: [Errno 75] Value too large for defined data type
        10**12,  # ValueError: year 33658 is out of range
        253402300800,  # ValueError: year 10000 is out of range (one second after 9999-12-31T23:59:59Z)
        -62135596801,  # ValueError: year 0 is out of range
        "9999-12-31T23:59:59-05:00",  # OverflowError: date value out of range (in UTC)
        "0001-01-01T00:00:00+01:00",
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
    ],
    ids=repr,
)
@pytest.mark.parametrize("op", ["eq", "gt", "in"])
def test_a_timestamp_beyond_the_years_a_datetime_holds_is_invalid_input(moment: object, op: str) -> None:
    with pytest.raises(InvalidInputError, match="years 1 to 9999"):
        parse_filters({"created_at": {op: [moment] if op == "in" else moment}})


def test_the_first_and_last_moments_a_datetime_holds_are_timestamps() -> None:
    assert parse_timestamp(253402300799) == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert parse_timestamp(-62135596800) == datetime(1, 1, 1, tzinfo=UTC)
    assert parse_timestamp("9999-12-31T23:59:59+00:00") == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert parse_timestamp("0001-01-01T01:00:00+01:00") == datetime(1, 1, 1, tzinfo=UTC)
