"""describe_errors against pydantic's real errors: labels, the count of the rest, the quoted input and its cut."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError

from inferscale.validation_text import INPUT_CHARS, describe_errors, int_digits, shown_input


class _Inner(BaseModel):
    k: int = Field(ge=1)


class _Request(BaseModel):
    name: str
    inner: _Inner
    tags: list[int]


def _errors(payload: object) -> list[dict[str, object]]:
    with pytest.raises(ValidationError) as caught:
        _Request.model_validate(payload)
    return [dict(e) for e in caught.value.errors()]


def test_each_error_is_named_by_its_dotted_location() -> None:
    errors = _errors({"inner": {"k": 0}, "tags": [1, "x"]})
    assert describe_errors(errors) == (
        "name: Field required; inner.k: Input should be greater than or equal to 1; "
        "tags.1: Input should be a valid integer, unable to parse string as an integer"
    )


def test_errors_past_the_limit_are_counted() -> None:
    errors = _errors({"inner": {"k": 0}, "tags": [1, "x"]})
    assert describe_errors(errors, limit=1) == "name: Field required (and 2 more)"
    assert describe_errors(errors, limit=3) == describe_errors(errors)
    for bad in (0, -2):
        with pytest.raises(ValueError, match="limit must be >= 1"):
            describe_errors(errors, limit=bad)


def test_a_custom_label_and_the_top_level() -> None:
    top = _errors([1, 2])  # not an object: the error sits at the top level (loc ())
    assert describe_errors(top) == "Input should be a valid dictionary or instance of _Request"
    labelled = describe_errors(top, lambda loc: f"item {loc}" if loc else "the file")
    assert labelled == "the file: Input should be a valid dictionary or instance of _Request"
    assert describe_errors(_errors({"name": "n", "inner": {"k": 1}}), lambda loc: None) == "Field required"


def test_the_input_is_quoted_and_cut() -> None:
    long_name = "y" * 200
    errors = _errors({"name": "n", "inner": {"k": long_name}, "tags": []})
    quoted = repr(long_name)[:INPUT_CHARS]
    assert describe_errors(errors, show_input=True) == (
        f"inner.k: Input should be a valid integer, unable to parse string as an integer (got {quoted})"
    )
    assert len(quoted) == INPUT_CHARS
    assert describe_errors([]) == ""


def test_an_int_too_long_to_print_is_named_by_its_size() -> None:
    """``repr`` of an int past 4,300 digits raises ``ValueError``: error messages that quoted one raised that
    instead of their own error (a review, 6 Dec 2026)."""
    assert shown_input(10**5000) == "an integer of 5,001 digits"
    assert shown_input(-(10**400)) == "an integer of 401 digits"
    assert shown_input(10**400 - 1) == "an integer of 400 digits"  # the bit length alone says 401
    assert shown_input(10**79) == repr(10**79)  # 80 digits: shown
    assert [int_digits(v) for v in (0, 9, 10, 99, 100, -(10**20), 10**20 - 1)] == [1, 1, 2, 2, 3, 21, 20]
    assert shown_input([10**5000]) == "a list holding an integer too long to show"
    assert shown_input("x" * 200) == repr("x" * 200)[:INPUT_CHARS]
    assert shown_input(True) == "True"
