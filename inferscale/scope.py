"""Tenant scope: the ``user_id`` / ``agent_id`` / ``run_id`` triple that isolates memories.

Given ids are ANDed: a memory is visible to a scope when every id the scope names is equal to the memory's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypedDict

from inferscale.errors import InvalidInputError, ScopeError
from inferscale.storable import check_storable, is_blank
from inferscale.validation_text import shown_input

ScopeId = str | int
"""A ``user_id``, ``agent_id`` or ``run_id`` as callers give it: a non-empty string, or an int, which is its
decimal string (``user_id=42`` is ``"42"``, as in Mem0)."""

SCOPE_KEYS: tuple[str, ...] = ("user_id", "agent_id", "run_id")

MAX_ID_LENGTH = 255
"""The longest scope id in characters (the width of the ``user_id``/``agent_id``/``run_id`` columns)."""


def int_id_text(value: int, name: str) -> str:
    """The scope id an int stands for: its decimal string (Mem0 takes ``user_id=42`` as ``"42"``).

    Raises:
        InvalidInputError: when it has more than :data:`MAX_ID_LENGTH` digits (no id is that long; ``str`` of a
            much longer int would raise a bare ``ValueError``), naming ``name``.
    """
    if abs(value) >= 10**MAX_ID_LENGTH:
        raise InvalidInputError(
            f"{name} is an integer of over {MAX_ID_LENGTH} digits; a scope id holds at most {MAX_ID_LENGTH}"
        )
    return str(value)


def check_scope_id(key: str, value: object) -> str:
    """``value`` when it can be the scope id ``key`` (``"user_id"``, ``"agent_id"`` or ``"run_id"``), an int as its
    decimal string (``42`` is ``"42"``, as Mem0 takes a database key): the one check of a given id, shared by
    :class:`Scope` and the remote client (which refuses a bad id before sending it).

    Raises:
        ScopeError: when ``value`` is neither a non-empty string nor an int (a bool, a float, a list, ``""``,
            whitespace).
        InvalidInputError: when it is longer than :data:`MAX_ID_LENGTH` characters or holds a character no backend
            can store (a lone surrogate or NUL; see :mod:`inferscale.storable`).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = int_id_text(value, key)
    if not isinstance(value, str) or is_blank(value):
        raise ScopeError(f"{key} must be a non-empty string or an int, got {shown_input(value)}")
    check_storable(value, key)
    if len(value) > MAX_ID_LENGTH:
        raise InvalidInputError(
            f"{key} is {len(value):,} characters; a scope id holds at most {MAX_ID_LENGTH}. Use a shorter id (e.g. "
            "a hash of the long one)"
        )
    return value


def check_scope_ids(user_id: object, agent_id: object, run_id: object) -> tuple[str | None, str | None, str | None]:
    """The three scope ids of a call, each given one checked by :func:`check_scope_id` (an int made its string);
    ``None`` for one not given. The one check of a call's ids, shared by the local clients (before an id is compared
    with the filter's) and the remote ones (before the ids are sent).

    Raises:
        ScopeError, InvalidInputError: as :func:`check_scope_id`.
    """
    ids = [
        None if value is None else check_scope_id(key, value)
        for key, value in zip(SCOPE_KEYS, (user_id, agent_id, run_id), strict=True)
    ]
    return ids[0], ids[1], ids[2]


class ScopeIds(TypedDict):
    """The scope keyword arguments of a client call (``user_id``, ``agent_id``, ``run_id``; ``None``: not named)."""

    user_id: str | None
    agent_id: str | None
    run_id: str | None


@dataclass(frozen=True, slots=True)
class Scope:
    """The ids a call is limited to. At least one must be set.

    Raises:
        ScopeError: when no id is given, or an id is neither a non-empty string nor an int (an int is kept as its
            string, :func:`check_scope_id`).
        InvalidInputError: when an id is longer than :data:`MAX_ID_LENGTH` characters or holds a character no
            backend can store (a lone surrogate or NUL; see :mod:`inferscale.storable`).
    """

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None

    def __post_init__(self) -> None:
        for key in SCOPE_KEYS:
            value = getattr(self, key)
            if value is not None:
                object.__setattr__(self, key, check_scope_id(key, value))  # an int id becomes its string
        if self.user_id is None and self.agent_id is None and self.run_id is None:
            raise ScopeError("at least one of user_id, agent_id or run_id is required; memories are always scoped")

    @classmethod
    def of(cls, user_id: ScopeId | None, agent_id: ScopeId | None, run_id: ScopeId | None) -> Scope:
        """The scope of a call's ids as callers give them (an int is its decimal string, :func:`check_scope_id`).

        Raises:
            ScopeError, InvalidInputError: as the class.
        """
        return cls(*check_scope_ids(user_id, agent_id, run_id))

    @classmethod
    def of_row(cls, user_id: str | None, agent_id: str | None, run_id: str | None) -> Scope:
        """The scope of ids read from a stored row, taken as they are, unchecked: the database holds only ids that
        passed the check of the release that wrote them (an id of invisible characters only passed before
        :func:`~inferscale.storable.is_blank`), and a memory must stay readable and deletable by its id whatever the
        check of a given id has become since (a review's find: such a memory could no longer be deleted)."""
        scope = object.__new__(cls)
        for key, value in zip(SCOPE_KEYS, (user_id, agent_id, run_id), strict=True):
            object.__setattr__(scope, key, value)
        return scope

    def as_dict(self) -> dict[str, str]:
        """The ids that are set, e.g. ``{"user_id": "alice"}``."""
        return {k: v for k in SCOPE_KEYS if (v := getattr(self, k)) is not None}

    def key(self) -> str:
        """A stable string naming this scope, used to salt caches so tenants never share entries: the JSON array of
        the three ids, e.g. ``'["alice", null, null]'``. Distinct scopes have distinct keys whatever their ids hold
        (``"auth0|42"``, ``"="``, quotes), since JSON escapes every character that could end an id."""
        return json.dumps([self.user_id, self.agent_id, self.run_id])
