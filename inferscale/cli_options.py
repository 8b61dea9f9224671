"""Command-line options defined once, on the fields of a command's settings dataclass.

A field whose metadata is :func:`cli` carries its flags and help; :func:`add_options` turns every such field into an
argparse argument (``dest`` = the field name, ``default`` = the field's default, ``choices`` from a ``Literal``
type, ``type`` from a plain ``int``/``float``/``str``/``Path`` type unless given), and :func:`from_args` builds the
settings back from the parsed namespace. A "flag" without a leading dash (``cli("QUERY", ...)``) is a positional
argument shown under that name. So a flag, its default and its meaning are written in one place::

    @dataclass(frozen=True)
    class Settings:
        repeats: int = field(default=5, metadata=cli("--repeats", type=positive_int, help="timed calls (default 5)"))

    add_options(parser, Settings)
    settings = from_args(Settings, parser.parse_args())
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from inferscale.validation_text import shown_input

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The levels ``--log-level`` takes (Python's logging levels, lower case)."""


def add_logging_options(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """Add ``-v`` and ``--log-level`` to ``parser`` and to every subcommand's parser under it, so that they are
    taken before or after the command (``inferscale serve -v`` was refused: an operator tester's find). Below the
    top they default to nothing given, so that a subcommand's parser leaves a value given before it alone."""
    unset: str | None = argparse.SUPPRESS if nested else None
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=unset or False, help="log at INFO level (--log-level info)"
    )
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=unset,
        help="the lowest level logged (default warning; the server's access log is at info): warnings quote the "
        "texts of facts an extraction dropped or added, so `error` keeps memory text out of the log",
    )
    for action in parser._actions:  # argparse has no public way to reach the subcommands' parsers
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                add_logging_options(child, nested=True)


def given_log_level(args: argparse.Namespace) -> str | None:
    """The level ``--log-level`` gave, else ``"info"`` for ``-v``, else ``None`` (also for a parser built without
    :func:`add_logging_options`)."""
    given = getattr(args, "log_level", None)
    return str(given) if given else ("info" if getattr(args, "verbose", False) else None)


def log_level(args: argparse.Namespace) -> str:
    """The level a command logs at: :func:`given_log_level`, else ``"warning"``."""
    return given_log_level(args) or "warning"


__all__ = [
    "DEVICE_OPTION",
    "DTYPE_OPTION",
    "LOG_LEVELS",
    "MODEL_OPTION",
    "QUOTED_CHARS",
    "THREADS_OPTION",
    "CliOption",
    "add_logging_options",
    "add_options",
    "cli",
    "from_args",
    "given_log_level",
    "int_list",
    "integer",
    "log_level",
    "name_list",
    "non_negative_int",
    "number",
    "positive_int",
    "quoted",
]

_CLI = "inferscale.cli"
"""The metadata key of a field's :class:`CliOption`."""

_PLAIN_TYPES: tuple[type, ...] = (int, float, str, Path)

T = TypeVar("T")
P = TypeVar("P", bound=argparse._ActionsContainer)


@dataclass(frozen=True)
class CliOption:
    """How one settings field appears on the command line.

    Attributes:
        flags: its option strings, e.g. ``("-k", "--k")``.
        help: the help text (argparse's ``%(default)s`` works).
        parse: parses one command-line word (argparse's ``type``); ``None``: from the field's type when it is
            ``int``, ``float``, ``str`` or ``Path`` (or one of them ``| None``), else the word itself.
        choices: the allowed values; ``None``: the field type's ``Literal`` values, if any.
        action: an argparse action (``"store_true"``, ``"append"``, ``argparse.BooleanOptionalAction``...).
        nargs: argparse's ``nargs``.
        metavar: the value's name in the help.
    """

    flags: tuple[str, ...]
    help: str
    parse: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    action: str | type[argparse.Action] | None = None
    nargs: str | None = None
    metavar: str | None = None


def cli(
    *flags: str,
    help: str,
    type: Callable[[str], Any] | None = None,
    choices: Sequence[Any] | None = None,
    action: str | type[argparse.Action] | None = None,
    nargs: str | None = None,
    metavar: str | None = None,
) -> dict[str, CliOption]:
    """The metadata of a dataclass field that is also a command-line option:
    ``field(default=5, metadata=cli("--repeats", help=...))``. A field without a default is a required option.
    One name without a leading dash (``cli("QUERY", help=...)``) makes a positional argument, shown as that name;
    give it a default and ``nargs="?"`` to make it optional.

    Returns:
        ``{key: CliOption(...)}``, for ``dataclasses.field(metadata=...)``.
    """
    return {_CLI: CliOption(tuple(flags), help, type, choices, action, nargs, metavar)}


