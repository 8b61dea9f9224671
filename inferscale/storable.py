"""The text every backend and the JSON wire can hold, checked once for every string a caller hands in.

Two kinds of character cannot be kept faithfully everywhere, so both are refused, on SQLite and PostgreSQL alike,
before anything is written:

* a lone surrogate (U+D800 to U+DFFF outside a pair): not Unicode text, so it has no UTF-8 form; SQLite's driver,
  PostgreSQL and JSON encoders all fail on it;
* NUL (U+0000): PostgreSQL's text and JSON types cannot store it.
"""

from __future__ import annotations

from inferscale.errors import InvalidInputError

NUL = "\x00"


def check_unicode(text: str, where: str) -> str:
    """``text`` when it is valid Unicode (encodes as UTF-8: no lone surrogate).

    Args:
        text: the string to check.
        where: what it is, for the message (``"metadata['k']"``, ``"user_id"``).

    Raises:
        InvalidInputError: naming ``where``, the code point and its index, and the fix.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{where} holds a lone surrogate U+{ord(text[exc.start]):04X} at index {exc.start}, which is not valid "
            "Unicode text and cannot be stored or sent as JSON; remove it or pair it (e.g. "
            "text.encode('utf-8', 'replace').decode())"
        ) from exc
    return text


def check_storable(text: str, where: str) -> str:
    """``text`` when every backend can store it: valid Unicode (see :func:`check_unicode`) without NUL.

    Raises:
        InvalidInputError: naming ``where``, the bad character and its index, and the fix.
    """
    check_unicode(text, where)
    index = text.find(NUL)
    if index >= 0:
        raise InvalidInputError(
            f"{where} holds a NUL character (U+0000) at index {index}, which PostgreSQL cannot store; remove it "
            "(e.g. text.replace('\\x00', ''))"
        )
    return text


__all__ = ["NUL", "check_storable", "check_unicode"]
