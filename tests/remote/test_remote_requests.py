"""What the remote clients send: each call's method, path, query and JSON body as the wire contract
(docs/server.md) gives them, the API key header, and what cannot be sent refused before anything is sent."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx
import pytest
from remote_wire import Wire

from inferscale.errors import EngineClosedError, InvalidInputError, MemoryNotFoundError, ScopeError, ServerError
from inferscale.remote.transport import Connection, default_tls_context

DEFAULTS = {"rerank": False, "explain": False, "show_expired": False}  # search's flags, always sent

CASES: list[tuple[str, Any, str, str, dict[str, str], Any, Any]] = [
    # id, call, method, path, query, body (None: no body), reply
    (
        "add",
        lambda m: m.add("I like tea", user_id="u", metadata={"k": 1}, infer=False),
        "POST",
        "/v1/memories/",
        {},
        {"messages": "I like tea", "user_id": "u", "metadata": {"k": 1}, "infer": False},
        {"results": [{"id": "m1", "memory": "I like tea", "event": "ADD"}]},
    ),
    (
        "add-every-argument",
        lambda m: m.add(
            [{"role": "user", "content": "hi"}],
            agent_id="a",
            run_id="r",
            encode_kv=True,
            timestamp=5,
            expiration_date="2030-01-01",
            output_format="v1.1",
        ),
        "POST",
        "/v1/memories/",
        {},
        {
            "messages": [{"role": "user", "content": "hi"}],
            "agent_id": "a",
            "run_id": "r",
            "infer": True,
            "encode_kv": True,
            "timestamp": 5,
            "expiration_date": "2030-01-01",
            "output_format": "v1.1",
        },
        {"results": []},
    ),
    (
        "search-v1",
        lambda m: m.search("tea", user_id="u", limit=2, threshold=0.5),
        "POST",
        "/v1/memories/search/",
        {},
        {"query": "tea", "user_id": "u", "limit": 2, "threshold": 0.5, **DEFAULTS},
        {"results": [{"id": "m1", "memory": "I like tea", "score": 0.9}]},
    ),
    (
        "search-v2",
        lambda m: m.search("tea", filters={"AND": [{"user_id": "u"}]}, top_k=3, version="v2", output_format="v1.1"),
        "POST",
        "/v2/memories/search/",
        {},
        {"query": "tea", "filters": {"AND": [{"user_id": "u"}]}, "top_k": 3, "version": "v2", "output_format": "v1.1"}
        | DEFAULTS,
        {"results": []},
    ),
    (
        "search-mem0-2x",
        lambda m: m.search(
            "tea", run_id="r", rerank=True, explain=True, reference_date="2026-01-01", show_expired=True
        ),
        "POST",
        "/v1/memories/search/",
        {},
        {"query": "tea", "run_id": "r", "rerank": True, "explain": True, "reference_date": "2026-01-01"}
        | {"show_expired": True},
        {"results": []},
    ),
    (
        "get",
        lambda m: m.get("m1", user_id="u"),
        "GET",
        "/v1/memories/m1/",
        {"user_id": "u"},
        None,
        {"id": "m1", "memory": "I like tea"},
    ),
    (
        "get_all-v1",
        lambda m: m.get_all(user_id="u", agent_id="a", limit=5),
        "GET",
        "/v1/memories/",
        {"user_id": "u", "agent_id": "a", "limit": "5"},
        None,
        {"results": [{"id": "m1", "memory": "I like tea"}]},
    ),
    (
        "get_all-v2-filters",
        lambda m: m.get_all(filters={"AND": [{"user_id": "u"}, {"kind": "x"}]}, top_k=2),
        "POST",
        "/v2/memories/",
        {},
        {"filters": {"AND": [{"user_id": "u"}, {"kind": "x"}]}, "top_k": 2},
        {"results": []},
    ),
    (
        "get_all-v2-a-bool-limit-keeps-its-type",
        lambda m: m.get_all(user_id="u", limit=True, version="v1"),
        "POST",
        "/v2/memories/",
        {},
        {"user_id": "u", "limit": True, "version": "v1"},
        {"results": []},
    ),
    (
        "update",
        lambda m: m.update("m1", "new text", {"a": 1}, user_id="u"),
        "PUT",
        "/v1/memories/m1/",
        {"user_id": "u"},
        {"text": "new text", "metadata": {"a": 1}},
        {"message": "Memory updated successfully!", "result": {"id": "m1", "memory": "new text"}},
    ),
    (
        "update-data",
        lambda m: m.update("m1", data="new text"),
        "PUT",
        "/v1/memories/m1/",
        {},
        {"data": "new text"},
        {"message": "Memory updated successfully!", "result": {"id": "m1", "memory": "new text"}},
    ),
    (
        "delete",
        lambda m: m.delete("m1", run_id="r"),
        "DELETE",
        "/v1/memories/m1/",
        {"run_id": "r"},
        None,
        {"message": "Memory deleted successfully!"},
    ),
    (
        "delete_all",
        lambda m: m.delete_all(user_id="u", agent_id="a"),
        "DELETE",
        "/v1/memories/",
        {"user_id": "u", "agent_id": "a"},
        None,
        {"message": "Memories deleted successfully!", "deleted": 3},
    ),
    (
        "history",
        lambda m: m.history("m1", user_id="u"),
        "GET",
        "/v1/memories/m1/history/",
        {"user_id": "u"},
        None,
        [{"id": "h1", "memory_id": "m1", "event": "ADD"}],
    ),
    ("ping", lambda m: m.ping(), "GET", "/v1/ping/", {}, None, {"status": "ok", "admin": True, "scopes": {}}),
]


@pytest.mark.parametrize(
    ("call", "method", "path", "query", "body", "reply"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_call_sends_the_contracts_request_and_returns_the_reply(
    wire: Wire, call: Any, method: str, path: str, query: dict[str, str], body: Any, reply: Any
) -> None:
    wire.answer(httpx.Response(200, json=reply))
    assert call(wire.client()) == reply
    (sent,) = wire.requests
    assert (sent.method, sent.url.path, dict(sent.url.params)) == (method, path, query)
    if body is None:
        assert sent.content == b"" and "content-type" not in sent.headers
    else:
        assert wire.body() == body and sent.headers["content-type"] == "application/json"


def test_reset_answers_none_as_the_local_client_does(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json={"message": "Reset successful."}))
    assert wire.client().reset() is None
    assert (wire.last.method, wire.last.url.path) == ("POST", "/v1/reset/")


def test_a_missing_memory_is_none_for_get_and_no_rows_for_history(wire: Wire) -> None:
    """As the local client answers; update and delete raise, as the local client does."""
    wire.answer(wire.error("memory_not_found", "no memory with id 'x'", 404))
    m = wire.client()
    assert m.get("x") is None
    assert m.history("x") == []
    with pytest.raises(MemoryNotFoundError, match="no memory with id 'x'"):
        m.update("x", "text")
    with pytest.raises(MemoryNotFoundError, match="no memory with id 'x'"):
        m.delete("x")


def test_the_api_key_is_sent_as_mem0s_token_header(wire: Wire, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERSCALE_API_KEY", raising=False)
    wire.client(api_key="isk_0123456789ab_secret").ping()
    assert wire.last.headers["authorization"] == "Token isk_0123456789ab_secret"
    wire.client().ping()
    assert "authorization" not in wire.last.headers
    monkeypatch.setenv("INFERSCALE_API_KEY", "isk_from_env")
    wire.client().ping()
    assert wire.last.headers["authorization"] == "Token isk_from_env"
    wire.client(api_key="isk_given").ping()  # a key passed in wins over the environment
    assert wire.last.headers["authorization"] == "Token isk_given"


@pytest.mark.parametrize(
    ("memory_id", "raw_path"),
    [
        ("..", b"/v1/memories/%2E%2E/"),
        ("x?y#z", b"/v1/memories/x%3Fy%23z/"),
        ("林晓雨", b"/v1/memories/%E6%9E%97%E6%99%93%E9%9B%A8/"),
    ],
)
def test_a_memory_id_is_one_escaped_path_segment(wire: Wire, memory_id: str, raw_path: bytes) -> None:
    wire.answer(httpx.Response(200, json={"message": "Memory deleted successfully!"}))
    wire.client().delete(memory_id)
    assert wire.last.url.raw_path == raw_path


@pytest.mark.parametrize("memory_id", ["a/b", "m1/history", "/", "search"])
def test_a_memory_id_no_path_carries_to_its_route_is_answered_as_unknown_without_sending(
    wire: Wire, memory_id: str
) -> None:
    """The server routes on the decoded path, where an escaped "/" separates again ("m1/history" would reach m1's
    history), and "search" is another route's word: no memory has such an id, so the answer is the local client's
    for an unknown one."""
    m = wire.client()
    assert m.get(memory_id) is None
    assert m.history(memory_id, user_id="u") == []
    with pytest.raises(MemoryNotFoundError, match="no memory with id"):
        m.delete(memory_id)
    with pytest.raises(MemoryNotFoundError, match="no memory with id"):
        m.update(memory_id, "new text")
    with pytest.raises(InvalidInputError, match="nothing to update"):  # checked before the lookup, as locally
        m.update(memory_id)
    assert wire.requests == []


PART = {"type": "text", "text": "Hi"}


def _cyclic() -> dict[str, Any]:
    node: dict[str, Any] = {"a": 1}
    node["self"] = node
    return node


def _cyclic_list() -> list[Any]:
    node: list[Any] = ["a"]
    node.append(node)
    return node


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        node = {"a": node}
    return node


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m.get(""), InvalidInputError, "memory_id"),
        (lambda m: m.history(None), InvalidInputError, "memory_id"),
        (lambda m: m.get("m1", user_id=True), ScopeError, "user_id"),
        (lambda m: m.delete_all(agent_id=["a"]), ScopeError, "agent_id"),
        (lambda m: m.search("x", user_id="u", threshold=float("nan")), InvalidInputError, "threshold is nan"),
        (lambda m: m.search("x", user_id=5.0), ScopeError, "user_id must be a non-empty string or an int, got 5.0"),
        (lambda m: m.add("x", agent_id=["a"]), ScopeError, "agent_id"),
        (lambda m: m.get_all(run_id=1.5, filters={"k": "v"}), ScopeError, "run_id"),
        (lambda m: m.chat("x", user_id=False), ScopeError, "user_id"),
        (lambda m: m.add("x", user_id="u", metadata={1: "x"}), InvalidInputError, "metadata has the key 1"),
        (lambda m: m.update("m1", metadata={"a": [{2: 1}]}), InvalidInputError, r"metadata\['a'\]\[0\] has the key 2"),
        (lambda m: m.search("x", user_id="u", filters={1: "v"}), InvalidInputError, "filters has the key 1"),
        (lambda m: m.chat("x", user_id="u", temperature=float("inf")), InvalidInputError, "temperature is inf"),
        (lambda m: m.add("x", user_id="u", metadata={"when": object()}), InvalidInputError, "JSON"),
        (lambda m: m.chat("x", user_id="u", stop={"a"}), InvalidInputError, "JSON"),
        # the server reads OpenAI's wider shapes, which the local client refuses: code that worked remote only
        (lambda m: m.chat(messages=[{"role": "user", "content": [PART]}], user_id="u"), InvalidInputError, "content"),
        (lambda m: m.chat([PART], user_id="u"), InvalidInputError, "query must be a non-empty string"),
        (lambda m: m.chat("x", user_id="u", search_query=" "), InvalidInputError, "search_query must be"),
        # a cycle, or nesting far past MAX_JSON_DEPTH, raised a bare RecursionError before the depth check ran
        (lambda m: m.add("x", user_id="u", metadata=_cyclic()), InvalidInputError, "metadata nests deeper than 64"),
        (lambda m: m.update("m1", metadata=_nested(1000)), InvalidInputError, "metadata nests deeper than 64"),
        (lambda m: m.search("x", user_id="u", filters={"k": {"in": _cyclic_list()}}), InvalidInputError, "is a list"),
        (lambda m: m.chat("x", user_id="u", stop=_cyclic_list()), InvalidInputError, "stop nests deeper than 64"),
    ],
)
def test_what_cannot_be_sent_is_refused_before_sending(wire: Wire, call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(wire.client())
    assert wire.requests == []


def test_text_that_is_not_unicode_still_reaches_the_server(wire: Wire) -> None:
    """A lone surrogate is no UTF-8, so it travels as a JSON escape; the server refuses it as the local client does."""
    wire.answer(httpx.Response(200, json={"results": []}))
    wire.client().search("\ud800", user_id="u")
    assert b'"\\ud800"' in wire.last.content
    assert wire.body()["query"] == "\ud800"


def test_other_values_are_passed_through_for_the_server_to_judge(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json={"results": []}))
    m = wire.client()
    m.add("x", user_id="u", encode_kv="no")
    m.search("x", user_id="u", threshold="0.5", limit=-1)
    m.get_all(user_id="u", limit=2**70)
    assert wire.body(0)["encode_kv"] == "no"
    assert (wire.body(1)["threshold"], wire.body(1)["limit"]) == ("0.5", -1)
    assert dict(wire.last.url.params) == {"user_id": "u", "limit": str(2**70)}


def test_arguments_whose_none_the_server_would_read_as_its_default_are_refused_before_sending(wire: Wire) -> None:
    """Left out of the body, a None would be the server's default (infer=True, show_expired=False, mode="kv"),
    where the local client refuses it."""
    m = wire.client()
    for call, match in [
        (lambda: m.add("x", user_id="u", infer=None), "infer must be True or False"),
        (lambda: m.search("x", user_id="u", show_expired=None), "show_expired must be True or False"),
        (lambda: m.chat("hi", user_id="u", mode=None), "mode must be 'kv' or 'prompt', got None"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            call()
    assert wire.requests == []


def test_mem0_arguments_the_schema_types_as_text_are_not_sent_at_their_neutral_false(wire: Wire) -> None:
    """The server's schema types them as text or a number, which a neutral False is not: it is left out."""
    wire.answer(httpx.Response(200, json={"results": []}))
    m = wire.client()
    m.add("x", user_id="u", timestamp=False, expiration_date=False)
    m.search("x", user_id="u", rerank=False, explain=None, reference_date=False)
    assert wire.body(0) == {"messages": "x", "user_id": "u", "infer": True}
    assert wire.body(1) == {"query": "x", "user_id": "u", "rerank": False, "show_expired": False}


