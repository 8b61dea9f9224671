"""The server's routes, one module per group: ``memories`` (Mem0's REST API), ``openai`` (chat completions and
models), ``ops`` (ping, health, metrics). :func:`route` registers each path with and without its trailing slash."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter

F = TypeVar("F", bound=Callable[..., Any])


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
