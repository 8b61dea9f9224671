"""The server's routes, one module per group: ``memories`` (Mem0's REST API), ``openai`` (chat completions and
models), ``ops`` (ping, health, metrics). Each group's router comes from :func:`group_router`, and :func:`route`
registers each path with and without its trailing slash.

The routes are built once, when their module is imported, and every app :func:`inferscale.server.app.create_app`
builds serves those same route objects (:func:`add_routes`). FastAPI's ``include_router`` would build every route
again for each app, on its first request: the parameter and response models of all 36, about 0.2 s of CPU on a 2-core
EPYC, which the first request of each server waited for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI

from inferscale.server.query import refuse_unknown_query

F = TypeVar("F", bound=Callable[..., Any])


def group_router(**kwargs: Any) -> APIRouter:
    """A router for one group of routes (``kwargs``: :class:`fastapi.APIRouter`'s, e.g. ``tags``, ``responses``).
    Every route added to it refuses a query parameter it does not declare (:func:`refuse_unknown_query`)."""
    return APIRouter(dependencies=[Depends(refuse_unknown_query)], **kwargs)


def add_routes(app: FastAPI, router: APIRouter) -> None:
    """Serve ``router``'s routes, as built, from ``app`` (the same route objects in every app: see the module's
    docstring). Unlike ``include_router``, this adds no prefix, tags or dependencies of its own: those are the
    router's, given to each route when it was added."""
    app.router.routes.extend(router.routes)


def route(router: APIRouter, method: str, path: str, **kwargs: Any) -> Callable[[F], F]:
    """Decorator: answer ``method path`` with the endpoint, under ``path`` as written (published in the OpenAPI
    schema) and under the other spelling of its trailing slash (not published). Mem0's client sends the slash;
    others often do not; neither is redirected."""

    def register(endpoint: F) -> F:
        router.add_api_route(path, endpoint, methods=[method], **kwargs)
        other = path.rstrip("/") if path.endswith("/") else f"{path}/"
        router.add_api_route(other, endpoint, methods=[method], **{**kwargs, "include_in_schema": False})
        return endpoint

    return register