def test_a_closed_client_opens_a_new_connection_pool_when_used_again(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json={"status": "ok"}))
    m = wire.client()
    m.ping()
    m._call(m.client.close)  # the client, not the adapter (whose event loop the async client goes on using)
    assert m.ping() == {"status": "ok"}
    assert len(wire.requests) == 2


def test_bodies_are_ascii_json(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json={"results": []}))
    wire.client().add("我叫林晓雨", user_id="cn")
    assert wire.last.content.isascii()
    assert json.loads(wire.last.content)["messages"] == "我叫林晓雨"


def test_wait_for_encoding_asks_the_server_in_requests_of_at_most_30_s_until_it_is_done(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json={"done": False}), httpx.Response(200, json={"done": True}))
    assert wire.client().wait_for_encoding() is True  # no timeout: as many requests as it takes
    assert [(r.method, r.url.path) for r in wire.requests] == [("POST", "/v1/encoding/wait/")] * 2
    assert [wire.body(i) for i in range(2)] == [{"timeout": 30.0}] * 2

    wire.answer(httpx.Response(200, json={"done": True}))
    assert wire.client(timeout=10).wait_for_encoding() is True
    assert wire.body() == {"timeout": 5.0}  # half the client's own timeout: the reply comes before a read times out

    wire.answer(httpx.Response(200, json={"done": False}))
    assert wire.client().wait_for_encoding(0) is False  # one request that waits for nothing
    assert wire.body() == {"timeout": 0.0} and len(wire.requests) == 4


