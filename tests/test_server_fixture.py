"""The tests' server (:mod:`server_fixture`) gives each ``running_server`` block what a uvicorn server of its own
gave it: real HTTP on a port no other app is on, the app's lifespan startup before the block and its shutdown after
it, once its requests are done, and the app's lifespan state in every request; a port given back answers 503."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

pytest.importorskip("uvicorn", reason="the test server needs uvicorn (pip install 'inferscale-memory[server]')")

from server_fixture import POOL_SIZE, running_server


class Recorder:
    """A bare ASGI app named ``name``: its lifespan puts ``{"name": name}`` in its state and records "startup" and
    "shutdown" in ``events``; a request answers ``"<name> <state's name>"`` (after ``release`` is set, for the path
    ``/slow``) and records "replied"."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.events: list[str] = []
        self.release = threading.Event()
        self.started = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"].removeprefix("lifespan.")
                if kind == "startup":
                    scope["state"]["name"] = self.name
                self.events.append(kind)
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        if scope["path"] == "/slow":
            self.started.set()
            await asyncio.to_thread(self.release.wait, 30)
        body = f"{self.name} {scope['state']['name']}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body})
        self.events.append("replied")


def test_each_block_has_its_own_port_and_its_apps_lifespan() -> None:
    first, second = Recorder("first"), Recorder("second")
    with running_server(first) as first_url:
        assert first.events == ["startup"]
        with running_server(second) as second_url:
            assert first_url != second_url
            assert httpx.get(f"{second_url}/").text == "second second"
            assert httpx.get(f"{first_url}/").text == "first first"
        assert second.events == ["startup", "replied", "shutdown"]
        assert httpx.get(f"{second_url}/").status_code == 503  # given back: no app there any more
        assert httpx.get(f"{first_url}/").text == "first first"
    assert first.events == ["startup", "replied", "replied", "shutdown"]


def test_the_shutdown_waits_for_the_request_in_flight() -> None:
    app = Recorder("slow")
    replies: list[httpx.Response] = []
    with ExitStack() as block:
        url = block.enter_context(running_server(app))
        request = threading.Thread(target=lambda: replies.append(httpx.get(f"{url}/slow", timeout=30)))
        request.start()
        assert app.started.wait(30)
        closing = threading.Thread(target=block.close)  # the block ends while the request runs
        closing.start()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/").status_code != 503 and time.monotonic() < deadline:  # the port is given up...
            time.sleep(0.01)
        assert app.events == ["startup"]  # ...but the app is not shut down under its request
        app.release.set()
        closing.join(30)
        request.join(30)
    assert [r.text for r in replies] == ["slow slow"]
    assert app.events == ["startup", "replied", "shutdown"]


def test_blocks_beyond_the_pool_get_a_server_of_their_own() -> None:
    apps = [Recorder(f"app{i}") for i in range(POOL_SIZE + 2)]
    with ExitStack() as stack:
        urls = [stack.enter_context(running_server(app)) for app in apps]
        assert len(set(urls)) == len(apps)
        assert [httpx.get(f"{url}/").text for url in urls] == [f"{app.name} {app.name}" for app in apps]
    assert all(app.events == ["startup", "replied", "shutdown"] for app in apps)
