"""API keys on the vLLM server, without vLLM: the shared decision (:func:`caller_for`, :meth:`Caller.chat_user`), the
fields only the server sets, and :class:`ApiKeyMiddleware` on a small Starlette app standing in for vLLM's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from inferscale.errors import AuthenticationError, InvalidInputError, PermissionDeniedError
from inferscale.server import vllm_auth
from inferscale.server.auth import Caller, caller_for
from inferscale.server.errors import error_response
from inferscale.server.key_checks import KeyCheckLimits
from inferscale.server.keys import KeyStore
from inferscale.server.vllm_auth import (
    CALLER,
    INTERNAL,
    INTERNAL_HEADER,
    ApiKeyMiddleware,
    KeyGate,
    check_client_fields,
    checked_client_body,
    install_gate,
    needs_admin,
    needs_key,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[KeyStore]:
    keys = KeyStore(f"sqlite:///{tmp_path}/memory.db")
    yield keys
    keys.close()


def _caller(store: KeyStore, **scopes: Any) -> Caller:
    key, _ = store.create("k", **scopes)
    return Caller(key)


# ---- who a chat that names only `user` is answered for -------------------------------------------------------


def test_an_open_server_answers_for_the_named_user_or_none() -> None:
    assert Caller(None).chat_user("bob") == "bob"
    assert Caller(None).chat_user(None) is None


def test_a_key_for_one_user_supplies_it_and_refuses_any_other(store: KeyStore) -> None:
    alice = _caller(store, user_ids=["alice"])
    assert alice.chat_user(None) == "alice"
    assert alice.chat_user("alice") == "alice"
    with pytest.raises(PermissionDeniedError, match=r"may not touch user_id='bob'; it is bound to user_id \['alice'\]"):
        alice.chat_user("bob")


def test_a_key_for_several_users_names_one_or_gets_no_memory(store: KeyStore) -> None:
    both = _caller(store, user_ids=["alice", "bob"])
    assert [both.chat_user(u) for u in (None, "alice", "bob")] == [None, "alice", "bob"]
    with pytest.raises(PermissionDeniedError, match="user_id='carol'"):
        both.chat_user("carol")


@pytest.mark.parametrize(
    ("scopes", "bound"),
    [
        ({"agent_ids": ["planner"]}, "agent_ids"),
        ({"run_ids": ["r1"]}, "run_ids"),
        ({"user_ids": ["alice"], "agent_ids": ["planner"]}, "agent_ids"),
        ({"user_ids": ["alice"], "agent_ids": ["a"], "run_ids": ["r"]}, "agent_ids and run_ids"),
    ],
)
def test_a_key_bound_to_agents_or_runs_cannot_have_memories_by_user_alone(
    store: KeyStore, scopes: dict[str, list[str]], bound: str
) -> None:
    caller = _caller(store, **scopes)
    with pytest.raises(PermissionDeniedError, match=rf"bound to {bound}, but a chat on this server selects memories"):
        caller.chat_user("alice")
    if "user_ids" in scopes:  # its one user would be supplied: refused the same way
        with pytest.raises(PermissionDeniedError, match=f"bound to {bound}"):
            caller.chat_user(None)
    else:  # a chat without a user goes to the model without memory
        assert caller.chat_user(None) is None


def test_an_admin_key_without_lists_may_name_any_user(store: KeyStore) -> None:
    admin = _caller(store, admin=True)
    assert [admin.chat_user(u) for u in (None, "alice", "bob")] == [None, "alice", "bob"]


# ---- who is calling ----------------------------------------------------------------------------------------------


def test_without_a_store_or_a_key_the_caller_is_open(store: KeyStore) -> None:
    assert caller_for(None, []) == Caller(None)
    assert caller_for(store, []) == Caller(None)
    assert caller_for(store, ["Bearer whatever", "Token other"]) == Caller(None)


def test_with_keys_the_header_must_name_a_valid_key(store: KeyStore) -> None:
    key, secret = store.create("alice", user_ids=["alice"])
    assert caller_for(store, [f"Token {secret}"]) == Caller(key)
    assert caller_for(store, [f"bearer  {secret} "]) == Caller(key)
    for headers in ([], [""], [secret], [f"Basic {secret}"], ["Bearer unused"], [f"Bearer {secret[:-1]}x"]):
        with pytest.raises(AuthenticationError):
            caller_for(store, headers)
    store.revoke(key.key_id)
    with pytest.raises(AuthenticationError, match="unknown or revoked"):
        caller_for(store, [f"Token {secret}"])


def test_with_keys_a_request_with_two_headers_is_refused_whichever_comes_first(store: KeyStore) -> None:
    """A tester's find: ``Token <bob>`` then ``Token <alice>`` was answered as bob (the first header was taken)."""
    bob, bob_secret = store.create("bob", user_ids=["bob"])
    _, alice_secret = store.create("alice", user_ids=["alice"])
    for headers in (
        [f"Token {bob_secret}", f"Token {alice_secret}"],
        [f"Token {alice_secret}", f"Token {bob_secret}"],
        [f"Token {bob_secret}", f"Token {bob_secret}"],
    ):
        with pytest.raises(AuthenticationError, match="this request has 2 Authorization headers: send one"):
            caller_for(store, headers)
    assert caller_for(store, [f"Token {bob_secret}"]) == Caller(bob)


