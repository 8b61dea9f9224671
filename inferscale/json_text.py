"""JSON text a caller hands in (a file, a request body, a command-line word), parsed with the standard library.

Python's parser recurses once per level of arrays and objects, so text nested past the interpreter's recursion limit
(about a thousand levels) raises a bare ``RecursionError``, which no handler of malformed JSON catches: a CLI printed
a traceback, a server answered 500. :func:`loads_json` raises it as malformed JSON instead.

An object that names a key twice is valid JSON (RFC 8259 says only that its names *should* be unique), and the
standard library keeps the last value. Where one reader's choice can differ from another's, a request body that a
proxy or a log reads as one tenant and the server as another, ``unique_keys=True`` refuses it.
"""

from __future__ import annotations

import json
from typing import Any


class JSONTooDeepError(json.JSONDecodeError):
    """JSON text nested deeper than Python's parser can read (a ``json.JSONDecodeError``, ``pos`` 0)."""


class JSONDuplicateKeyError(json.JSONDecodeError):
    """A JSON object that names a key twice, refused under ``unique_keys`` (a ``json.JSONDecodeError``; ``pos`` is
    where the key's last occurrence starts, or 0 when its text is escaped otherwise)."""


class _Repeated(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: the object, or :class:`_Repeated` for its first key named twice."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Repeated(key)
        obj[key] = value
    return obj


def loads_json(text: str | bytes, *, unique_keys: bool = False) -> Any:
    """``json.loads(text)``, with nesting too deep for the parser refused like any malformed text, and with
    ``unique_keys``, an object that names a key twice too (module docstring).

    Raises:
        JSONTooDeepError: for nesting past the parser's recursion limit (a ``json.JSONDecodeError``).
        JSONDuplicateKeyError: with ``unique_keys``, for an object naming a key twice (a ``json.JSONDecodeError``).
        json.JSONDecodeError: for malformed JSON.
        UnicodeDecodeError: for bytes that are not UTF-8, UTF-16 or UTF-32 (as ``json.loads``).
    """
    try:
        return json.loads(text, object_pairs_hook=_unique_object if unique_keys else None)
    except RecursionError:
        document = text if isinstance(text, str) else ""
        raise JSONTooDeepError("it nests deeper than Python's JSON parser can read", document, 0) from None
    except _Repeated as repeated:
        document = text if isinstance(text, str) else text.decode("utf-8", "replace")
        at = max(document.rfind(json.dumps(repeated.key)), 0)
        message = f"the key {repeated.key!r} is given twice in one object: give each key once"
        raise JSONDuplicateKeyError(message, document, at) from None
