"""The text every backend and the JSON wire can hold, checked once for every string a caller hands in.

Two kinds of character cannot be kept faithfully everywhere, so both are refused, on SQLite and PostgreSQL alike,
before anything is written:

* a lone surrogate (U+D800 to U+DFFF outside a pair): not Unicode text, so it has no UTF-8 form; SQLite's driver,
  PostgreSQL and JSON encoders all fail on it;
* NUL (U+0000): PostgreSQL's text and JSON types cannot store it.

Structured values (metadata, and on the remote client's wire every argument) must be plain JSON as well
(:func:`check_json`): JSON has no non-str object key (an encoder would quietly turn ``1`` into ``"1"``), no NaN or
infinity, and no arbitrary objects.
"""

from __future__ import annotations

import math
import unicodedata

from inferscale.errors import InvalidInputError
from inferscale.validation_text import int_digits

NUL = "\x00"

_INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf"})


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: it holds only whitespace and invisible control or format characters (Unicode
    categories Zs, Zl, Zp, Cc and Cf: a zero-width space U+200B, a word joiner U+2060, a byte-order mark U+FEFF, a
    soft hyphen U+00AD). Every blank check of a text, id, name or query uses it: ``str.strip`` keeps the invisible
    format characters, so a memory of one zero-width space was stored, and listed as an empty line."""
    return all(char.isspace() or unicodedata.category(char) in _INVISIBLE_CATEGORIES for char in text)


MAX_JSON_INT_DIGITS = 4300
"""The most digits of an int JSON carries here: Python writes no int of more (``str`` raises ``ValueError`` past
``sys.get_int_max_str_digits()``, 4,300 by default), so ``json.dumps`` of one fails."""
_JSON_INT_LIMIT = 10**MAX_JSON_INT_DIGITS

MAX_JSON_DEPTH = 64
"""The deepest nesting of lists and dicts accepted in a JSON value (deeper is most likely a cycle)."""


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


def check_json(value: object, where: str, depth: int = 0, *, strings: bool = True) -> None:
    """Check that ``value`` is plain JSON: str keys; str, int, finite float, bool, None, list, tuple or dict values;
    with ``strings`` (the default), every key and str value storable (:func:`check_storable`).

    Args:
        value: the value to check.
        where: what it is, for the message (``"metadata"``); the message names the path below it
            (``"metadata['a'][0]"``).
        depth: how deep ``value`` lies in the value first given (0 for a call from outside).
        strings: check keys and str values with :func:`check_storable` too. The remote client passes ``False``: it
            sends text as given (escaped) and the server refuses what no backend can store.

    Raises:
        InvalidInputError: for anything else (a non-str key, NaN or an infinity, an int of more than
            :data:`MAX_JSON_INT_DIGITS` digits, another type), a lone surrogate or
            NUL in a key or value (with ``strings``), or nesting deeper than :data:`MAX_JSON_DEPTH`.
    """
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels (is it cyclic?)")
    if isinstance(value, str):
        if strings:
            check_storable(value, where)
        return
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) >= _JSON_INT_LIMIT:
            digits = int_digits(value)
            raise InvalidInputError(
                f"{where} is an integer of {digits:,} digits; JSON holds at most {MAX_JSON_INT_DIGITS:,}"
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{where} is {value!r}; JSON has no NaN or infinity")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check_json(item, f"{where}[{i}]", depth + 1, strings=strings)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(f"{where} has the key {key!r}; JSON object keys must be str")
            if strings:
                check_storable(key, f"a key of {where}")
            check_json(item, f"{where}[{key!r}]", depth + 1, strings=strings)
        return
    raise InvalidInputError(
        f"{where} is a {type(value).__name__}, which is not JSON-serialisable; "
        "use str, int, float, bool, None, list or dict"
    )


__all__ = ["MAX_JSON_DEPTH", "NUL", "check_json", "check_storable", "check_unicode"]
