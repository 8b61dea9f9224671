"""How the memory and key commands print: the client's return value as JSON (``--json``), or rich tables for people.

JSON goes to stdout through :func:`print_json` and is the only thing there; tables go to stdout through a rich
console; notes, warnings and spinners go to stderr. Rich comes with the ``apps`` extra (see
:mod:`inferscale.apps_extra`); ``--json`` does not need it.

What users and servers wrote (memory text, ids, scope ids, key names, queries, chat answers) is printed as it is,
never read as rich markup: ``"[bold]x[/bold]"`` keeps its brackets and ``"[/x]"`` is no error. The consoles here
have markup off, and the tables hold such strings as :class:`rich.text.Text`, so they are safe on any console.
Nor can they drive the terminal: control characters in them (an escape sequence stored in a memory's text would
clear the screen or set the window title) are printed as escapes (:func:`terminal_safe`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from inferscale.apps_extra import console, require, table
from inferscale.terminal_text import json_for_terminal, terminal_safe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from inferscale.server.keys import ApiKey

__all__ = [
    "WIDE",
    "changes_table",
    "count",
    "history_table",
    "keys_table",
    "memories_table",
    "plain",
    "print_json",
    "scope_of",
    "stderr",
    "stdout",
    "terminal_safe",
    "when",
    "working",
]


def _encode(value: object) -> object:
    """What :func:`json.dumps` writes for a value it has no encoding of: a dataclass's fields, a datetime's ISO 8601
    text (as the client writes its timestamps).

    Raises:
        TypeError: for any other type (as :func:`json.dumps` does).
    """
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def print_json(value: Any) -> None:
    """Print ``value`` as one line of JSON on stdout: dicts and lists as they are, dataclasses (``ChatResult``,
    ``ChatChunk``, ``ApiKey``) as objects of their fields, datetimes as ISO 8601 strings."""
    print(json_for_terminal(value, default=_encode), flush=True)


def stdout() -> Console:
    """The console of human output (stdout): strings print as they are, whatever stdout is: no markup (styles come
    from ``style=``), no ``:emoji:`` codes replaced, and no line breaks added at the console's width (80 columns
    when stdout is a pipe or a file; a chat answer was hard-wrapped there). Tables still fit the width.

    Raises:
        ConfigError: when rich is not installed.
    """
    return console(soft_wrap=True, markup=False, emoji=False)


def stderr() -> Console:
    """The console of notes, warnings and spinners (stderr), as :func:`stdout`'s: no markup, no emoji codes
    replaced (a memory quoted under a chat's answer showed ``:thumbs_up:`` as an emoji).

    Raises:
        ConfigError: when rich is not installed.
    """
    return console(stderr=True, markup=False, emoji=False)


def plain(value: object, style: str = "") -> Text:
    """``value`` as rich text printed as it is, never read as markup (``str(value)``; ``""`` for ``None``), its
    terminal controls escaped (:func:`terminal_safe`).

    Raises:
        ConfigError: when rich is not installed.
    """
    require("rich.text")
    from rich.text import Text

    return Text("" if value is None else terminal_safe(str(value)), style=style)


@contextlib.contextmanager
def working(message: str | None) -> Iterator[None]:
    """A spinner with ``message`` on stderr while the block runs (model loads take seconds); nothing when
    ``message`` is ``None`` (``--json``: scripts get no decoration, and rich is not needed)."""
    if message is None:
        yield
        return
    with stderr().status(plain(message)):
        yield


def count(n: int, one: str, many: str) -> str:
    """``"1 memory"``, ``"3 memories"``."""
    return f"{n} {one if n == 1 else many}"


def when(iso: str | datetime | None) -> str:
    """``"2026-01-02 10:11"`` for an ISO 8601 timestamp (as the client returns them, UTC); ``""`` for ``None``."""
    if iso is None:
        return ""
    moment = iso if isinstance(iso, datetime) else datetime.fromisoformat(iso)
    return moment.strftime("%Y-%m-%d %H:%M")


def scope_of(memory: Mapping[str, Any]) -> str:
    """The scope ids a memory dict carries, e.g. ``"user=alice run=r1"``."""
    return " ".join(f"{k.removesuffix('_id')}={memory[k]}" for k in ("user_id", "agent_id", "run_id") if memory.get(k))


WIDE = 120
"""Console columns from which memory tables give scope, score and creation time columns of their own; narrower
consoles show them on a dim line under each memory's text."""


def memories_table(memories: Sequence[Mapping[str, Any]], title: str, width: int) -> Table:
    """Memory dicts (``search``, ``get_all``) as rows: id, memory, scope, score (when they have one), created.

    Args:
        memories: the client's memory dicts.
        title: the table's title (plain text, never markup).
        width: the console's width in columns; under :data:`WIDE`, scope, score and created share a dim line
            under the text, so that the full id and the text keep their room.
    """
    scored = any("score" in m for m in memories)
    wide = width >= WIDE
    out = table(title=plain(title), title_justify="left")
    out.add_column("id", no_wrap=True, style="cyan")
    out.add_column("memory", overflow="fold", ratio=1)
    if wide:
        out.add_column("scope", overflow="fold")
        if scored:
            out.add_column("score", justify="right", no_wrap=True)
        out.add_column("created", no_wrap=True, style="dim")
    for m in memories:
        facts = [scope_of(m), *([f"{m['score']:.3f}"] if scored else []), when(m.get("created_at"))]
        if wide:
            out.add_row(plain(m["id"]), plain(m["memory"]), *map(plain, facts))
        else:
            out.add_row(plain(m["id"]), plain(m["memory"]).append("\n").append(plain(" · ".join(facts), "dim")))
    return out


def changes_table(changes: Sequence[Mapping[str, Any]], title: str) -> Table:
    """``add``'s results as rows: event, id, memory (an UPDATE's previous text on a dim line under it)."""
    out = table(title=plain(title), title_justify="left")
    out.add_column("event", no_wrap=True, style="bold")
    out.add_column("id", no_wrap=True, style="cyan")
    out.add_column("memory", overflow="fold", ratio=1)
    for c in changes:
        text = plain(c["memory"])
        if was := c.get("previous_memory"):
            text.append(plain(f"\nwas: {was}", "dim"))
        out.add_row(plain(c["event"]), plain(c["id"]), text)
    return out


def history_table(rows: Sequence[Mapping[str, Any]], title: str) -> Table:
    """``history``'s rows, oldest first: created, event, memory (its previous text on a dim line under it), and the
    actor when a row has one."""
    actors = any(r["actor_id"] for r in rows)
    out = table(title=plain(title), title_justify="left")
    out.add_column("created", no_wrap=True, style="dim")
    out.add_column("event", no_wrap=True, style="bold")
    out.add_column("memory", overflow="fold", ratio=1)
    if actors:
        out.add_column("actor", no_wrap=True)
    for r in rows:
        old, new = r["old_memory"], r["new_memory"]
        text = plain(old, "strike") if new is None else plain(new)
        if old is not None and new is not None:
            text.append(plain(f"\nwas: {old}", "dim"))
        out.add_row(plain(when(r["created_at"])), plain(r["event"]), text, *([plain(r["actor_id"])] if actors else []))
    return out


_PLAIN_ID = re.compile(r"[A-Za-z0-9_.@:+-]+")
"""A scope id shown as it is in the keys table; any other (a comma, a space, a quote, a letter outside ASCII that may
look like one inside it, ...) is shown as a JSON string."""


def _bound(kind: str, ids: Sequence[str] | None) -> str | None:
    """``kind=id1,id2`` for a bound list, each id that is not plain quoted (so that a key bound to ``alice`` and
    ``bob`` never reads like one bound to the single id ``"alice,bob"``); ``None`` for an unbound one."""
    shown = (i if _PLAIN_ID.fullmatch(i) else json_for_terminal(i) for i in ids or ())
    return None if ids is None else f"{kind}={','.join(shown)}"


def keys_table(keys: Sequence[ApiKey]) -> Table:
    """API keys as rows: id, name, scopes (``any`` where a list is unbound), admin, created, revoked."""
    out = table(title=count(len(keys), "API key", "API keys"), title_justify="left")
    for name in ("id", "name", "scopes", "admin", "created", "revoked"):
        out.add_column(name, no_wrap=name in ("id", "admin", "created", "revoked"), overflow="fold")
    for k in keys:
        bound = [_bound("user", k.user_ids), _bound("agent", k.agent_ids), _bound("run", k.run_ids)]
        scopes = " ".join(b for b in bound if b) or "any"
        cells = [k.key_id, k.name, scopes, "yes" if k.admin else "", when(k.created_at), when(k.revoked_at)]
        out.add_row(*map(plain, cells))
    return out
