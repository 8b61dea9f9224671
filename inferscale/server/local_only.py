"""Keeping an open server (no API keys) to its own machine's clients: browsers included.

An open server listens on loopback only, but a web page in a browser on the same machine can still reach it: a
cross-site form post or ``fetch`` sends the request (the page cannot read the reply, but a ``POST /v1/reset/`` has
done its work by then), and a DNS-rebinding page (its own name made to resolve to ``127.0.0.1``) can read replies
too. Both are told apart from the server's real clients by two headers a page cannot forge:

- ``Host`` names the server as the client reached it: a rebinding page's request carries the page's own name. While
  the server is open, only loopback names are accepted (``localhost``, ``127.0.0.0/8``, ``::1``, any port); a
  request without a ``Host`` header (HTTP/1.0) is let through, since no browser sends one;
- ``Origin`` is sent by browsers on every cross-site ``POST``/``PUT``/``DELETE`` and ``fetch``; while the server is
  open a request carrying one that is not a loopback origin (``null`` included) is refused.

A refused request is answered 403 ``permission_denied`` with the structured body. With API keys the checks are off:
a browser cannot attach the ``Authorization`` header cross-site without a CORS preflight, which the server never
grants, a rebinding page does not know a key, and a keyed server may be reached under any name.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from inferscale.errors import PermissionDeniedError
from inferscale.server.errors import error_response
from inferscale.server.keys import KeyStore

LOOPBACK_NAMES = frozenset({"localhost"})
"""Host names that are loopback by definition (IP addresses are judged by :mod:`ipaddress`)."""


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` (a host name or IP address, no port, IPv6 without brackets) is a loopback name."""
    if not host:
        return False
    host = host.lower().rstrip(".")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str | None:
    """The host of ``host[:port]`` (``[v6]:port`` too), or ``None`` when it cannot be read."""
    try:
        return urlsplit(f"//{netloc}").hostname
    except ValueError:  # e.g. an unclosed '[' or a port that is not a number
        return None


def cross_site_reason(headers: Headers) -> str | None:
    """Why a request to an open server is refused, or ``None`` when its ``Host`` and ``Origin`` headers are those of
    a client on this machine (see the module docstring)."""
    host = headers.get("host")
    if host is not None and not is_loopback_host(_hostname(host)):
        return (
            f"this server has no API keys, so it answers only requests addressed to a loopback name "
            f"(localhost, 127.0.0.1, [::1]); the Host header names {host[:100]!r}. Create an API key "
            f"(`inferscale keys create`) to serve other names"
        )
    origin = headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin) if origin != "null" else None
        if parts is None or parts.scheme not in ("http", "https") or not is_loopback_host(_hostname(parts.netloc)):
            return (
                f"this server has no API keys, so it refuses requests from web pages of other sites; the Origin "
                f"header is {origin[:100]!r}. Call it from a page on localhost, or create an API key "
                f"(`inferscale keys create`) and send it"
            )
    return None


def is_open(keys: KeyStore | None) -> bool:
    """Whether the server runs without authentication: no key store, or one that never held a key. Blocking (may
    read the key store): call it in a worker thread from async code."""
    return keys is None or not keys.has_keys()


class LocalOnlyWhileOpen:
    """ASGI middleware: while the server is open (no API keys), refuses with 403 ``permission_denied`` any HTTP
    request whose ``Host`` or ``Origin`` is not a loopback one (see the module docstring). A request that passes the
    header checks costs no key-store read.

    Args:
        app: the wrapped application.
        keys: the server's API keys (``None``: always open).
    """

    def __init__(self, app: ASGIApp, keys: KeyStore | None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            reason = cross_site_reason(Headers(scope=scope))
            if reason is not None and await run_in_threadpool(is_open, self.keys):
                await error_response(PermissionDeniedError(reason))(scope, receive, send)
                return
        await self.app(scope, receive, send)