def _field_types(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except NameError:  # a field annotation names something only imported for type checking
        return {}


def _plain(hint: Any) -> type | None:
    """``int`` for ``int`` or ``int | None`` (likewise float, str, Path); else ``None``."""
    if isinstance(hint, type) and hint in _PLAIN_TYPES:
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return next((t for t in _PLAIN_TYPES if args == [t]), None)
    return None


def add_options(parser: P, cls: type) -> P:
    """Add an argparse argument for every field of the dataclass ``cls`` whose metadata is :func:`cli`, to a parser
    or an argument group.

    Returns:
        ``parser``.

    Raises:
        TypeError: when ``cls`` is not a dataclass.
    """
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        spec: CliOption | None = f.metadata.get(_CLI)
        if spec is None:
            continue
        positional = not spec.flags[0].startswith("-")
        kwargs: dict[str, Any] = {"help": spec.help}
        if positional:  # argparse names a positional by its dest: the field name, shown as the given name
            kwargs["metavar"] = spec.flags[0]
        else:
            kwargs["dest"] = f.name
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif not positional:
            kwargs["required"] = True
        if spec.action is not None:
            kwargs["action"] = spec.action
        hint = hints.get(f.name)
        choices = spec.choices
        if choices is None and typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
        if choices is not None:
            kwargs["choices"] = choices
        if spec.action not in ("store_true", "store_false", argparse.BooleanOptionalAction):
            plain = _plain(hint)
            parse = spec.parse or (_PARSERS.get(plain, plain) if plain is not None else None)
            if parse is not None and parse is not str:
                kwargs["type"] = parse
            if not positional and (spec.metavar is not None or choices is None):  # the value's name, not the field's
                kwargs["metavar"] = spec.metavar or spec.flags[-1].lstrip("-").replace("-", "_").upper()
        if spec.nargs is not None:
            kwargs["nargs"] = spec.nargs
        parser.add_argument(*((f.name,) if positional else spec.flags), **kwargs)
    return parser


def from_args(cls: type[T], args: argparse.Namespace, **overrides: Any) -> T:
    """Build the dataclass ``cls`` from the options :func:`add_options` added (lists become tuples).

    Args:
        cls: the settings dataclass.
        args: the parsed namespace.
        overrides: values that replace (or complete) what was parsed.

    Raises:
        whatever ``cls`` raises for invalid values (the settings classes raise ``ConfigError``).
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(typing.cast(Any, cls)):
        if _CLI in f.metadata and f.name not in overrides:
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values, **overrides)


# ---------------------------------------------------------------------------------------------------- value parsers


def output_folder(text: str) -> Path:
    """A ``--out`` folder: the path, checked before any work is done by making it (with its missing parents) and
    writing a file there, both removed again: the results make it when they are written, and a run refused later for
    its input leaves no empty folder behind.

    Raises:
        argparse.ArgumentTypeError: when the path exists and is not a folder, lies under a file, or cannot be written
            (a run then measured everything and lost it to ``FileExistsError``, ``NotADirectoryError`` or
            ``PermissionError`` when writing its results; a new user's find).
    """
    path = Path(text)
    made: list[Path] = []
    try:
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} exists and is not a folder; pass a folder for the results")
        resolved = path.resolve()  # "new/../results" is ./results: ./new is neither made nor removed
        made = [folder for folder in (resolved, *resolved.parents) if not folder.exists()]
        resolved.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=resolved):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot write results to {text}: {exc.strerror or exc}; pass a folder you can write"
        ) from exc
    finally:
        for folder in made:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
    return path


QUOTED_CHARS = 200
"""How much of a refused word an error message quotes: a word may be a 120 KB JSON argument, not echoed whole."""


def quoted(text: str) -> str:
    """``repr(text)`` for an error message, cut to :data:`QUOTED_CHARS` characters
    (:func:`~inferscale.validation_text.shown_input`)."""
    return shown_input(text, QUOTED_CHARS)


def integer(text: str) -> int:
    """An integer, as ``int(text)`` reads it.

    Raises:
        argparse.ArgumentTypeError: for a word that is not one, quoted short (:func:`quoted`): argparse's own
            message for ``type=int`` echoed a 5,000-character word whole.
    """
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {quoted(text)}") from None


def number(text: str) -> float:
    """A number, as ``float(text)`` reads it.

    Raises:
        argparse.ArgumentTypeError: for a word that is not one, quoted short (:func:`quoted`).
    """
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {quoted(text)}") from None


_PARSERS: dict[type, Callable[[str], Any]] = {int: integer, float: number}
"""How a plain ``int`` or ``float`` field's word is read (a word that is not one is quoted short)."""


def int_list(text: str) -> tuple[int, ...]:
    """``"0,5,50"`` → ``(0, 5, 50)``: comma-separated non-negative integers.

    Raises:
        argparse.ArgumentTypeError: for an empty list, a non-integer or a negative value.
    """
    try:
        values = tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {quoted(text)}") from exc
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {quoted(text)}")
    return values


def name_list(text: str) -> tuple[str, ...]:
    """``"conv-26, conv-30"`` → ``("conv-26", "conv-30")``: comma-separated names, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def positive_int(text: str) -> int:
    """An integer >= 1.

    Raises:
        argparse.ArgumentTypeError: for a smaller value, or a word that is not an integer (:func:`integer`).
    """
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {quoted(text)}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0.

    Raises:
        argparse.ArgumentTypeError: for a negative value, or a word that is not an integer (:func:`integer`).
    """
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {quoted(text)}")
    return value


# ---------------------------------------------------------------------------------------------------- shared options

MODEL_OPTION = cli("--model", help="model folder or name (default: the embedded SmolLM2-135M-Instruct)")
"""``--model``: the chat model, for every command that loads one (``field(default=None, metadata=MODEL_OPTION)``)."""

DTYPE_OPTION = cli("--dtype", help="model dtype (default %(default)s)")
"""``--dtype``: the model's dtype, on a field typed :data:`inferscale.config.DType` (its values are the choices)."""

DEVICE_OPTION = cli("--device", help="cpu, cuda, cuda:N or auto (default %(default)s)")
"""``--device``: where the model runs."""

THREADS_OPTION = cli("--threads", type=positive_int, help="torch CPU threads (default: torch's)")
"""``--threads``: torch intra-op threads on CPU, on a field typed ``int | None``."""
