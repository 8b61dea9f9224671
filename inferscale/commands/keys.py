"""``inferscale keys create | list | revoke``: the server's API keys, in the local store's database
(:class:`inferscale.server.keys.KeyStore`; ``--data-dir`` names the same database ``inferscale serve`` reads).

``keys create`` prints the key string once, with a warning on stderr that it is not shown again (only its hash is
kept). ``--json`` prints ``{"api_key": <ApiKey>, "key": <key string>}`` for ``create``, the list of keys for
``list`` and the revoked key for ``revoke``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inferscale.cli_options import add_options, cli, from_args
from inferscale.commands.options import OutputOptions, Parents, StoreOptions
from inferscale.errors import InvalidInputError

if TYPE_CHECKING:
    from inferscale.server.keys import KeyStore

__all__ = ["KeyCreateOptions", "KeyRevokeOptions", "add_keys_parser"]


def _ids(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


@dataclass(frozen=True)
class KeyCreateOptions:
    """``inferscale keys create``'s own options: the key's name and the scopes it may touch (repeatable flags; a
    kind not given: any id of it)."""

    name: str = field(metadata=cli("NAME", help="a label for the key, e.g. who holds it"))
    user_ids: tuple[str, ...] | None = field(
        default=None, metadata=cli("--user", action="append", metavar="ID", help="a user id it may touch (repeatable)")
    )
    agent_ids: tuple[str, ...] | None = field(
        default=None,
        metadata=cli("--agent", action="append", metavar="ID", help="an agent id it may touch (repeatable)"),
    )
    run_ids: tuple[str, ...] | None = field(
        default=None, metadata=cli("--run", action="append", metavar="ID", help="a run id it may touch (repeatable)")
    )
    admin: bool = field(
        default=False,
        metadata=cli("--admin", action="store_true", help="an admin key: every scope and reset, no scope lists"),
    )


@dataclass(frozen=True)
class KeyRevokeOptions:
    """``inferscale keys revoke``'s own options."""

    key_id: str = field(metadata=cli("KEY_ID", help="the key's id, as `inferscale keys list` shows it"))


def _with_store(args: argparse.Namespace, act: Callable[[KeyStore, bool], None], *, creates_store: bool = False) -> int:
    """Open the key store the store options name (which must exist unless the command ``creates_store``), run
    ``act(store, as_json)``, close the store."""
    from inferscale.commands import client as clients

    store = clients.open_key_store(from_args(StoreOptions, args), creates_store=creates_store)
    try:
        act(store, from_args(OutputOptions, args).as_json)
    finally:
        store.close()
    return 0


def _create(args: argparse.Namespace) -> int:
    opts = from_args(KeyCreateOptions, args)
    if not opts.admin and opts.user_ids is None and opts.agent_ids is None and opts.run_ids is None:
        raise InvalidInputError(
            "a key needs --user, --agent or --run (the scopes it may touch, repeatable), or --admin for a key that "
            "may touch every scope"
        )

    def act(store: KeyStore, as_json: bool) -> None:
        from inferscale.commands.output import print_json, stderr, stdout, terminal_safe

        api_key, key = store.create(
            opts.name,
            user_ids=_ids(opts.user_ids),
            agent_ids=_ids(opts.agent_ids),
            run_ids=_ids(opts.run_ids),
            admin=opts.admin,
        )
        warning = "save this key now: it is not shown again (only its hash is stored)"
        if as_json:
            print_json({"api_key": api_key, "key": key})
            stderr().print(f"warning: {warning}", style="yellow", highlight=False)
            return
        out = stdout()
        out.print(f"created API key {api_key.key_id} ({terminal_safe(api_key.name)}):", highlight=False)
        out.print(key, markup=False, highlight=False, soft_wrap=True)
        stderr().print(f"warning: {warning}", style="bold yellow", highlight=False)

    return _with_store(args, act, creates_store=True)


def _list(args: argparse.Namespace) -> int:
    def act(store: KeyStore, as_json: bool) -> None:
        from inferscale.commands.output import keys_table, print_json, stdout

        keys = store.list()
        if as_json:
            print_json(keys)
        else:
            stdout().print(keys_table(keys))

    return _with_store(args, act)


def _revoke(args: argparse.Namespace) -> int:
    opts = from_args(KeyRevokeOptions, args)

    def act(store: KeyStore, as_json: bool) -> None:
        from inferscale.commands.output import print_json, stdout, terminal_safe, when

        api_key = store.revoke(opts.key_id)
        if as_json:
            print_json(api_key)
        else:
            name = terminal_safe(api_key.name)
            stdout().print(f"revoked API key {api_key.key_id} ({name}) at {when(api_key.revoked_at)} UTC")

    return _with_store(args, act)


def add_keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], parents: Parents) -> None:
    """Add ``keys`` (``keys create``, ``keys list``, ``keys revoke``) to the ``inferscale`` subcommand parsers."""
    keys = sub.add_parser("keys", help="the server's API keys: create, list, revoke")
    commands = keys.add_subparsers(dest="keys_command", metavar="{create,list,revoke}", required=True)
    create = commands.add_parser(
        "create", parents=parents.keys, help="create a key bound to scopes (or --admin); prints it once"
    )
    add_options(create, KeyCreateOptions).set_defaults(func=_create)
    commands.add_parser("list", parents=parents.keys, help="every key, revoked ones too").set_defaults(func=_list)
    revoke = commands.add_parser("revoke", parents=parents.keys, help="revoke a key at once")
    add_options(revoke, KeyRevokeOptions).set_defaults(func=_revoke)
