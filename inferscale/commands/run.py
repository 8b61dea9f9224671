"""Running one memory command: build its client, make its call, print the return value (JSON or a table)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from inferscale.commands.options import Common

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.commands.client import CommandClient

__all__ = ["opened", "run_call"]

T = TypeVar("T")


@contextlib.contextmanager
def opened(args: argparse.Namespace, *, creates_store: bool = False) -> Iterator[tuple[CommandClient, Common]]:
    """The client a memory command calls (:func:`inferscale.commands.client.open_client`) and its parsed shared
    options; the client is closed when the block ends. A local store must exist unless the command
    ``creates_store``.

    Raises:
        InvalidInputError: for options that do not go together (see ``open_client``).
        ConfigError: for a store that does not exist or a config that does not validate (see ``open_client``).
    """
    from inferscale.commands import client as clients

    common = Common.from_args(args)
    with clients.open_client(common.store, common.model, common.remote, creates_store=creates_store) as client:
        yield client, common


def run_call(
    args: argparse.Namespace,
    call: Callable[[CommandClient, Common], T],
    show: Callable[[T, Common, Console], None],
    busy: str,
    *,
    creates_store: bool = False,
) -> int:
    """Run one memory command: make ``call`` on its client (:func:`opened`, with ``creates_store``) under a spinner
    saying ``busy``, close the client, then print the value (``--json``) or ``show`` it.

    Returns:
        0 (errors propagate, for ``inferscale.cli.main`` to print).
    """
    from inferscale.commands.output import print_json, stdout, working

    with (
        opened(args, creates_store=creates_store) as (client, common),
        working(None if common.output.as_json else busy),
    ):
        value = call(client, common)
    if common.output.as_json:
        print_json(value)
    else:
        show(value, common, stdout())
    return 0
