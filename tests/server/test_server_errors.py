"""Every error reply of the server: ``{"error": {"code", "type", "message"}}`` with the status of its code in
``ERROR_CODES``, from real requests where one can trigger the error, and for every code through a client method
made to raise it. Rejected requests store nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mem0_fakes import ScriptedGenerator
from server_harness import MakeServer, Served, app_routes

from inferscale.error_codes import ERROR_CODES, ErrorCode
from inferscale.errors import (
    ConfigError,
    DatabaseUnavailableError,
    ExtractionError,
    KVFingerprintMismatchError,
    ModelNotAvailableError,
)
from inferscale.kv.tiers.serialization import KVFormatError
from inferscale.server.errors import (
    DATABASE_UNAVAILABLE_MESSAGE,
    EXTRACTION_FAILED_MESSAGE,
    KV_MISMATCH_MESSAGE,
    SERVER_SETUP_MESSAGES,
    SHUT_DOWN_MESSAGE,
    UnexpectedErrors,
)
from inferscale.server.options import ServerOptions


def _error(reply: httpx.Response, status: int, code: str, type_name: str) -> str:
    """Assert ``reply`` is the structured error ``code`` with ``status``, telling clients not to send the request again
    exactly when the same request gets the same error (``x-should-retry: false``: the OpenAI SDK retried a 409 that
    could only repeat, a helper's find); returns its message."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "type", "message"}
    assert (body["error"]["code"], body["error"]["type"]) == (code, type_name)
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    repeats = next(row.repeats for row in ERROR_CODES if row.code == code)
    assert reply.headers.get("x-should-retry") == ("false" if repeats else None)
    return str(body["error"]["message"])


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with served.http() as client:
        yield client


def test_a_call_without_a_scope_is_400_scope_required(http: httpx.Client) -> None:
    message = _error(http.post("/v1/memories/search/", json={"query": "tea"}), 400, "scope_required", "ScopeError")
    assert "user_id, agent_id or run_id" in message
    _error(http.delete("/v1/memories/"), 400, "scope_required", "ScopeError")


def test_an_unknown_memory_is_404_memory_not_found_on_every_id_route(http: httpx.Client) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    for reply in (
        http.get(f"/v1/memories/{missing}/"),
        http.put(f"/v1/memories/{missing}/", json={"text": "new"}),
        http.delete(f"/v1/memories/{missing}/"),
    ):
        assert missing in _error(reply, 404, "memory_not_found", "MemoryNotFoundError")


def test_a_value_the_client_refuses_is_400_invalid_input_with_its_message(http: httpx.Client) -> None:
    reply = http.post("/v1/memories/search/", json={"query": "tea", "user_id": "alice", "limit": -1})
    assert "limit must be a non-negative int" in _error(reply, 400, "invalid_input", "InvalidInputError")
    reply = http.post("/v1/memories/", json={"messages": "x", "user_id": "alice", "metadata": {"user_id": "bob"}})
    assert "metadata may not set scope ids" in _error(reply, 400, "invalid_input", "InvalidInputError")


def test_wait_for_encoding_answers_done_and_refuses_the_local_clients_bad_timeouts(http: httpx.Client) -> None:
    for body in ({}, {"timeout": 0}, {"timeout": 0.5}):
        assert http.post("/v1/encoding/wait/", json=body).json() == {"done": True}  # nothing queued
    for body, match in (
        ({"timeout": -1}, "timeout must be None or a finite number of seconds"),
        ({"timeout": 1e10}, "timeout must be None or a finite number of seconds"),
        ({"timeout": "5"}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"seconds": 1}, "seconds"),
    ):
        assert match in _error(http.post("/v1/encoding/wait/", json=body), 400, "invalid_input", "InvalidInputError")


