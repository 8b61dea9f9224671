"""The official ``openai`` client against the transformers-engine server on the real SmolLM2 (float32, greedy): a
streamed chat joins to the non-streamed answer, and both inject the user's stored memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config
from openai import OpenAI
from server_fixture import running_server

from inferscale import AsyncMemoryClient
from inferscale.config import EngineConfig
from inferscale.server.app import create_app
from inferscale.server.keys import KeyStore
from inferscale.server.options import ServerOptions

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is my dog's name?"}]


@pytest.fixture
def server(tmp_path: Path, smollm2_path: Path) -> Iterator[tuple[str, str, str]]:
    """(base URL, a key bound to alice, the id of alice's stored memory)."""
    engine = EngineConfig(model=str(smollm2_path), dtype="float32", device="cpu")
    config = fake_config(tmp_path, engine=engine)
    client = AsyncMemoryClient(config, embedder=HashEmbedder(), generator=ScriptedGenerator())
    keys = KeyStore.for_config(config)
    _, alice = keys.create("alice's agent", user_ids=["alice"])
    with running_server(create_app(client, keys=keys, options=ServerOptions())) as url:
        with httpx.Client(base_url=url, headers={"Authorization": f"Token {alice}"}) as http:
            added = http.post("/v1/memories/", json={"messages": "My dog is a beagle named Biscuit.", "infer": False})
        yield url, alice, added.json()["results"][0]["id"]
    keys.close()


def test_the_openai_client_streams_a_chat_with_injected_memory(server: tuple[str, str, str]) -> None:
    url, key, memory_id = server
    openai = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    assert [m.id for m in openai.models.list().data] == ["SmolLM2-135M-Instruct"]
    whole = openai.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,
        max_tokens=24,
        temperature=0,  # type: ignore[arg-type]
    )
    answer = whole.choices[0].message.content
    report: dict[str, Any] = (whole.model_extra or {})["inferscale"]
    assert report["memory_ids"] == [memory_id] and report["memories"] == ["My dog is a beagle named Biscuit."]
    assert report["memory_tokens"] > 0 and whole.usage is not None
    assert whole.usage.completion_tokens == report["generated_tokens"] > 0
    assert "Biscuit" in (answer or "")  # the memory reached the model

    stream = openai.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert "".join(deltas) == answer
    streamed: dict[str, Any] = (finals[0].model_extra or {})["inferscale"]
    assert streamed["memory_ids"] == [memory_id]
    assert streamed["generated_tokens"] == report["generated_tokens"]
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None and usage.total_tokens == whole.usage.total_tokens
