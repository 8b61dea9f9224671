"""The vLLM engine answers its token layout and context limit from the tokenizer and config alone before its
encoder is loaded (so ``add`` measures a memory's span without loading weights or starting vLLM), and refuses a memory
too long for ``max_model_len`` as its encoder would. Needs vLLM importable (``make test-vllm``); starts no vLLM."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from vllm_guard import skip_module_unless_importable

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
skip_module_unless_importable("vllm")

from mem0_fakes import HashEmbedder  # noqa: E402
from tiny_models import byte_chat_tokenizer, tiny_model  # noqa: E402

from inferscale import ContextLengthError, InvalidInputError, MemoryClient, MemoryConfig  # noqa: E402
from inferscale.config import EngineConfig, KVConfig  # noqa: E402
from inferscale.conversation import ChatMessage  # noqa: E402
from inferscale.engines.hf import PromptLayout  # noqa: E402
from inferscale.engines.transformers import TransformersEngine  # noqa: E402
from inferscale.engines.vllm import VLLMEngine  # noqa: E402
from inferscale.errors import EngineClosedError  # noqa: E402
from inferscale.kv.encode import EncodeRequest  # noqa: E402

SYSTEM_PROMPT = "Memories:\n"
MAX_MODEL_LEN = 100
"""vLLM's context limit here, below the tiny model's 128 positions."""


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-vllm")
    tiny_model("llama", max_position_embeddings=128).save_pretrained(folder)
    byte_chat_tokenizer().save_pretrained(folder)
    return folder


def _engine(folder: Path) -> VLLMEngine:
    config = EngineConfig(model=str(folder), dtype="float32", device="cpu")
    return VLLMEngine(config, SYSTEM_PROMPT, max_model_len=MAX_MODEL_LEN)


def test_layout_and_limit_come_from_the_tokenizer_alone(model_folder: Path) -> None:
    engine = _engine(model_folder)
    layout = PromptLayout(byte_chat_tokenizer(), SYSTEM_PROMPT)
    assert engine.max_context_tokens == MAX_MODEL_LEN
    assert engine.system_prefix_ids() == layout.prefix_ids
    assert engine.fact_token_ids("I like tea.") == layout.fact_ids("I like tea.")
    assert not engine._encoder_ready  # no weights loaded, no vLLM started


def test_add_refuses_a_fact_past_max_model_len_without_loading(model_folder: Path, tmp_path: Path) -> None:
    engine = _engine(model_folder)
    config = MemoryConfig(data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(encode_on_add="lazy"))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        client.add("I like tea.", user_id="maya", infer=False)
        with pytest.raises(InvalidInputError, match=f"the model's context is {MAX_MODEL_LEN} tokens"):
            client.add("x" * 90, user_id="maya", infer=False)  # fits the model's 128 positions, not max_model_len
        assert [m["memory"] for m in client.get_all(user_id="maya")["results"]] == ["I like tea."]
    assert not engine._encoder_ready


class _Builder:
    """The service's request builder, less vLLM: hands back the facts it is given."""

    def __init__(self, tokenizer: object) -> None:
        self.layout = PromptLayout(tokenizer, SYSTEM_PROMPT)

    def prepare_kv(
        self, conversation: object, facts: list[object], cache_scope: str, *, recompute_tail: int = 0
    ) -> list[object]:
        assert recompute_tail == 0  # the service's default: pure injection
        return facts


QUERY = [ChatMessage("user", "Long tea?")]


def _tiny_engine() -> TransformersEngine:
    model = tiny_model("llama", max_position_embeddings=128)
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), SYSTEM_PROMPT, model=model, tokenizer=byte_chat_tokenizer()
    )


def _long_text(engine: TransformersEngine, fact_tokens: int) -> str:
    """A memory whose line takes ``fact_tokens`` tokens (the byte tokenizer: one token per character)."""
    text = "Long: " + "x" * (fact_tokens - len(engine.fact_token_ids("")) - 6)
    assert len(engine.fact_token_ids(text)) == fact_tokens
    return text