def test_text_no_backend_can_hold_is_400_invalid_input_and_the_scope_stays_readable(http: httpx.Client) -> None:
    """tester1 #2: a lone surrogate (and a NUL) in metadata was stored, and every read of the scope then answered
    500; a PUT of one answered 500 but wrote. Both are now refused before anything is written."""
    headers = {"Content-Type": "application/json"}
    poisoned = b'{"messages": "x", "user_id": "u1", "metadata": {"k\\u0000": "\\ud800"}, "infer": false}'
    message = _error(
        http.post("/v1/memories/", content=poisoned, headers=headers), 400, "invalid_input", "InvalidInputError"
    )
    assert "metadata" in message
    kept = http.post("/v1/memories/", json={"messages": "Lives in Lisbon", "user_id": "u1", "infer": False})
    memory_id = kept.json()["results"][0]["id"]
    update = b'{"metadata": {"note": "\\ud83d"}}'
    reply = http.put(f"/v1/memories/{memory_id}/", content=update, headers=headers)
    assert "lone surrogate" in _error(reply, 400, "invalid_input", "InvalidInputError")
    listed = http.get("/v1/memories/", params={"user_id": "u1"})
    assert listed.status_code == 200, listed.text
    listed_memories = [(r["memory"], r["metadata"], r["role"]) for r in listed.json()["results"]]
    assert listed_memories == [("Lives in Lisbon", {}, "user")]
    assert [h["event"] for h in http.get(f"/v1/memories/{memory_id}/history/").json()] == ["ADD"]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"query": "tea", "user_id": "alice", "limt": 3}, "body.limt: Extra inputs are not permitted"),
        ({"query": "tea", "user_id": "alice", "limit": "3"}, "body.limit: Input should be a valid integer"),
        ({"user_id": "alice"}, "body.query: Field required"),
        ({"query": "tea", "user_id": 7}, "body.user_id: Input should be a valid string"),
    ],
)
def test_fastapis_422_is_400_invalid_input(http: httpx.Client, body: dict[str, Any], where: str) -> None:
    reply = http.post("/v1/memories/search/", json=body)
    assert where in _error(reply, 400, "invalid_input", "InvalidInputError")


def test_a_request_with_many_bad_fields_names_five_with_their_input_and_counts_the_rest(http: httpx.Client) -> None:
    body = {"query": "tea", "user_id": "alice", **{f"extra{i}": i for i in range(7)}}
    message = _error(http.post("/v1/memories/search/", json=body), 400, "invalid_input", "InvalidInputError")
    named = "; ".join(f"body.extra{i}: Extra inputs are not permitted (got {i})" for i in range(5))
    assert message == f"invalid request: {named} (and 2 more)"


def test_malformed_json_and_a_bad_query_parameter_are_400_invalid_input(http: httpx.Client) -> None:
    reply = http.post("/v1/memories/", content=b'{"messages": ', headers={"content-type": "application/json"})
    assert _error(reply, 400, "invalid_input", "InvalidInputError").endswith(
        "the body is not valid JSON: Expecting value at character 13"
    )
    control = http.post("/v1/memories/", content=b'{"messages": "a\x1b"}', headers={"content-type": "application/json"})
    assert _error(control, 400, "invalid_input", "InvalidInputError").endswith(  # said "at at character 15"
        "the body is not valid JSON: Invalid control character at character 15"
    )
    reply = http.get("/v1/memories/", params={"user_id": "alice", "limit": "ten"})
    assert "query.limit" in _error(reply, 400, "invalid_input", "InvalidInputError")


