"""The server's FastAPI application: :func:`create_app`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from inferscale.async_client import AsyncMemoryClient
from inferscale.server.errors import UnexpectedErrors, install_error_handlers, install_request_ids, openapi_without_422
from inferscale.server.keys import KeyStore
from inferscale.server.limits import BodySizeLimit
from inferscale.server.local_only import LocalOnlyWhileOpen
from inferscale.server.metrics import Metrics, RequestMetrics
from inferscale.server.options import ServerOptions
from inferscale.server.query import refuse_undecodable_url, refuse_unknown_query
from inferscale.server.routes import memories, openai, ops
from inferscale.server.shutdown import ShutdownClock
from inferscale.server.state import ServerState

API_VERSION = "1"


def create_app(
    client: AsyncMemoryClient,
    *,
    keys: KeyStore | None,
    options: ServerOptions,
    shutdown_clock: ShutdownClock | None = None,
) -> FastAPI:
    """The InferScale server: Mem0's memory REST API, OpenAI's chat completions and models, ping, health, metrics
    and the OpenAPI schema (``/openapi.json``, ``/docs``), all answering through ``client``'s public methods.

    The app owns ``client``: it is closed when the app shuts down (uvicorn's lifespan), its background K/V encoder
    given what is left of the shutdown grace. Build one client per app.

    Args:
        client: the async memory client (its store, index, engine and K/V).
        keys: the API keys; ``None``, or a store holding no key, runs the server without authentication (keep it on
            loopback: :func:`inferscale.server.run.serve_transformers` refuses other hosts then). While open, requests
            whose ``Host`` or ``Origin`` is not a loopback one are refused (:mod:`inferscale.server.local_only`).
        options: the server's settings (request size limit, chat defaults, served model name, shutdown grace).
        shutdown_clock: when the server began stopping (:func:`inferscale.server.shutdown.serve_uvicorn` starts it
            on the signal). At shutdown the client's background K/V encoder gets what is left of
            ``options.shutdown_grace_s`` counted from it (``client.close(encoding_timeout=...)``); the memories it
            leaves unencoded then are logged and encoded on first use. ``None``: the grace is counted from the
            lifespan's shutdown (after the running requests ended).

    Returns:
        the ASGI application; construction does no I/O.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            clock = shutdown_clock if shutdown_clock is not None else ShutdownClock()  # None: begun now
            await client.close(encoding_timeout=clock.left(options.shutdown_grace_s))

    app = FastAPI(
        title="InferScale",
        version=API_VERSION,
        summary="Long-term memory for LLM agents: Mem0's REST API and OpenAI's chat completions with KV-injected "
        "recall",
        redirect_slashes=False,
        lifespan=lifespan,
        # every route: a query parameter it does not declare, or a URL that is not UTF-8, is a 400
        dependencies=[Depends(refuse_undecodable_url), Depends(refuse_unknown_query)],
    )
    metrics = Metrics(client)
    app.state.inferscale = ServerState(
        client=client,
        keys=keys,
        options=options,
        metrics=metrics,
        model_name=options.served_model_name or client.model_name,
    )
    install_error_handlers(app)
    app.openapi = lambda: openapi_without_422(app)  # type: ignore[method-assign]
    for group in (memories, openai, ops):
        app.include_router(group.router)
    # Middleware added last runs first: metrics see every reply, the 403s of an open server's cross-site check, the
    # 413s of the size limit and the 500s included; the request id is set before all of them and on every reply.
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(BodySizeLimit, max_bytes=options.max_request_bytes)
    app.add_middleware(LocalOnlyWhileOpen, keys=keys)
    docs = frozenset(p for p in (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url) if p)
    app.add_middleware(RequestMetrics, metrics=metrics, fixed_paths=docs)
    install_request_ids(app)
    return app
