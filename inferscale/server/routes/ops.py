"""Operational routes: ``/v1/ping/`` (who am I), ``/v1/encoding/wait/`` (drain the background K/V encoder),
``/health`` (no key needed) and ``/metrics`` (an admin key on a server with keys)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from inferscale.arguments import check_timeout
from inferscale.server.auth import CurrentCaller
from inferscale.server.errors import ERROR_RESPONSES
from inferscale.server.metrics import CONTENT_TYPE
from inferscale.server.routes import route
from inferscale.server.schemas import EncodingWaitBody
from inferscale.server.state import State
from inferscale.server.strict_json import StrictJSONRoute

router = APIRouter(tags=["ops"], route_class=StrictJSONRoute)

_ANY = {"user_ids": None, "agent_ids": None, "run_ids": None}

ENCODING_WAIT_MAX_S = 60.0
"""The longest one ``/v1/encoding/wait/`` request waits (seconds), so that no request holds its connection without
end; the remote clients' ``wait_for_encoding`` sends as many as its timeout needs."""


@route(router, "GET", "/v1/ping/", responses=ERROR_RESPONSES)
async def ping(caller: CurrentCaller) -> dict[str, Any]:
    """Check the server and the API key: whether it is an admin key, and the scopes it may touch (``null``: any)."""
    scopes = _ANY if caller.key is None else caller.key.scopes()
    return {"status": "ok", "admin": caller.admin, "scopes": scopes}


@route(router, "POST", "/v1/encoding/wait/", responses=ERROR_RESPONSES)
async def wait_for_encoding(body: EncodingWaitBody, caller: CurrentCaller, server: State) -> dict[str, bool]:
    """Wait until the background K/V encoder has finished what ``add`` queued (``MemoryClient.wait_for_encoding``),
    for at most ``timeout`` seconds and :data:`ENCODING_WAIT_MAX_S` (``null``: that most): ``{"done": true}`` when
    nothing is left to encode, ``false`` when the wait ran out first. The wait runs on the event loop (no worker
    thread is held). It needs an admin key (403 ``permission_denied`` otherwise): the queue holds every tenant's
    memories, so its state is not a bound key's to see."""
    caller.require_admin("waiting for the background K/V encoder")
    timeout = check_timeout(body.timeout)
    limit = ENCODING_WAIT_MAX_S if timeout is None else min(timeout, ENCODING_WAIT_MAX_S)
    return {"done": await server.client.wait_for_encoding(limit)}


@route(router, "HEAD", "/health", include_in_schema=False)  # load balancers' health checks: the status alone
@route(router, "GET", "/health")
async def health() -> dict[str, str]:
    """Liveness: ``{"status": "ok"}`` while the server answers (``HEAD /health`` too, for load balancers)."""
    return {"status": "ok"}


@route(
    router,
    "GET",
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {}}}, **ERROR_RESPONSES},
)
async def metrics(caller: CurrentCaller, server: State) -> Response:
    """Prometheus metrics in the text format (see :mod:`inferscale.server.metrics`). On a server with keys it needs an
    admin key (401 without a key, 403 ``permission_denied`` for a key bound to scopes): the figures count every
    tenant's requests, tokens and memories waiting for the encoder, which a bound key may not learn
    (``/v1/encoding/wait/``'s rule). A Prometheus scrape job sends the key with its ``authorization`` setting."""
    caller.require_admin("reading the server's metrics")
    return Response(server.metrics.render(), media_type=CONTENT_TYPE)