@pytest.mark.parametrize(
    ("content_type", "said"),
    [
        ("application/x-www-form-urlencoded", "is 'application/x-www-form-urlencoded'"),
        ("text/plain", "is 'text/plain'"),
        ("text/x+json", "is 'text/x+json'"),  # FastAPI reads only application/*+json as JSON
        (None, "is missing"),
    ],
)
def test_a_json_body_sent_without_its_content_type_is_told_to_send_it(
    http: httpx.Client, content_type: str | None, said: str
) -> None:
    """``curl -d '{...}'`` sends form data: the reply read "Input should be a valid dictionary" for a well-formed JSON
    object (a tester's find). It names the header now, and nothing is stored; with the header the same body passes."""
    body = b'{"messages": "I like tea.", "user_id": "alice", "infer": false}'
    headers = {"content-type": content_type} if content_type else {}
    reply = http.post("/v1/memories/", content=body, headers=headers)  # httpx sets no content type for bytes
    message = _error(reply, 400, "invalid_input", "InvalidInputError")
    assert message == (
        "invalid request: the body must be a JSON object sent with the header 'Content-Type: application/json' "
        f"(this request's Content-Type {said})"
    )
    assert http.get("/v1/memories/", params={"user_id": "alice"}).json()["results"] == []
    stored = http.post("/v1/memories/", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert [r["memory"] for r in stored.json()["results"]] == ["I like tea."]
    reply = http.post("/v1/chat/completions", content=b'{"model": "m"}', headers=headers)
    assert "Content-Type: application/json" in _error(reply, 400, "invalid_input", "InvalidInputError")


def test_an_unknown_path_or_method_keeps_its_status_with_a_code_of_its_own(http: httpx.Client) -> None:
    assert "Not Found" in _error(http.get("/v1/nothing/"), 404, "route_not_found", "RouteNotFoundError")
    assert "Method Not Allowed" in _error(
        http.patch("/v1/memories/"), 405, "method_not_allowed", "MethodNotAllowedError"
    )


def test_search_is_no_memory_id_a_get_of_it_is_405(http: httpx.Client) -> None:
    """``GET /v1/memories/search/`` once answered 404 "no memory with id 'search'"."""
    for method in ("GET", "PUT", "DELETE"):
        for path in ("/v1/memories/search/", "/v1/memories/search", "/v1/memories/search/history/"):
            reply = http.request(method, path, params={"user_id": "u"})
            if path.endswith("history/") and method != "GET":
                continue  # no route answers PUT/DELETE there: 405 by the router
            message = _error(reply, 405, "method_not_allowed", "MethodNotAllowedError")
            assert "search" in message and "memory" not in message.replace("/v1/memories/", ""), (method, path)


def test_head_health_answers_for_load_balancers(http: httpx.Client) -> None:
    assert [(r.status_code, r.content) for r in (http.head("/health"), http.head("/health/"))] == [(200, b"")] * 2


def test_the_schema_lists_the_error_replies_and_never_422(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    operations = [(path, op) for path, ops in schema["paths"].items() for op in ops.values()]
    assert not any("422" in op["responses"] for _, op in operations)
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    reply = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}
    for path, op in operations:
        if path == "/health":
            continue
        statuses = ("400", "401", "403", "404", "413", "429", "500")
        assert {s: op["responses"][s]["content"] for s in statuses} == dict.fromkeys(statuses, reply), path


def test_each_route_answers_with_and_without_its_trailing_slash(http: httpx.Client) -> None:
    added = http.post("/v1/memories", json={"messages": "I like tea.", "user_id": "alice", "infer": False}).json()
    memory_id = added["results"][0]["id"]
    for path in (f"/v1/memories/{memory_id}", f"/v1/memories/{memory_id}/"):
        assert http.get(path).json()["memory"] == "I like tea."
    for path in ("/v1/ping", "/v1/ping/", "/health", "/health/", "/v1/models", "/v1/models/"):
        assert http.get(path).status_code == 200, path


def test_a_body_over_the_limit_is_413_before_parsing_and_stores_nothing(make_server: MakeServer) -> None:
    served = make_server(ServerOptions(max_request_bytes=1000))
    body = {"messages": "x" * 990, "user_id": "alice", "infer": False}
    with served.http() as http:
        message = _error(http.post("/v1/memories/", json=body), 413, "request_too_large", "RequestTooLargeError")
        assert "at most 1,000" in message

        def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed body is counted
            yield b'{"messages": "'
            yield b"y" * 2000
            yield b'", "user_id": "alice", "infer": false}'

        _error(http.post("/v1/memories/", content=chunks()), 413, "request_too_large", "RequestTooLargeError")
        assert served.row_counts() == (0, 0)
        small = {"messages": "x" * 900, "user_id": "alice", "infer": False}
        assert http.post("/v1/memories/", json=small).status_code == 200  # 949 bytes: within the limit
    assert served.row_counts() == (1, 1)


def test_an_extraction_failure_is_502_extraction_failed_and_stores_nothing(
    make_server: MakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An LLM backend that gives no answer (a malformed answer is repaired or falls back instead: issue 15 item 6).
    Its URL and reply stay in the server's log (an operator tester's find: a 401 body echoing the backend's key and
    host names reached every caller, and nothing was logged)."""
    said = 'http://llm-gw-7.corp:8000/v1/chat/completions answered HTTP 401: {"error": "bad key sk-SECRET"}'

    def down(messages: list[dict[str, str]]) -> str:
        raise ExtractionError(said)

    served = make_server(generator=ScriptedGenerator(facts=down))
    with served.http() as http, caplog.at_level(logging.WARNING, logger="inferscale.server.errors"):
        reply = http.post("/v1/memories/", json={"messages": "I like tea.", "user_id": "alice"})
        message = _error(reply, 502, "extraction_failed", "ExtractionError")
    request = reply.headers["X-Request-ID"]
    assert message == f"{EXTRACTION_FAILED_MESSAGE} (request {request})"
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if request in r.getMessage()]
    assert logged == [  # the reply, which may quote the conversation, only at WARNING (--log-level error)
        (logging.ERROR, f"request {request}: ExtractionError (its reply is at WARNING level)"),
        (logging.WARNING, f"request {request}: {said}"),
    ]
    assert served.row_counts() == (0, 0)


def test_a_malformed_llm_answer_is_stored_verbatim_not_an_error(make_server: MakeServer) -> None:
    served = make_server(generator=ScriptedGenerator(facts="this is not JSON"))
    with served.http() as http:
        reply = http.post("/v1/memories/", json={"messages": "I like tea.", "user_id": "alice"})
        assert reply.status_code == 200
        assert [(r["memory"], r["event"]) for r in reply.json()["results"]] == [("I like tea.", "ADD")]
    assert served.row_counts() == (1, 1)


@pytest.mark.parametrize("row", ERROR_CODES, ids=lambda row: row.code)
def test_every_error_code_has_its_status_and_body(
    served: Served, monkeypatch: pytest.MonkeyPatch, row: ErrorCode
) -> None:
    async def fail(**kwargs: Any) -> None:
        raise row.error(f"made to fail with {row.error.__name__}")

    monkeypatch.setattr(served.client, "get_all", fail)
    with served.http() as http:
        reply = http.get("/v1/memories/", params={"user_id": "alice"})
    _error(reply, row.status, row.code, row.error.__name__)
    told = f"made to fail with {row.error.__name__}"
    logged_only = {
        DatabaseUnavailableError: DATABASE_UNAVAILABLE_MESSAGE,
        ExtractionError: EXTRACTION_FAILED_MESSAGE,
        KVFingerprintMismatchError: KV_MISMATCH_MESSAGE,
        **SERVER_SETUP_MESSAGES,
    }
    if row.error in logged_only:  # its own text, which names the database, the LLM or a file of the server, is logged
        told = f"{logged_only[row.error]} (request {reply.headers['x-request-id']})"
    assert reply.json()["error"]["message"] == told


def test_a_kv_file_error_names_no_path_of_the_server(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A K/V entry written for another memory answered 409 with the file's absolute path and the text hashes, and an
    unreadable one (an InferScale error with no code of its own) 500 with its path: both are logged, and the caller
    reads a fixed message with the request id."""
    where = "/srv/inferscale/data/kv/5b0e/3f2a.safetensors"
    for error, status, code in (
        (KVFingerprintMismatchError(f"KV entry {where} for text_hash='ab12'"), 409, "kv_fingerprint_mismatch"),
        (KVFormatError(f"{where} lacks metadata fields ['fingerprint']"), 500, "internal_error"),
        (ConfigError(f"cannot read the FAISS index {where}: truncated; delete it"), 500, "config_error"),
        (ModelNotAvailableError(f"the model folder {where} does not exist"), 503, "model_not_available"),
    ):

        async def fail(*args: Any, error: Exception = error, **kwargs: Any) -> None:
            raise error

        monkeypatch.setattr(served.client, "get_all", fail)
        with caplog.at_level("ERROR", logger="inferscale.server.errors"), served.http() as http:
            reply = http.get("/v1/memories/", params={"user_id": "alice"})
        type_name = type(error).__name__ if code != "internal_error" else "ServerError"
        message = _error(reply, status, code, type_name)
        assert where not in message and "ab12" not in message and reply.headers["x-request-id"] in message
        assert where in caplog.text


def test_a_database_the_server_cannot_connect_to_is_503_without_its_address(
    make_server: MakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's URL and the driver's message are logged; the caller reads neither."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'inferscale-memory[postgres]')")
    served = make_server(db_url="postgresql+psycopg://inferscale:s3cret@127.0.0.1:1/memories")
    with caplog.at_level("ERROR", logger="inferscale.server.errors"), served.http() as http:
        reply = http.get("/v1/memories/", params={"user_id": "alice"})
    message = _error(reply, 503, "database_unavailable", "DatabaseUnavailableError")
    request_id = reply.headers["x-request-id"]
    assert message == f"{DATABASE_UNAVAILABLE_MESSAGE} (request {request_id})"
    assert "127.0.0.1" not in reply.text and "psycopg" not in reply.text
    logged = [r.getMessage() for r in caplog.records if r.name == "inferscale.server.errors"]
    assert any(f"request {request_id}: " in m and "127.0.0.1:1/memories" in m and "s3cret" not in m for m in logged)


def test_an_unexpected_exception_is_500_internal_error_and_logged(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def fail(**kwargs: Any) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(served.client, "get_all", fail)
    with caplog.at_level("ERROR", logger="inferscale.server.errors"), served.http() as http:
        reply = http.get("/v1/memories/", params={"user_id": "alice"})
    message = _error(reply, 500, "internal_error", "ServerError")
    assert "RuntimeError" in message and "secret internals" not in message  # the text stays in the log
    logged = [r for r in caplog.records if r.name == "inferscale.server.errors"]
    assert len(logged) == 1 and logged[0].exc_info is not None and "secret internals" in str(logged[0].exc_info[1])
    # the reply and the log line name the same request, so an operator finds the traceback a user reports
    request_id = reply.headers["x-request-id"]
    assert message.endswith(f"the server log has the details (request {request_id})")
    assert logged[0].getMessage() == f"request {request_id}: GET /v1/memories/ failed"


def test_every_reply_carries_a_request_id_and_a_callers_uuid4_one_is_kept(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user reporting a 500 had nothing to give an operator but the time: the log held every request's errors."""
    caller_id = str(uuid.uuid4())
    with served.http() as http:
        ok = [http.get("/health"), http.get("/v1/memories/", params={"user_id": "alice"})]
        ids = [reply.headers["x-request-id"] for reply in ok]
        assert all(reply.status_code == 200 for reply in ok) and len(set(ids)) == 2
        assert all(uuid.UUID(value).version == 4 for value in ids)
        kept = http.get("/health", headers={"X-Request-ID": caller_id})
        assert kept.headers["x-request-id"] == caller_id
        odd = http.get("/health", headers={"X-Request-ID": "not a uuid; <script>"})  # not echoed: a new one
        assert odd.headers["x-request-id"] != "not a uuid; <script>" and uuid.UUID(odd.headers["x-request-id"])

        async def fail(**kwargs: Any) -> None:
            raise RuntimeError("secret internals")

        monkeypatch.setattr(served.client, "get_all", fail)
        failed = http.get("/v1/memories/", params={"user_id": "alice"}, headers={"X-Request-ID": caller_id})
    assert failed.headers["x-request-id"] == caller_id
    assert _error(failed, 500, "internal_error", "ServerError").endswith(f"(request {caller_id})")


def test_a_request_the_shutdown_cancels_before_its_reply_is_503_engine_closed() -> None:
    """Requests still running when the shutdown grace ended were answered by uvicorn with a plain-text 500, which a
    client could not tell from a bug (tester report); the cancellation itself goes on."""
    sent: list[dict[str, Any]] = []

    async def cancelled_handler(scope: Any, receive: Any, send: Any) -> None:
        raise asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded")

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/memories/", "headers": []}
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(UnexpectedErrors(cancelled_handler)(scope, receive, send))  # type: ignore[arg-type]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 503
    body = json.loads(sent[1]["body"])
    assert body == {"error": {"code": "engine_closed", "type": "EngineClosedError", "message": SHUT_DOWN_MESSAGE}}


DOC_PATHS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def test_an_unknown_query_parameter_is_400_invalid_input_on_every_route(served: Served) -> None:
    """Every API route of the app: ``?agentid=`` (a misspelt ``agent_id``) is refused, naming it,
    before anything runs; the routes' own parameters still pass."""
    from inferscale.server.app import create_app

    app = create_app(served.client, keys=None, options=ServerOptions())
    with served.http() as http:
        added = http.post("/v1/memories/", json={"messages": "I like tea.", "user_id": "dev", "infer": False})
        memory_id = added.json()["results"][0]["id"]
        checked = 0
        for template, methods in app_routes(app):
            if template in DOC_PATHS:  # FastAPI's own pages, outside the API (the OAuth2 redirect reads a query)
                continue
            path = template.replace("{memory_id}", memory_id)
            for method in methods - {"HEAD"}:
                reply = http.request(method, path, params={"user_id": "dev", "agentid": "a1"})
                message = _error(reply, 400, "invalid_input", "InvalidInputError")
                assert "'agentid'" in message and template in message, (method, path)
                checked += 1
        assert checked >= 30
        assert served.row_counts() == (1, 1)  # DELETE /v1/memories/?user_id=dev&agentid=a1 deleted nothing
        assert "it accepts: agent_id, limit, run_id, top_k, user_id" in _error(
            http.get("/v1/memories/", params={"user_id": "dev", "page": 2}), 400, "invalid_input", "InvalidInputError"
        )
        assert len(http.get("/v1/memories/", params={"user_id": "dev", "limit": 5}).json()["results"]) == 1
        twice = http.request("DELETE", "/v1/memories/", params=[("user_id", "dev"), ("user_id", "someone")])
        assert "'user_id' given more than once" in _error(twice, 400, "invalid_input", "InvalidInputError")
        assert served.row_counts() == (1, 1)  # the last value was taken: a delete of someone's memories


def test_delete_all_needs_a_scope_named_in_the_request_even_with_a_key_bound_to_one_user(served: Served) -> None:
    _, alice = served.keys.create("alice", user_ids=["alice"])
    with served.http(alice) as http:
        http.post("/v1/memories/", json={"messages": "I like tea.", "infer": False}).raise_for_status()
        assert "user_id, agent_id or run_id" in _error(
            http.delete("/v1/memories/"), 400, "scope_required", "ScopeError"
        )
        assert served.row_counts() == (1, 1)
        assert http.delete("/v1/memories/", params={"user_id": "alice"}).json()["deleted"] == 1
        assert _error(
            http.delete("/v1/memories/", params={"user_id": "bob"}), 403, "permission_denied", "PermissionDeniedError"
        )


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_bad_answer_budget_names_the_openai_field_it_came_in(http: httpx.Client, field: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "alice", field: -3}
    reply = http.post("/v1/chat/completions", json=body)
    assert _error(reply, 400, "invalid_input", "InvalidInputError").startswith(f"{field} must be a positive int")


def test_mem0_2x_arguments_the_clients_take_are_taken_over_http_too(http: httpx.Client) -> None:
    """The clients took get_all's show_expired and update's expiration_date, but their routes' bodies refused them
    as unknown fields (a review's find): a raw HTTP caller gets what a client gets."""
    memory_id = http.post("/v1/memories/", json={"messages": "I like tea.", "user_id": "alice", "infer": False}).json()
    memory_id = memory_id["results"][0]["id"]
    listed = http.post("/v2/memories/", json={"filters": {"user_id": "alice"}, "show_expired": True})
    assert [m["memory"] for m in listed.json()["results"]] == ["I like tea."]
    refused = http.put(f"/v1/memories/{memory_id}/", json={"text": "I like coffee.", "expiration_date": "2027-01-01"})
    assert "memories do not expire" in _error(refused, 400, "invalid_input", "InvalidInputError")
    updated = http.put(f"/v1/memories/{memory_id}/", json={"text": "I like green tea.", "expiration_date": None})
    assert updated.status_code == 200 and updated.json()["result"]["memory"] == "I like green tea."


def test_a_body_that_is_not_json_says_so_and_where(served: Served) -> None:
    """A new user's find: it read "invalid request: body.1: JSON decode error (got {})"."""
    with served.http() as http:
        for path in ("/v1/memories/", "/v1/chat/completions"):
            sent = b'{"messages": "I like tea.",}'  # a trailing comma: the parser stops at the brace, character 27
            reply = http.post(path, content=sent, headers={"content-type": "application/json"})
            message = _error(reply, 400, "invalid_input", "InvalidInputError")
            assert message == (
                "invalid request: the body is not valid JSON: Expecting property name enclosed in double quotes at "
                "character 27"
            ), path
        assert served.row_counts() == (0, 0)


@pytest.mark.parametrize(
    ("route", "body", "key"),
    [
        ("/v1/memories/", b'{"messages": "I like tea.", "user_id": "u1", "user_id": "u2", "infer": false}', "user_id"),
        ("/v1/memories/", b'{"messages": "x", "user_id": "u1", "metadata": {"k": 1, "k": 2}, "infer": false}', "k"),
        ("/v1/memories/search/", b'{"query": "tea", "filters": {"user_id": "u1", "user_id": "u2"}}', "user_id"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [], "max_tokens": 8, "max_tokens": 9}', "max_tokens"),
    ],
)
@pytest.mark.parametrize("content_type", ["application/json", "application/merge-patch+json"])
def test_a_body_naming_a_key_twice_is_refused_and_stores_nothing(
    http: httpx.Client, route: str, body: bytes, key: str, content_type: str
) -> None:
    """JSON keeps the last of a repeated key: the memory went to u2, while a proxy or log that keeps the first sees
    u1 (a differential fuzzer's find; a repeated query parameter was already refused). FastAPI reads both content
    types as JSON."""
    headers = {"content-type": content_type}
    message = _error(http.post(route, content=body, headers=headers), 400, "invalid_input", "InvalidInputError")
    assert f"the body is not valid JSON: the key {key!r} is given twice in one object" in message
    for user in ("u1", "u2"):
        assert http.get("/v1/memories/", params={"user_id": user}).json() == {"results": []}


@pytest.mark.parametrize(
    ("method", "url", "part"),
    [
        ("GET", "/v1/memories/?user_id=%FF", "query string"),
        ("GET", "/v1/memories/?user_id=%ED%A0%80", "query string"),  # an escaped lone surrogate
        ("DELETE", "/v1/memories/?user_id=%FF", "query string"),
        ("GET", "/v1/memories/%FF/", "path"),
        ("GET", "/v1/memories/%C3%28/history/", "path"),
    ],
)
def test_a_url_whose_escapes_are_not_utf8_is_refused_and_deletes_nothing(
    http: httpx.Client, method: str, url: str, part: str
) -> None:
    """Every such escape was decoded to U+FFFD: ``DELETE /v1/memories/?user_id=%FF`` answered 200 ``deleted: 1``,
    deleting the memories of user "\\ufffd" (a differential fuzzer's find), and ``%E9`` or ``%E8`` from a client
    encoding in Latin-1 named that same user."""
    added = http.post("/v1/memories/", json={"messages": "I like tea.", "user_id": "\ufffd", "infer": False})
    assert added.status_code == 200, added.text
    message = _error(http.request(method, url), 400, "invalid_input", "InvalidInputError")
    assert message == f"the URL's {part} holds percent-escapes that are not UTF-8 text; percent-encode text as UTF-8"
    kept = http.get("/v1/memories/", params={"user_id": "\ufffd"}).json()["results"]
    assert [m["memory"] for m in kept] == ["I like tea."]
    assert http.get("/v1/memories/?user_id=%E6%9E%97").status_code == 200  # UTF-8 escapes still read
