"""Closing a server's client while one of its streams is read raises EngineClosedError, as the local client does; it
raised a ServerError that blamed the server ("got no complete reply ... (ReadError: Bad file descriptor); the
timeout is 300 s"). On a real server (the tiny engine), sync and async."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from client_adapter import open_client
from event_loops import run_on_own_loops
from mem0_fakes import HashEmbedder, fake_config
from tiny_models import tiny_engine

from inferscale import AsyncMemoryClient, EngineClosedError, MemoryClient
from inferscale.remote import RemoteMemoryClient


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def test_closing_the_client_mid_stream_is_engine_closed(tmp_path: Path, engine: Any) -> None:
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'inferscale-memory[server]')")
    served = open_client("remote", fake_config(tmp_path), engine=engine, embedder=HashEmbedder())
    try:
        served.add("My dog is called Biscuit.", user_id="maya", infer=False)
        client = served.client
        assert isinstance(client, RemoteMemoryClient)
        host = client.host
        remote = MemoryClient(host=host)
        stream = remote.chat("Tell me a long story.", user_id="maya", stream=True, max_new_tokens=200)
        next(iter(stream))
        remote.close()
        with pytest.raises(EngineClosedError, match="the client was closed while its stream was read"):
            list(stream)

        async def async_case() -> None:
            aremote = AsyncMemoryClient(host=host)
            astream = await aremote.chat("Tell me a long story.", user_id="maya", stream=True, max_new_tokens=200)
            await anext(aiter(astream))
            await aremote.close()
            with pytest.raises(EngineClosedError, match="the client was closed while its stream was read"):
                async for _ in astream:
                    pass

        asyncio.run(async_case())
        with MemoryClient(host=host) as again:  # the server answers on
            assert again.chat("What is my dog called?", user_id="maya", max_new_tokens=4).answer
    finally:
        served.close()


def test_one_async_remote_client_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    """Its httpx pool belonged to the first loop: a second ``asyncio.run`` raised a bare RuntimeError ("Event loop is
    closed"), no InferScaleError (tester report), where the local async client serves every loop."""
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'inferscale-memory[server]')")
    served = open_client("remote", fake_config(tmp_path), embedder=HashEmbedder())
    try:
        client = served.client
        assert isinstance(client, RemoteMemoryClient)
        aremote = AsyncMemoryClient(host=client.host)

        async def add(text: str) -> str:
            return str((await aremote.add(text, user_id="maya", infer=False))["results"][0]["event"])

        assert [asyncio.run(add(f"fact {i}")) for i in range(3)] == ["ADD"] * 3
        assert len(aremote._transport._clients) == 1  # those of the closed loops are dropped, not piled up
        assert run_on_own_loops(lambda i: add(f"thread fact {i}"), 3) == dict.fromkeys(range(3), "ADD")

        async def count_and_close() -> int:
            found = len((await aremote.get_all(user_id="maya"))["results"])
            await aremote.close()
            return found

        assert asyncio.run(count_and_close()) == 6
    finally:
        served.close()
