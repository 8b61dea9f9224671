"""The server's error codes: one per exception type, unique, and each turns back into its own type."""

from __future__ import annotations

import pytest

from inferscale import errors
from inferscale.error_codes import ERROR_CODES, code_of, error_from_code

PUBLIC_ERRORS = [
    cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.InferScaleError) and cls is not errors.InferScaleError
]


def test_codes_and_types_are_unique() -> None:
    assert len({row.code for row in ERROR_CODES}) == len(ERROR_CODES)
    assert len({row.error for row in ERROR_CODES}) == len(ERROR_CODES)


@pytest.mark.parametrize("cls", PUBLIC_ERRORS, ids=lambda c: c.__name__)
def test_every_error_type_round_trips(cls: type[errors.InferScaleError]) -> None:
    row = code_of(cls("bad value"))
    assert row.error is cls
    again = error_from_code(row.code, "bad value")
    assert type(again) is cls
    assert str(again) == "bad value"


def test_most_specific_class_wins() -> None:
    assert code_of(errors.ScopeError("x")).code == "scope_required"
    assert code_of(errors.ScopeError("x")).status == 400
    assert code_of(errors.MemoryNotFoundError("x")).status == 404


def test_foreign_exceptions_are_internal_errors() -> None:
    row = code_of(RuntimeError("boom"))
    assert (row.code, row.status, row.error) == ("internal_error", 500, errors.ServerError)


def test_unknown_code_from_a_newer_server_is_a_server_error() -> None:
    exc = error_from_code("quota_exceeded", "too many")
    assert type(exc) is errors.ServerError
    assert "quota_exceeded" in str(exc)
