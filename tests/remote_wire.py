"""A scripted InferScale server for the remote clients' unit tests (``httpx.MockTransport``): no server, no
network, no model."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from client_adapter import ClientAdapter, ClientKind

from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient

HOST = "http://inferscale.test:8000"

Reply = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class Wire:
    """A scripted server: records each request, and answers with the replies given to :meth:`answer`, in order
    (the last one again and again). An exception in the script is raised by the transport instead of a reply; a
    callable answers with what it returns for the request."""

    def __init__(self, kind: ClientKind) -> None:
        self.kind = kind
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []
        self._replies: list[Reply] = [httpx.Response(200, json={})]
        self._built: list[ClientAdapter] = []

    host = HOST

    def answer(self, *replies: Reply) -> None:
        self._replies = list(replies)

    @staticmethod
    def error(code: str, message: str, status: int) -> httpx.Response:
        """A reply in the server's error shape."""
        return httpx.Response(status, json={"error": {"code": code, "type": "Whatever", "message": message}})

    def _handle(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        self.times.append(time.monotonic())
        reply = self._replies.pop(0) if len(self._replies) > 1 else self._replies[0]
        if isinstance(reply, Exception):
            raise reply
        if callable(reply):
            return reply(request)
        return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)  # a fresh copy

    def client(self, **kwargs: Any) -> ClientAdapter:
        """A remote client of this test's kind on the scripted server (``HOST``), behind an adapter."""
        cls = RemoteMemoryClient if self.kind == "remote" else AsyncRemoteMemoryClient
        adapter = ClientAdapter(cls(HOST, transport=httpx.MockTransport(self._handle), **kwargs))
        self._built.append(adapter)
        return adapter

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def body(self, index: int = -1) -> Any:
        """The JSON body of a request (the last by default)."""
        return json.loads(self.requests[index].content)

    def close(self) -> None:
        for adapter in self._built:
            adapter.close()
