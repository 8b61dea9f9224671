"""Whose memories: the scope every class of this package is bound to (Mem0Memory's ``context``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from llama_index.core.bridge.pydantic import BaseModel

from inferscale import InvalidInputError, ScopeError
from inferscale.scope import SCOPE_KEYS, check_scope_id


class ScopeKwargs(TypedDict, total=False):
    """The scope ids that are set, as keyword arguments of a ``MemoryClient`` call (an id not set is left out)."""

    user_id: str
    agent_id: str
    run_id: str


class InferScaleContext(BaseModel):
    """A scope: at least one of ``user_id``, ``agent_id`` and ``run_id`` (the fields of Mem0Memory's context).
    Build it with :meth:`of`, which checks it."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None

    @classmethod
    def of(
        cls, context: Mapping[str, Any] | InferScaleContext | None = None, **ids: str | int | None
    ) -> InferScaleContext:
        """A checked scope from a context dict (``{"user_id": ...}``), a context, or keyword ids (which win).

        An id is checked as ``MemoryClient`` checks it: an int is its decimal string (``42`` is ``"42"``, as in
        Mem0).

        Raises:
            ScopeError: when no id is set, or an id is neither a non-empty string nor an int.
            InvalidInputError: for a key other than user_id, agent_id and run_id, or an id longer than 255
                characters or holding a character no backend stores.
        """
        given = dict(context.ids() if isinstance(context, InferScaleContext) else (context or {}))
        given.update({k: v for k, v in ids.items() if v is not None})
        unknown = sorted(set(given) - set(SCOPE_KEYS))
        if unknown:
            raise InvalidInputError(f"unknown scope keys {unknown}; a context takes {', '.join(SCOPE_KEYS)}")
        given = {key: None if value is None else check_scope_id(key, value) for key, value in given.items()}
        if not any(given.values()):
            raise ScopeError("set at least one of user_id, agent_id or run_id (e.g. context={'user_id': 'alice'})")
        return cls(**given)

    def ids(self) -> ScopeKwargs:
        """The ids that are set, as keyword arguments for ``MemoryClient`` calls (and node metadata)."""
        ids = ScopeKwargs()
        if self.user_id:
            ids["user_id"] = self.user_id
        if self.agent_id:
            ids["agent_id"] = self.agent_id
        if self.run_id:
            ids["run_id"] = self.run_id
        return ids


def scope_ids_of(fields: Any) -> ScopeKwargs:
    """The scope ids of an object's ``user_id``, ``agent_id`` and ``run_id`` fields as they are now (set after
    construction or by ``model_copy(update=...)``), checked: what every call of that object is scoped to.

    Raises:
        ScopeError: when none is set, or an id is neither a non-empty string nor an int.
        InvalidInputError: for an id longer than 255 characters or holding a character no backend stores.
    """
    return InferScaleContext.of(user_id=fields.user_id, agent_id=fields.agent_id, run_id=fields.run_id).ids()