def test_the_vllm_servers_memory_serves_a_stored_memory_that_fits_only_without_its_turns(tmp_path: Path) -> None:
    """``inferscale serve --engine vllm`` retrieves through the client and asks it for the K/V: a memory stored under
    w = 0 that does not fit with its turns under w = 5 failed every request that retrieved it, then was left out of
    them; it is served from its context-free encoding (tests/api/test_add_span_check.py). The service retrieves one
    memory, the long one, so that the prompt fits the context with the query and one answer token."""
    from inferscale.server.vllm_memory import MemoryService

    engine = _tiny_engine()
    builder = _Builder(engine.tokenizer)
    turn = "I like green tea in the morning and black tea at night."
    query = [ChatMessage("user", "Long?")]
    room = 128 - len(builder.layout.prefix_ids) - len(builder.layout.conversation_ids(query)) - 1
    texts = [turn, _long_text(engine, room)]

    def config(w: int) -> MemoryConfig:
        kv = KVConfig(encode_on_add="lazy", context_window=w)
        return MemoryConfig(data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=kv)

    with MemoryClient(config(0), engine=engine, embedder=HashEmbedder()) as before:
        ids = [
            r["id"]
            for r in before.add([{"role": "user", "content": t} for t in texts], user_id="maya", infer=False)["results"]
        ]
    with MemoryClient(config(5), engine=engine, embedder=HashEmbedder()) as client:
        (record,) = [client.db.get(ids[1])]
        assert record is not None and record.context and client.fact_kv.fit(record) == "alone"
        service = MemoryService(client, builder, 0, [], 1, engine.tokenizer)
        facts, memories = service.prepare("maya", query, 1)
    assert [m["memory"] for m in memories] == [texts[1]]
    (long_fact,) = facts
    assert long_fact.n_tokens == len(engine.fact_token_ids(texts[1]))


@pytest.mark.parametrize("answer_tokens", [1, 16])
def test_the_vllm_servers_memory_leaves_out_a_memory_that_fits_vllms_context_only_without_the_query(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, answer_tokens: int
) -> None:
    """vLLM's ``max_model_len`` (the service's ``context_tokens``) is shorter than the fact encoder's context: a
    memory that fits the encoder but not vLLM's context with the query and the request's ``max_tokens`` was encoded,
    then vLLM refused the request, and so every chat of the user that retrieved it. It is left out with a warning,
    before any K/V is encoded; a memory one token shorter is served."""
    from inferscale.server.vllm_memory import MemoryService

    engine = _tiny_engine()
    builder = _Builder(engine.tokenizer)
    room = MAX_MODEL_LEN - len(builder.layout.prefix_ids) - len(builder.layout.conversation_ids(QUERY)) - answer_tokens
    config = MemoryConfig(
        data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(encode_on_add="lazy", context_window=0)
    )
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        fits, too_long = _long_text(engine, room), _long_text(engine, room + 1)
        client.add(fits, user_id="maya", infer=False)
        client.add(too_long, user_id="bob", infer=False)
        service = MemoryService(client, builder, 0, [], 5, engine.tokenizer, context_tokens=MAX_MODEL_LEN)
        encoded: list[int] = []
        real = client.fact_kv.encode
        client.fact_kv.encode = lambda requests: encoded.append(len(requests)) or real(requests)  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="inferscale"):
            facts, memories = service.prepare("bob", QUERY, answer_tokens)
        assert (facts, memories, encoded) == ([], [], [])
        assert f"would not fit the context of {MAX_MODEL_LEN} tokens" in caplog.text
        facts, memories = service.prepare("maya", QUERY, answer_tokens)
        assert [m["memory"] for m in memories] == [fits] and encoded == [1]
        with pytest.raises(ContextLengthError, match=f"the model's maximum context length is {MAX_MODEL_LEN} tokens"):
            service.prepare("maya", QUERY, MAX_MODEL_LEN)  # an answer budget no prompt leaves room for


