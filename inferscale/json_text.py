"""JSON text a caller hands in (a file, a request body, a command-line word), parsed with the standard library.

Python's parser recurses once per level of arrays and objects, so text nested past the interpreter's recursion limit
(about a thousand levels) raises a bare ``RecursionError``, which no handler of malformed JSON catches: a CLI printed
a traceback, a server answered 500. :func:`loads_json` raises it as malformed JSON instead.
"""

from __future__ import annotations

import json
from typing import Any


class JSONTooDeepError(json.JSONDecodeError):
    """JSON text nested deeper than Python's parser can read (a ``json.JSONDecodeError``, ``pos`` 0)."""


def loads_json(text: str | bytes) -> Any:
    """``json.loads(text)``, with nesting too deep for the parser refused like any malformed text.

    Raises:
        JSONTooDeepError: for nesting past the parser's recursion limit (a ``json.JSONDecodeError``).
        json.JSONDecodeError: for malformed JSON.
        UnicodeDecodeError: for bytes that are not UTF-8, UTF-16 or UTF-32 (as ``json.loads``).
    """
    try:
        return json.loads(text)
    except RecursionError:
        document = text if isinstance(text, str) else ""
        raise JSONTooDeepError("it nests deeper than Python's JSON parser can read", document, 0) from None