@pytest.mark.parametrize("timeout", [-1, "5", True, float("nan"), 1e10])
def test_wait_for_encoding_refuses_the_local_clients_bad_timeouts_before_sending(wire: Wire, timeout: Any) -> None:
    with pytest.raises(InvalidInputError, match="timeout must be None or a finite number of seconds"):
        wire.client().wait_for_encoding(timeout)
    assert wire.requests == []


def test_wait_for_encoding_refuses_a_reply_without_done(wire: Wire) -> None:
    wire.answer(httpx.Response(200, json={"done": "yes"}))
    with pytest.raises(ServerError, match="done='yes'"):
        wire.client().wait_for_encoding(0)


def test_a_reply_cut_off_by_closing_the_client_is_engine_closed_not_a_server_error(wire: Wire) -> None:
    """``close()`` while a non-streamed chat waited for its reply (another thread, or the event loop's other task)
    raised a ``ServerError`` that blamed the server ("got no complete reply ... the timeout is 300 s"); a stream
    cut off so raised ``EngineClosedError`` already, as the local client does for both."""
    m = wire.client()

    def closed_meanwhile(request: httpx.Request) -> httpx.Response:
        m.close()
        raise httpx.ReadError("the connection was closed", request=request)

    async def aclosed_meanwhile(request: httpx.Request) -> httpx.Response:  # inside the async client's event loop
        await m.client.close()
        raise httpx.ReadError("the connection was closed", request=request)

    wire.answer(closed_meanwhile if wire.kind == "remote" else aclosed_meanwhile)  # type: ignore[arg-type]
    with pytest.raises(EngineClosedError, match="the client was closed while its reply was read"):
        m.chat("Tell me a story.", user_id="u")
    wire.answer(httpx.ReadError("the server went away"))
    with pytest.raises(ServerError, match="got no complete reply"):  # a break this side did not cause is the server's
        m.chat("Tell me a story.", user_id="u")


