"""Strict URLs: a query parameter the route does not declare, or one given twice, is refused with 400
``invalid_input``, as an unknown body field is, so that a misspelt one (``?agentid=a1``) is never silently ignored
(on ``DELETE /v1/memories/`` the misspelt scope id would otherwise leave the call to the key's whole scope). So is a
path or query string whose percent-escapes do not decode as UTF-8 (:func:`refuse_undecodable_url`).

:func:`refuse_unknown_query` is an app-wide FastAPI dependency: the parameters each route accepts are read from its
own declaration (its :class:`~fastapi.dependencies.models.Dependant` and those of its dependencies), so a route
added later is covered without a list to keep in step.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

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


async def refuse_undecodable_url(request: Request) -> None:
    """FastAPI dependency: refuse a request whose path or query string holds percent-escapes that are not UTF-8
    (``?user_id=%FF``, or an escaped lone surrogate ``%ED%A0%80``). The ASGI server and Starlette decode such bytes
    to U+FFFD, so every one of them named the same user ``"\ufffd"``: ``DELETE /v1/memories/?user_id=%FF`` deleted
    that user's memories (a differential fuzzer's find), where a body's text that is not UTF-8 is refused.

    Raises:
        InvalidInputError: naming the part of the URL (path or query string) to send as UTF-8.
    """
    for part, raw in (("path", request.scope.get("raw_path")), ("query string", request.scope.get("query_string"))):
        if not raw:
            continue
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(
                f"the URL's {part} holds percent-escapes that are not UTF-8 text; percent-encode text as UTF-8"
            ) from None