# ---- paths, fields ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "needed"),
    [
        ("GET", "/health", False),
        ("GET", "/metrics", True),  # and an admin key (needs_admin)
        ("GET", "/metrics/", True),
        ("GET", "/metricsx", True),  # vLLM's Prometheus app answers every path that starts with /metrics
        ("GET", "/openapi.json", False),
        ("GET", "/docs", False),
        ("OPTIONS", "/v1/chat/completions", False),
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/completions", True),
        ("GET", "/v1/models", True),
        ("POST", "/tokenize", True),
        ("GET", "/version", True),
        ("GET", "/health/../v1/models", True),
        ("", "/v1/realtime", True),  # a websocket
    ],
)
def test_every_path_but_health_and_docs_needs_a_key(method: str, path: str, needed: bool) -> None:
    assert needs_key(method, path) is needed


@pytest.mark.parametrize(
    ("path", "admin"),
    [
        ("/metrics", True),
        ("/metricsx", True),  # vLLM's Prometheus app answers every path starting with /metrics (a review)
        ("/load", True),
        ("/server_info", True),
        ("/reset_prefix_cache", True),
        ("/sleep", True),
        ("/abort_requests", True),
        ("/collective_rpc", True),
        ("/start_profile", True),
        ("/v1/load_lora_adapter", True),
        ("/some_route_a_later_vllm_adds", True),
        ("/v1/chat/completions", False),
        ("/v1/completions", False),
        ("/v1/models", False),
        ("/v1/realtime", False),
        ("/v2/rerank", False),
        ("/tokenize", False),
        ("/version", False),
    ],
)
def test_only_serving_routes_are_open_to_a_key_bound_to_scopes(path: str, admin: bool) -> None:
    assert needs_admin(path) is admin


def test_a_client_may_not_set_kv_transfer_params_or_an_inferscale_salt() -> None:
    prefixes = ("is1.", "isp.")
    for body in ({}, {"kv_transfer_params": None}, {"cache_salt": "mine"}, {"cache_salt": "is1"}, {"cache_salt": 3}):
        check_client_fields(body, prefixes)
    with pytest.raises(PermissionDeniedError, match="kv_transfer_params is set by the InferScale memory middleware"):
        check_client_fields({"kv_transfer_params": {"inferscale": {}}}, prefixes)
    for salt in ("is1.0123456789abcdef.x", "isp.0123456789abcdef"):
        with pytest.raises(PermissionDeniedError, match="has the form of InferScale's memory salts"):
            check_client_fields({"cache_salt": salt}, prefixes)


# Content types under which FastAPI reads a body as JSON (application/json, any application/*+json; with none, it
# depends on FastAPI's version), and some under which it does not: the check must not depend on the header.
READ_AS_JSON = [
    "application/json",
    "Application/JSON; charset=utf-8",
    "application/x-www-form-urlencoded+json",
    "application/vnd.api+json",
]
NOT_READ_AS_JSON = ["application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"]
CONTENT_TYPES = [None, *READ_AS_JSON, *NOT_READ_AS_JSON]


class _Completion(BaseModel):
    prompt: str
    kv_transfer_params: dict[str, Any] | None = None
    cache_salt: str | None = None


def _guarded_app() -> TestClient:
    """A FastAPI app standing in for vLLM's completions route (a JSON body model with ``kv_transfer_params`` and
    ``cache_salt``), behind a middleware that refuses what :func:`checked_client_body` refuses, as the memory
    middleware does."""
    app = FastAPI()

    @app.post("/v1/completions")
    @app.put("/v1/completions")
    async def completions(body: _Completion) -> dict[str, Any]:
        return {"params": body.kv_transfer_params, "salt": body.cache_salt}

    async def guard(request: Request, call_next: RequestResponseEndpoint) -> Response:
        try:
            await checked_client_body(request, ("is1.", "isp."))
        except (PermissionDeniedError, InvalidInputError) as exc:
            return error_response(exc)
        return await call_next(request)

    app.add_middleware(BaseHTTPMiddleware, dispatch=guard)
    return TestClient(app)


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_reserved_fields_are_refused_whatever_the_content_type(content_type: str | None, method: str) -> None:
    import json

    headers = {} if content_type is None else {"content-type": content_type}
    with _guarded_app() as http:
        for field, value in (("kv_transfer_params", {"inferscale": {}}), ("cache_salt", "is1.0123456789abcdef.x")):
            body = json.dumps({"prompt": "hi", field: value}).encode()
            reply = http.request(method, "/v1/completions", content=body, headers=headers)
            assert reply.status_code == 403 and reply.json()["error"]["code"] == "permission_denied", reply.text
        allowed = http.request(
            method, "/v1/completions", content=b'{"prompt": "hi", "cache_salt": "mine"}', headers=headers
        )
        if content_type in READ_AS_JSON:  # the route got the body: the guard let a harmless one through
            assert allowed.json() == {"params": None, "salt": "mine"}
        elif content_type in NOT_READ_AS_JSON:  # the route does not read it as JSON: its own refusal
            assert allowed.status_code == 422, allowed.text


