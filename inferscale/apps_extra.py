"""The optional libraries of the apps (``inferscale demo``, ``bench``, ``eval``): rich and matplotlib.

They come with the ``apps`` extra (``pip install 'inferscale-memory[apps]'``); the core install (``import inferscale``,
:class:`~inferscale.MemoryClient`, the server) never imports them. The apps get them through the functions
here, at the time a command prints or plots, so a missing library is one clear error naming the extra.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from inferscale.errors import ConfigError, MemoryNotFoundError
from inferscale.terminal_text import terminal_safe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

__all__ = ["APPS_EXTRA", "console", "exit_code", "fail", "progress_bar", "pyplot", "require", "table"]

APPS_EXTRA = "apps"
"""The extra that installs rich and matplotlib: ``pip install 'inferscale-memory[apps]'``."""


def require(module: str) -> ModuleType:
    """Import ``module`` (``"rich.console"``, ``"matplotlib"``...), which the ``apps`` extra installs.

    Raises:
        ConfigError: when it is not installed; the message names the module and the extra to install.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"{module} is not installed; tables and plots (every command's output without --json; the demo, bench "
            f"and eval commands) need the {APPS_EXTRA!r} extra: pip install 'inferscale-memory[{APPS_EXTRA}]'"
        ) from exc


def console(**kwargs: Any) -> Console:
    """A ``rich.console.Console(**kwargs)``.

    Raises:
        ConfigError: when rich is not installed (see :func:`require`).
    """
    require("rich.console")
    from rich.console import Console

    return Console(**kwargs)


def table(**kwargs: Any) -> Table:
    """A ``rich.table.Table(**kwargs)``.

    Raises:
        ConfigError: when rich is not installed (see :func:`require`).
    """
    require("rich.table")
    from rich.table import Table

    return Table(**kwargs)


def progress_bar(console: Console | None = None, *, disable: bool = False) -> Progress:
    """A ``rich.progress.Progress`` with a bar, ``done/total``, elapsed and remaining time, and a free text field
    ``status`` (set with ``progress.update(task, status=...)``).

    Raises:
        ConfigError: when rich is not installed (see :func:`require`).
    """
    require("rich.progress")
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        disable=disable,
    )


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (files only, no display needed).

    Raises:
        ConfigError: when matplotlib is not installed (see :func:`require`).
    """
    require("matplotlib").use("Agg")
    return require("matplotlib.pyplot")


def exit_code(exc: Exception) -> int:
    """A command's exit code for the error ``exc``: 2 for bad input (a ``ValueError``: ``InvalidInputError``,
    ``ScopeError``, ``ConfigError``..., which the caller fixes by changing the command line or configuration), 1
    for any other failure (a missing memory, a refused key, a server or model error). A missing memory is 1 though
    :class:`~inferscale.errors.MemoryNotFoundError` is a ``ValueError`` too (for Mem0 code that catches one)."""
    return 2 if isinstance(exc, ValueError) and not isinstance(exc, MemoryNotFoundError) else 1


def fail(exc: Exception) -> int:
    """Print ``error: <exc>`` on stderr as one line (in red, when rich is installed) and return the command's exit
    code, :func:`exit_code`."""
    try:
        from rich.console import Console
    except ImportError:
        print(f"error: {terminal_safe(str(exc))}", file=sys.stderr)
    else:
        line = f"error: {terminal_safe(str(exc))}"  # a server's message may quote what a user wrote
        Console(stderr=True, soft_wrap=True).print(line, style="red", markup=False, highlight=False)
    return exit_code(exc)
