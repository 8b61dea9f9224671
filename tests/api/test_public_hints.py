"""The public clients' type hints take what the clients accept: an int scope id (docs/api.md: ``user_id=42`` is
``"42"``, as in Mem0) type-checks on every method that takes scope ids. They said ``str | None``, so ``mypy --strict``
refused correct code such as ``client.get_all(user_id=tenant)`` with an int ``tenant`` (an API contract review)."""

from __future__ import annotations

import inspect
import typing

import pytest

from inferscale import AsyncMemoryClient, MemoryClient
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient
from inferscale.scope import SCOPE_KEYS, ScopeId

CLIENTS = [MemoryClient, AsyncMemoryClient, RemoteMemoryClient, AsyncRemoteMemoryClient]


def _scoped_methods(cls: type) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and set(SCOPE_KEYS) <= set(inspect.signature(member).parameters)
    ]


@pytest.mark.parametrize("cls", CLIENTS, ids=lambda c: c.__name__)
def test_every_scope_id_parameter_takes_an_int(cls: type) -> None:
    methods = _scoped_methods(cls)
    assert {"add", "search", "get_all", "delete_all", "get", "update", "delete", "history", "chat"} <= set(methods)
    for name in methods:
        hints = typing.get_type_hints(getattr(cls, name))
        for key in SCOPE_KEYS:
            assert hints[key] == ScopeId | None, (name, key, hints[key])
    chat = typing.get_overloads(cls.chat)
    assert chat and all(typing.get_type_hints(o)[key] == ScopeId | None for o in chat for key in SCOPE_KEYS)