def test_bodies_that_are_no_json_object_pass_unchecked() -> None:
    with _guarded_app() as http:
        for body in (b"", b"[1, 2]", b"prompt=hi&kv_transfer_params=x", b"\xff\xfe{"):
            reply = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
            assert reply.status_code in (400, 422), (body, reply.text)  # the route's own answer: no 403, no crash


@pytest.mark.parametrize("deep", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_a_body_nested_past_the_parser_is_refused_not_passed_on(deep: bytes) -> None:
    """Past the JSON parser's recursion limit the check raised a bare RecursionError (a 500); read as not JSON, the
    body would reach the route with no field checked, whose own parser, at a shallower stack, might read it (a
    review's find). It is refused with 400."""
    with _guarded_app() as http:
        reply = http.post("/v1/completions", content=deep, headers={"content-type": "application/json"})
    assert (reply.status_code, reply.json()["error"]["code"]) == (400, "invalid_input")
    assert "nests deeper" in reply.json()["error"]["message"]


@pytest.mark.parametrize(
    "body", [b'{"kv_transfer_params": {"x": 1}, "kv_transfer_params": null}', b'{"a": {"user": "u1", "user": "u2"}}']
)
def test_a_body_naming_a_key_twice_is_refused_not_passed_on(body: bytes) -> None:
    """This check and the route each keep the last of a repeated key; a proxy before them may keep the first. The
    body is refused, as the memory server's are (tests/server/test_server_errors.py)."""
    with _guarded_app() as http:
        reply = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert (reply.status_code, reply.json()["error"]["code"]) == (400, "invalid_input")
    assert "is given twice in one object" in reply.json()["error"]["message"]


def test_the_internal_token_is_random_and_checked_exactly() -> None:
    gate, other = KeyGate(None), KeyGate(None)
    assert gate.internal_token != other.internal_token and len(gate.internal_token) == 43
    assert gate.is_internal(gate.internal_headers()[INTERNAL_HEADER])
    assert not gate.is_internal(other.internal_token) and not gate.is_internal(None) and not gate.is_internal("")
    assert gate.internal_token not in repr(gate)


# ---- the middleware on an app like vLLM's -----------------------------------------------------------------------


async def _echo(request: Request) -> JSONResponse:
    caller = request.scope.get(CALLER)
    key = None if caller is None or caller.key is None else caller.key.key_id
    return JSONResponse({"checked": caller is not None, "key": key, "internal": request.scope.get(INTERNAL, False)})


async def _socket(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_json({"key": websocket.scope[CALLER].key.key_id})
    await websocket.close()


@pytest.fixture
def http(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr(vllm_auth, "_GATE", None)
    routes: list[BaseRoute] = [Route(p, _echo, methods=["GET", "POST"]) for p in ("/health", "/metrics", "/v1/models")]
    routes += [Route("/v1/chat/completions", _echo, methods=["POST"]), WebSocketRoute("/v1/realtime", _socket)]
    app = Starlette(routes=routes, middleware=[Middleware(ApiKeyMiddleware)])
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:  # an open server answers loopback names only
        yield client


def _error(reply: Any) -> tuple[int, str, str]:
    error = reply.json()["error"]
    return reply.status_code, error["code"], error["type"]


def test_without_an_installed_gate_every_request_is_refused(http: TestClient) -> None:
    assert _error(http.get("/health")) == (500, "internal_error", "ServerError")
    assert "has no key store" in http.get("/v1/models").json()["error"]["message"]


def test_an_open_gate_lets_every_request_through_as_an_open_caller(http: TestClient, store: KeyStore) -> None:
    install_gate(store)
    assert http.get("/v1/models").json() == {"checked": True, "key": None, "internal": False}
    assert http.get("/health").json() == {"checked": False, "key": None, "internal": False}


def test_an_open_gate_refuses_other_sites_pages_and_rebound_names(http: TestClient, store: KeyStore) -> None:
    install_gate(store)
    evil = [{"Origin": "http://evil.example"}, {"Origin": "null"}, {"Host": "evil.example:8000"}]
    for headers in evil:
        for reply in (
            http.post("/v1/chat/completions", json={}, headers=headers),
            http.get("/health", headers=headers),
        ):
            assert _error(reply) == (403, "permission_denied", "PermissionDeniedError"), headers
    with pytest.raises(WebSocketDisconnect) as refused, http.websocket_connect("/v1/realtime", headers=evil[0]):
        pass
    assert refused.value.code == 1008
    local = {"Origin": "http://localhost:3000", "Host": "[::1]:8000"}
    assert http.get("/v1/models", headers=local).json() == {"checked": True, "key": None, "internal": False}
    _, secret = store.create("alice", user_ids=["alice"])  # with keys, the key decides, whatever the page
    keyed = {"Origin": "http://evil.example", "Host": "memory.example", "Authorization": f"Bearer {secret}"}
    assert http.get("/v1/models", headers=keyed).json()["checked"] is True


def test_with_keys_each_request_needs_one_and_gets_its_caller(http: TestClient, store: KeyStore) -> None:
    gate = install_gate(store)
    key, secret = store.create("alice", user_ids=["alice"])
    for headers in ({}, {"Authorization": "Bearer unused"}, {INTERNAL_HEADER: KeyGate(None).internal_token}):
        assert _error(http.get("/v1/models", headers=headers)) == (401, "unauthenticated", "AuthenticationError")
        assert _error(http.post("/v1/chat/completions", json={}, headers=headers))[:2] == (401, "unauthenticated")
    assert http.get("/health").json()["checked"] is False
    # vLLM's metrics count every tenant's requests and tokens: an admin key's only
    assert _error(http.get("/metrics")) == (401, "unauthenticated", "AuthenticationError")
    for path in ("/metrics", "/metrics/", "/metricsx", "/metrics.txt"):  # vLLM's app answers them all (a review)
        assert _error(http.get(path, headers={"Authorization": f"Bearer {secret}"}))[:2] == (403, "permission_denied")
    admin, admin_secret = store.create("admin", admin=True)
    assert http.get("/metrics", headers={"Authorization": f"Bearer {admin_secret}"}).json()["key"] == admin.key_id
    assert http.get("/v1/models", headers={"Authorization": f"Bearer {secret}"}).json() == {
        "checked": True,
        "key": key.key_id,
        "internal": False,
    }
    internal = http.post("/v1/chat/completions", json={}, headers=gate.internal_headers())
    assert internal.json() == {"checked": False, "key": None, "internal": True}
    with http.websocket_connect("/v1/realtime", headers={"Authorization": f"Token {secret}"}) as socket:
        assert socket.receive_json() == {"key": key.key_id}
    with pytest.raises(WebSocketDisconnect) as refused, http.websocket_connect("/v1/realtime"):
        pass
    assert refused.value.code == 1008
    for twice in ((secret, admin_secret), (admin_secret, secret)):
        headers = [("Authorization", f"Token {twice[0]}"), ("Authorization", f"Token {twice[1]}")]
        assert _error(http.get("/v1/models", headers=headers))[:2] == (401, "unauthenticated")
    store.revoke(key.key_id)
    assert _error(http.get("/v1/models", headers={"Authorization": f"Token {secret}"}))[:2] == (401, "unauthenticated")


def test_past_the_failed_key_check_budget_a_key_not_verified_before_is_429(http: TestClient, tmp_path: Path) -> None:
    """The middleware let only 401 and 403 through: the key store's ``RateLimitedError`` would have been a 500."""
    store = KeyStore(f"sqlite:///{tmp_path}/limited.db", KeyCheckLimits(failures_per_s=0.001, failure_burst=2))
    install_gate(store)
    key, secret = store.create("alice", user_ids=["alice"])
    verified = {"Authorization": f"Bearer {secret}"}
    assert http.get("/v1/models", headers=verified).json()["key"] == key.key_id
    made_up = [f"isk_{'ab' * 6}_{'x' * 42}{c}" for c in "abc"]
    replies = [http.get("/v1/models", headers={"Authorization": f"Bearer {k}"}) for k in made_up]
    assert [_error(reply) for reply in replies] == [(401, "unauthenticated", "AuthenticationError")] * 2 + [
        (429, "rate_limited", "RateLimitedError")
    ]
    assert 1 <= int(replies[2].headers["retry-after"]) <= 1000
    assert http.get("/v1/models", headers=verified).json()["key"] == key.key_id
    with (
        pytest.raises(WebSocketDisconnect) as refused,
        http.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {made_up[2]}"}),
    ):
        pass
    assert refused.value.code == 1008
    store.close()
