"""Pydantic's validation errors as one line of text for a person: ``"<where>: <msg>; ..."``.

pydantic's own ``str(exc)`` spreads over several lines, names internal types and links to its documentation; the
command line, the cases file of ``eval fidelity`` and the server's 400 replies print this instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

INPUT_CHARS = 80
"""How much of an input's repr :func:`describe_errors` quotes."""


def int_digits(value: int) -> int:
    """How many decimal digits ``abs(value)`` has, without ``str`` (which raises ``ValueError`` past 4,300)."""
    magnitude = abs(value)
    digits = int(magnitude.bit_length() * math.log10(2)) + 1  # exact, or one too many
    return digits - 1 if digits > 1 and magnitude < 10 ** (digits - 1) else digits


def shown_input(value: object, chars: int = INPUT_CHARS) -> str:
    """``repr(value)`` cut to ``chars`` characters, for an error message. An int of more than ``chars`` digits is
    named by its size instead: Python refuses ``repr`` of one past 4,300 digits (``ValueError``), and a message need
    not print thousands; so is a value whose repr fails that way inside a container."""
    if isinstance(value, int) and not isinstance(value, bool) and int_digits(value) > chars:
        return f"an integer of {int_digits(value):,} digits"
    try:
        return repr(value)[:chars]
    except ValueError:
        return f"a {type(value).__name__} holding an integer too long to show"


def _location(loc: str) -> str | None:
    return loc or None


def describe_errors(
    errors: Sequence[Mapping[str, Any]],
    where: Callable[[str], str | None] = _location,
    limit: int | None = None,
    show_input: bool = False,
) -> str:
    """``"<where>: <msg>; <where>: <msg> (and N more)"``.

    Args:
        errors: pydantic's error dicts (``ValidationError.errors()``, FastAPI's ``RequestValidationError.errors()``):
            ``loc``, ``msg`` and, for ``show_input``, ``input`` are read.
        where: the label of an error's location, given its parts joined with dots (``""`` for the top level);
            ``None`` prints the message alone. Default: the joined location, or nothing at the top level.
        limit: the most errors named (``None``: all); the others are counted, ``" (and N more)"``.
        show_input: add each error's input, ``" (got <repr>)"``, its repr cut to :data:`INPUT_CHARS` characters.

    Returns:
        One line; empty for no errors.

    Raises:
        ValueError: for ``limit`` < 1.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    shown = errors if limit is None else errors[:limit]
    parts = []
    for error in shown:
        label = where(".".join(str(part) for part in error.get("loc", ())))
        text = f"{label}: {error.get('msg')}" if label else str(error.get("msg"))
        if show_input and "input" in error:
            text += f" (got {shown_input(error['input'])})"
        parts.append(text)
    more = len(errors) - len(shown)
    return "; ".join(parts) + (f" (and {more} more)" if more else "")