def test_a_client_closed_between_two_attempts_is_engine_closed(wire: Wire) -> None:
    """An idempotent call retried after a refused connection, on a client closed meanwhile, raised httpx's bare
    ``RuntimeError("Cannot send a request, as the client has been closed.")``."""
    m = wire.client()

    def refused_and_closed(request: httpx.Request) -> httpx.Response:
        m.close()
        raise httpx.ConnectError("refused", request=request)

    async def arefused_and_closed(request: httpx.Request) -> httpx.Response:
        await m.client.close()
        raise httpx.ConnectError("refused", request=request)

    wire.answer(refused_and_closed if wire.kind == "remote" else arefused_and_closed)  # type: ignore[arg-type]
    with pytest.raises(EngineClosedError, match="the client was closed between two attempts"):
        m.get("m1")
    assert len(wire.requests) == 1


def test_a_streamed_chat_whose_client_closes_while_it_waits_out_a_429_is_engine_closed(wire: Wire) -> None:
    """A review's find: a stream retried after a 429 on a client closed during the wait raised httpx's bare
    ``RuntimeError`` (the opening attempt did not check the client, as plain calls' attempts do)."""
    m = wire.client()
    body = {"error": {"code": "rate_limited", "type": "RateLimitedError", "message": "try again in 1 s"}}

    def limited_and_closed(request: httpx.Request) -> httpx.Response:
        m.close()
        return httpx.Response(429, json=body, headers={"Retry-After": "0"})

    async def alimited_and_closed(request: httpx.Request) -> httpx.Response:
        await m.client.close()
        return httpx.Response(429, json=body, headers={"Retry-After": "0"})

    wire.answer(limited_and_closed if wire.kind == "remote" else alimited_and_closed)  # type: ignore[arg-type]
    with pytest.raises(EngineClosedError, match=r"POST /v1/chat/.*the client was closed between two attempts"):
        m.chat_stream_open("Hi", user_id="u")
    assert len(wire.requests) == 1


def test_every_client_verifies_the_servers_certificate_with_one_tls_context_per_process() -> None:
    """An https host's certificate and host name are checked; the context is built once for all clients (httpx
    built one per client: ~45 ms of CPU each, to load the CA bundle again)."""
    first = Connection.of("https://memory.example", None, 5, 0).client_options()["verify"]
    second = Connection.of("http://127.0.0.1:8000", "isk_x", 5, 0).client_options()["verify"]
    assert first is second is default_tls_context()
    assert first.verify_mode is ssl.CERT_REQUIRED and first.check_hostname
