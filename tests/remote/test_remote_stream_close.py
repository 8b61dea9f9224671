"""Closing a server's client while one of its streams is read raises EngineClosedError, as the local client does; it
raised a ServerError that blamed the server ("got no complete reply ... (ReadError: Bad file descriptor); the
timeout is 300 s"). On a real server (the tiny engine), sync and async."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from client_adapter import open_client
from mem0_fakes import HashEmbedder, fake_config
from tiny_models import tiny_engine

from inferscale import AsyncMemoryClient, EngineClosedError, MemoryClient
from inferscale.remote import RemoteMemoryClient


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def test_closing_the_client_mid_stream_is_engine_closed(tmp_path: Path, engine: Any) -> None:
    pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'inferscale[server]')")
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
