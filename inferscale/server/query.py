"""Strict query strings: a query parameter the route does not declare, or one given twice, is refused with 400
``invalid_input``, as an unknown body field is, so that a misspelt one (``?agentid=a1``) is never silently ignored
(on ``DELETE /v1/memories/`` the misspelt scope id would otherwise leave the call to the key's whole scope).

:func:`refuse_unknown_query` is an app-wide FastAPI dependency: the parameters each route accepts are read from its
own declaration (its :class:`~fastapi.dependencies.models.Dependant` and those of its dependencies), so a route
added later is covered without a list to keep in step.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from inferscale.errors import InvalidInputError


def declared_query(dependant: Dependant) -> frozenset[str]:
    """The query parameter names (aliases) ``dependant`` and its dependencies, at any depth, declare."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= declared_query(sub)
    return frozenset(names)


async def refuse_unknown_query(request: Request) -> None:
    """FastAPI dependency: refuse a query parameter the matched route does not declare, and one given more than once
    (every parameter this server declares takes one value: ``?user_id=u1&user_id=u2`` was read as ``u2``, a new
    user's find).

    Raises:
        InvalidInputError: naming the unknown parameters and the ones the route accepts, or the repeated ones.
    """
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    accepted = declared_query(route.dependant)  # a walk over a handful of nodes: cheaper than any cache key
    unknown = sorted({name for name in request.query_params if name not in accepted})
    if unknown:
        allowed = ", ".join(sorted(accepted)) or "none"
        raise InvalidInputError(
            f"unknown query parameter(s) {', '.join(map(repr, unknown))} for {request.method} {route.path}; "
            f"it accepts: {allowed}"
        )
    repeated = sorted({name for name in request.query_params if len(request.query_params.getlist(name)) > 1})
    if repeated:
        raise InvalidInputError(
            f"query parameter(s) {', '.join(map(repr, repeated))} given more than once for {request.method} "
            f"{route.path}: give each once"
        )
