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


def test_a_context_length_error_advises_the_callers_own_name_for_the_answer_budget() -> None:
    """The transformers server's OpenAI route advised lowering ``max_new_tokens`` (the Python client's argument), a
    field OpenAI requests do not have; the route now renames it to the request's field."""
    refused = errors.ContextLengthError.of("the prompt needs 9 tokens but the model's context is 8", memory_tokens=3)
    assert isinstance(refused, errors.InvalidInputError)
    assert str(refused) == (
        "the prompt needs 9 tokens but the model's context is 8; "
        "retrieve fewer memories (limit), send a shorter conversation or lower max_new_tokens"
    )
    renamed = refused.for_budget("max_tokens")
    assert str(renamed) == str(refused).replace("max_new_tokens", "max_tokens")
    assert str(renamed.for_budget("max_completion_tokens")).endswith("lower max_completion_tokens")
    # no memory in the prompt: fewer would not help, so the advice does not name them
    alone = errors.ContextLengthError.of("the prompt needs 9 tokens", memory_tokens=0).for_budget("max_tokens")
    assert str(alone) == "the prompt needs 9 tokens; send a shorter conversation or lower max_tokens"
    assert (code_of(renamed).code, code_of(renamed).status) == ("context_length_exceeded", 400)
    received = error_from_code("context_length_exceeded", str(renamed))  # a server's reply: the message alone
    assert type(received) is errors.ContextLengthError
    assert str(received.for_budget("max_new_tokens")) == str(refused)  # the remote client's own name again
    other = errors.ContextLengthError("a message without advice")
    assert other.for_budget("max_tokens") is other
    with pytest.raises(errors.ContextLengthError) as raised, errors.budget_named("max_completion_tokens"):
        raise refused
    assert str(raised.value).endswith(
        "; retrieve fewer memories (limit), send a shorter conversation or lower max_completion_tokens"
    )
    with pytest.raises(errors.ScopeError, match=r"^no scope$"), errors.budget_named("max_tokens"):
        raise errors.ScopeError("no scope")  # other errors pass unchanged