def test_the_background_encoder_loads_the_encoder_alone_and_never_starts_vllm(
    model_folder: Path, tmp_path: Path
) -> None:
    """It loaded the whole engine: a process that only added memories started vLLM's engine core and worker (about
    4.5 GB and 78 s with SmolLM2 on 2 cores) to encode what the transformers copy encodes alone."""
    engine = _engine(model_folder)
    config = MemoryConfig(data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT)  # encode_on_add="background"
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add("I like tea.", user_id="maya", infer=False)["results"]]
        assert client.wait_for_encoding(timeout=120)
        assert {row.memory_id for row in client.db.all_kv_entries()} == {memory_id}
        assert client.derived.missing_kv([memory_id]) == []  # prepare_kv's check: the encoder alone too
        assert engine._encoder_ready and not engine._ready  # weights loaded for encoding, vLLM never started


def test_the_memory_config_sets_vllms_context_limit_and_cache_size(model_folder: Path, tmp_path: Path) -> None:
    """``engine.max_model_len`` and ``engine.kv_cache_bytes`` reach the vLLM engine a client builds (it served 4096
    tokens and 2 GiB whatever the config said); the limit bounds ``add`` as the engine's own does."""
    engine = EngineConfig(
        provider="vllm",
        model=str(model_folder),
        dtype="float32",
        device="cpu",
        max_model_len=64,
        kv_cache_bytes=1 << 28,
    )
    config = MemoryConfig(data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, engine=engine)
    with MemoryClient(config, embedder=HashEmbedder()) as client:
        assert client.context_window == 64
        args = client.engine.engine_args()  # loads the encoder alone
        assert (args["max_model_len"], args["kv_cache_memory_bytes"]) == (64, 1 << 28)
        with pytest.raises(InvalidInputError, match="the model's context is 64 tokens"):
            client.add("x" * 60, user_id="maya", infer=False)


def test_the_vllm_servers_memory_holds_requests_to_the_models_window_when_max_model_len_is_larger(
    tmp_path: Path,
) -> None:
    """``--max-model-len`` above the fact encoder's window (a longrope model's static part, or a model's own limit)
    took vLLM's figure: a prompt past the model's window was served, with keys rotated for positions it never
    computes so (a review). Requests are held to the smaller of the two."""
    from inferscale.server.vllm_memory import MemoryService

    engine = _tiny_engine()  # 128 positions
    builder = _Builder(engine.tokenizer)
    room = 128 - len(builder.layout.prefix_ids) - len(builder.layout.conversation_ids(QUERY)) - 1
    config = MemoryConfig(
        data_dir=str(tmp_path), system_prompt=SYSTEM_PROMPT, kv=KVConfig(encode_on_add="lazy", context_window=0)
    )
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        client.add(_long_text(engine, room + 1), user_id="bob", infer=False)
        service = MemoryService(client, builder, 0, [], 5, engine.tokenizer, context_tokens=4096)
        assert service.prepare("bob", QUERY, 1) == ([], [])
        with pytest.raises(ContextLengthError, match="the model's maximum context length is 128 tokens") as refused:
            service.prepare("bob", QUERY, 128)
        # no advice to retrieve fewer memories: none is left (the server's --limit); the middleware names the
        # request's own budget field (test_vllm_server.py)
        assert str(refused.value).endswith("; send a shorter conversation or lower max_new_tokens")


