"""Operational routes: ``/v1/ping/`` (who am I), ``/health`` and ``/metrics`` (no key needed for these two)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from inferscale.server.auth import CurrentCaller
from inferscale.server.errors import ERROR_RESPONSES
from inferscale.server.metrics import CONTENT_TYPE
from inferscale.server.routes import route
from inferscale.server.state import State

router = APIRouter(tags=["ops"])

_ANY = {"user_ids": None, "agent_ids": None, "run_ids": None}


@route(router, "GET", "/v1/ping/", responses=ERROR_RESPONSES)
async def ping(caller: CurrentCaller) -> dict[str, Any]:
    """Check the server and the API key: whether it is an admin key, and the scopes it may touch (``null``: any)."""
    scopes = _ANY if caller.key is None else caller.key.scopes()
    return {"status": "ok", "admin": caller.admin, "scopes": scopes}


@route(router, "HEAD", "/health", include_in_schema=False)  # load balancers' health checks: the status alone
@route(router, "GET", "/health")
async def health() -> dict[str, str]:
    """Liveness: ``{"status": "ok"}`` while the server answers (``HEAD /health`` too, for load balancers)."""
    return {"status": "ok"}


@route(router, "GET", "/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics(server: State) -> Response:
    """Prometheus metrics in the text format (see :mod:`inferscale.server.metrics`)."""
    return Response(server.metrics.render(), media_type=CONTENT_TYPE)
