"""Text the command line prints, made safe for a terminal: what users, servers and models wrote (memory text, scope
ids, key names, chat answers, error messages) can hold characters a terminal acts on rather than shows. An escape
sequence stored in a memory's text would clear the operator's screen or set the window title, and a U+202E reverses
the rest of a table's row (a tester's find). They are printed as escapes instead."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"

TERMINAL_CONTROLS = re.compile(f"[{_CONTROLS}]")
"""What a terminal acts on rather than shows: C0 controls (but tab and newline), DEL, C1 controls, and the
bidirectional marks, embeddings, overrides and isolates."""

_JSON_RAW = re.compile(f"[{_CONTROLS}\u2028\u2029]")
""":data:`TERMINAL_CONTROLS` and the line and paragraph separators, which ``str.splitlines`` and JavaScript end a
line at: a JSON line holding one (a streamed chat chunk) would be cut in two."""


def terminal_safe(text: str) -> str:
    """``text`` as a terminal should print it: each character of :data:`TERMINAL_CONTROLS` written as its Python
    escape (``"\\x1b"``, ``"\\u202e"``), everything else as it is."""
    return TERMINAL_CONTROLS.sub(lambda found: found.group().encode("unicode_escape").decode("ascii"), text)


def json_for_terminal(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as one line of JSON (``json.dumps``, non-ASCII letters as they are), with the characters of
    :data:`TERMINAL_CONTROLS` that JSON leaves raw (DEL, C1 controls, bidirectional controls), and U+2028 and U+2029,
    written as ``\\uXXXX`` escapes: the same JSON value once parsed, on one line. They can only occur inside its
    strings.

    Raises:
        TypeError, ValueError: as ``json.dumps`` (a value it cannot write).
    """
    text = json.dumps(value, ensure_ascii=False, default=default)
    return _JSON_RAW.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


__all__ = ["TERMINAL_CONTROLS", "json_for_terminal", "terminal_safe"]