def test_the_memory_middleware_answers_every_inferscale_error_as_the_transformers_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A K/V entry that does not match its memory, or a database down, escaped the middleware as Starlette's plain
    500, with no code and no ``x-should-retry: false``: the OpenAI SDK sent the chat three times (a review's find).
    It is answered as the transformers server answers it, the server's file path logged and not shown."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from inferscale.errors import KVFingerprintMismatchError
    from inferscale.server import vllm_auth, vllm_memory
    from inferscale.server.keys import KeyStore

    where = "/srv/inferscale/kv/5b0e/3f2a.safetensors"

    class FailingService:
        def prepare(self, user: str, conversation: object, answer_tokens: int) -> None:
            raise KVFingerprintMismatchError(f"KV entry {where} was written for text_hash='ab12'")

    async def vllms_route(request: Request) -> JSONResponse:
        raise AssertionError("a chat with memory never reaches vLLM's route when its memory fails")

    monkeypatch.setattr(vllm_memory, "_SERVICE", FailingService())
    monkeypatch.setattr(vllm_auth, "_GATE", None)
    keys = KeyStore(f"sqlite:///{tmp_path}/memory.db")
    vllm_auth.install_gate(keys)  # no key stored: an open server on loopback
    middleware = [
        Middleware(vllm_auth.ApiKeyMiddleware),
        Middleware(BaseHTTPMiddleware, dispatch=vllm_memory.memory_middleware),
    ]
    app = Starlette(routes=[Route("/v1/chat/completions", vllms_route, methods=["POST"])], middleware=middleware)
    with TestClient(app, base_url="http://127.0.0.1:8000") as http:
        body = {"model": "m", "messages": [{"role": "user", "content": "What car?"}], "user": "alice"}
        reply = http.post("/v1/chat/completions", json=body)
    keys.close()
    assert reply.status_code == 409, reply.text
    assert reply.json()["error"]["code"] == "kv_fingerprint_mismatch"
    assert reply.headers["x-should-retry"] == "false"
    assert where not in reply.text and "ab12" not in reply.text


def test_an_encode_whose_encoder_closes_between_its_load_and_its_lock_raises_engine_closed(
    model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the transformers engine (tests/engines/test_engine_close_race.py): a close() by another thread after a
    call loaded the encoder gave a bare AttributeError (``_encoder``, ``_builder``); it is ``EngineClosedError``."""
    engine = _engine(model_folder)
    load_encoder = engine.load_encoder

    def loaded_then_closed_elsewhere() -> VLLMEngine:
        loaded = load_encoder()
        engine.close()
        return loaded

    monkeypatch.setattr(engine, "load_encoder", loaded_then_closed_elsewhere)
    calls = {
        "encode_facts": lambda: engine.encode_facts([EncodeRequest(engine.fact_token_ids("I like tea."))]),
        "builder": lambda: engine.builder,
        "model": lambda: engine.model,
        "tokenizer": lambda: engine.tokenizer,
    }
    for name, call in calls.items():
        with pytest.raises(EngineClosedError, match="the engine was closed while this call"):
            call()
        assert not engine._encoder_ready, name
    monkeypatch.setattr(engine, "load_encoder", load_encoder)
    (fact,) = engine.encode_facts([EncodeRequest(engine.fact_token_ids("I like tea."))])  # loaded again
    assert fact.n_tokens == len(engine.fact_token_ids("I like tea."))
    engine.close()


def test_a_chat_or_run_whose_vllm_engine_closes_before_it_is_used_raises_engine_closed(
    model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second review's find: past the encoder, a stream opening (``_stream`` read ``self._llm``), ``run`` and the
    ``llm`` property still read what ``close()`` deletes, and gave a bare AttributeError. vLLM's load stands still
    here (``load`` does nothing), so the engine is as another thread's ``close()`` left it: never started again."""
    engine = _engine(model_folder)
    request = engine.prepare_prompt("Where does Maya live?", [engine.fact_token_ids("Maya lives in Porto.")])
    monkeypatch.setattr(engine, "load", lambda: engine)  # the load ran; the close came after it
    stream = engine.stream_prompt("Where does Maya live?", [engine.fact_token_ids("Maya lives in Porto.")], 4)
    with pytest.raises(EngineClosedError, match="closed before this stream was read"):
        next(stream)
    with pytest.raises(EngineClosedError, match="closed while this call waited"):
        engine.run([request], 4)
    with pytest.raises(EngineClosedError, match="closed while this call used it"):
        _ = engine.llm
    engine.close()
