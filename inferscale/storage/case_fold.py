"""One case folding for the ``icontains`` filter, the same on every backend and every database locale.

SQL's ``lower()`` differs between the backends: SQLite's folds ASCII letters only, so ``"ÉTÉ"`` never matched
``icontains: "été"`` there while PostgreSQL found it; and PostgreSQL's own follows the database's ``LC_CTYPE`` (ASCII
only under the C locale). So neither is used. Each character is mapped to its simple lowercase form, as Python's
Unicode tables give it (``"É"`` → ``"é"``, ``"Σ"`` → ``"σ"``, ``"İ"`` → ``"i"``), by one table applied by Python to
the needle, by PostgreSQL's ``translate(text, from, to)`` to the stored text, and by the Python function
:data:`SQLITE_FUNCTION` that every SQLite connection registers (:mod:`inferscale.storage.database`).

The mapping is per character, so a text keeps its length and a folded needle is found exactly where the folded text
holds it; full case folding (``"ß"`` → ``"ss"``) is not applied.
"""

from __future__ import annotations

from functools import cache

SQLITE_FUNCTION = "inferscale_fold"
"""The name of the folding function on SQLite connections: ``inferscale_fold(text) -> text``."""

_CASED_PLANES_END = 0x20000
"""Characters with a lowercase form all lie in Unicode planes 0 and 1 (the last, Adlam, ends at U+1E921)."""


@cache
def fold_table() -> dict[int, str]:
    """``{code point: its lowercase character}`` for every character whose lowercase differs (about 1,400), built on
    first use. A character whose full lowercase is longer (only ``"İ"``, U+0130 → ``"i̇"``) maps to its first
    character, the simple mapping."""
    table: dict[int, str] = {}
    for code in range(_CASED_PLANES_END):
        if 0xD800 <= code <= 0xDFFF:  # surrogates: no characters of their own
            continue
        lower = chr(code).lower()
        if lower != chr(code):
            table[code] = lower[0]
    return table


@cache
def fold_pairs() -> tuple[str, str]:
    """``(from, to)``: the table as the two strings PostgreSQL's ``translate(text, from, to)`` takes."""
    table = fold_table()
    return "".join(map(chr, table)), "".join(table.values())


def fold(text: str) -> str:
    """``text`` with every character mapped to its simple lowercase form (see the module docstring)."""
    return text.translate(fold_table())


def sqlite_fold(value: object) -> object:
    """:func:`fold` as SQLite calls it: a text is folded; NULL, numbers and blobs come back as they are."""
    return fold(value) if isinstance(value, str) else value


__all__ = ["SQLITE_FUNCTION", "fold", "fold_pairs", "fold_table", "sqlite_fold"]
