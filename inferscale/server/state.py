"""What every route of one app shares: the memory client, the key store, the options and the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from inferscale.async_client import AsyncMemoryClient
from inferscale.server.options import ServerOptions

if TYPE_CHECKING:
    from inferscale.server.keys import KeyStore
    from inferscale.server.metrics import Metrics


@dataclass(frozen=True, slots=True)
class ServerState:
    """The parts of one app.

    Attributes:
        client: the memory client every route calls (its public methods only).
        keys: the API keys; ``None`` runs the server open (no authentication).
        options: the server's settings.
        metrics: the app's Prometheus metrics.
        model_name: the model name ``/v1/models`` and chat replies report.
    """

    client: AsyncMemoryClient
    keys: KeyStore | None
    options: ServerOptions
    metrics: Metrics
    model_name: str


def server_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    state: ServerState = request.app.state.inferscale
    return state


State = Annotated[ServerState, Depends(server_state)]
"""A route parameter holding the app's :class:`ServerState`."""
