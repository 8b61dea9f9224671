"""How the remote clients fail: every error code back to its exception type, replies in other shapes, and the retry
policy (idempotent calls try again on connection errors and proxies' 502/503/504; add, chat and reset never send
twice; a server that cannot be reached is a ServerError naming it)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from client_adapter import ClientAdapter
from remote_wire import Wire

from inferscale.error_codes import ERROR_CODES, ErrorCode
from inferscale.errors import RateLimitedError, ServerError
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient
from inferscale.remote.retry import parse_retry_after

PROXY_DOWN = httpx.Response(503, text="<html><body>503 Service Temporarily Unavailable</body></html>")
OK = {"results": []}

IDEMPOTENT: list[tuple[str, Any, Any]] = [
    ("search", lambda m: m.search("tea", user_id="u"), OK),
    ("get", lambda m: m.get("m1"), {"id": "m1"}),
    ("get_all-GET", lambda m: m.get_all(user_id="u"), OK),
    ("get_all-POST", lambda m: m.get_all(filters={"user_id": "u"}), OK),
    ("update", lambda m: m.update("m1", "x"), {"message": "Memory updated successfully!", "result": {}}),
    ("history", lambda m: m.history("m1"), []),
    ("ping", lambda m: m.ping(), {"status": "ok"}),
]

SENT_ONCE: list[tuple[str, Any]] = [
    ("add", lambda m: m.add("I like tea", user_id="u")),
    ("chat", lambda m: m.chat("Hi", user_id="u")),
    ("chat-stream", lambda m: m.chat_stream_open("Hi", user_id="u")),
    ("reset", lambda m: m.reset()),
    ("delete", lambda m: m.delete("m1")),
    ("delete_all", lambda m: m.delete_all(user_id="u")),
]


# ---- error replies ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", ERROR_CODES, ids=[row.code for row in ERROR_CODES])
def test_every_error_code_raises_its_exception_type_with_the_servers_message(wire: Wire, row: ErrorCode) -> None:
    """Also the 5xx codes (extraction_failed 502, model_not_available and engine_closed 503): the server's own typed
    answer, raised at once, never retried. Only a 429 (``rate_limited``) is tried again, as every 429 is (below)."""
    wire.answer(wire.error(row.code, f"the message of {row.code}", row.status))
    with pytest.raises(row.error) as raised:
        wire.client(retries=2).search("tea", user_id="u")
    assert type(raised.value) is row.error
    assert str(raised.value) == f"the message of {row.code}"
    assert len(wire.requests) == (3 if row.status == 429 else 1)


def test_an_unknown_code_is_a_server_error_naming_it(wire: Wire) -> None:
    wire.answer(wire.error("quota_exceeded", "too many memories", 429))
    with pytest.raises(ServerError, match=r"too many memories \(error code 'quota_exceeded'\)"):
        wire.client().get_all(user_id="u")


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (httpx.Response(500, text="<html>Internal Server Error</html>"), r"HTTP 500.*<html>Internal Server Error"),
        (httpx.Response(404, json={"detail": "Not Found"}), r"HTTP 404.*detail"),
        (httpx.Response(400, json={"error": "bad"}), r"HTTP 400.*bad"),
        (httpx.Response(401, content=b""), r"HTTP 401"),
    ],
)
def test_a_reply_in_another_shape_is_a_server_error_quoting_status_and_body(
    wire: Wire, reply: httpx.Response, match: str
) -> None:
    wire.answer(reply)
    with pytest.raises(ServerError, match=match) as raised:
        wire.client().add("I like tea", user_id="u")
    assert f"POST {wire.host}/v1/memories/" in str(raised.value)


def test_a_long_body_is_quoted_only_in_part(wire: Wire) -> None:
    wire.answer(httpx.Response(500, text="x" * 10_000))
    with pytest.raises(ServerError) as raised:
        wire.client().ping()
    assert 300 <= str(raised.value).count("x") < 400


@pytest.mark.parametrize(
    ("call", "reply", "match"),
    [
        (lambda m: m.search("tea", user_id="u"), httpx.Response(200, text="not json"), "not JSON"),
        # nested past the JSON parser's recursion: a bare RecursionError before
        (lambda m: m.search("tea", user_id="u"), httpx.Response(200, text="[" * 100_000 + "]" * 100_000), "not JSON"),
        (lambda m: m.get("m1"), httpx.Response(400, text='{"a":' * 100_000 + "1" + "}" * 100_000), "HTTP 400"),
        (lambda m: m.search("tea", user_id="u"), httpx.Response(200, json=["a", "list"]), "JSON object"),
        (lambda m: m.history("m1"), httpx.Response(200, json={"an": "object"}), "JSON list"),
        (lambda m: m.chat("Hi", user_id="u"), httpx.Response(200, json={"choices": []}), "choices"),
    ],
)
def test_a_success_reply_of_the_wrong_shape_is_a_server_error(wire: Wire, call: Any, reply: Any, match: str) -> None:
    wire.answer(reply)
    with pytest.raises(ServerError, match=match):
        call(wire.client())


# ---- retries ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "reply"), [c[1:] for c in IDEMPOTENT], ids=[c[0] for c in IDEMPOTENT])
@pytest.mark.parametrize("status", [502, 503, 504])
def test_an_idempotent_call_retries_a_proxys_5xx_then_succeeds(wire: Wire, call: Any, reply: Any, status: int) -> None:
    wire.answer(httpx.Response(status, text="Bad Gateway"), httpx.Response(200, json=reply))
    assert call(wire.client()) == reply
    assert len(wire.requests) == 2
    first, second = wire.requests
    assert (first.method, first.url, first.content) == (second.method, second.url, second.content)


@pytest.mark.parametrize("call", [c[1] for c in SENT_ONCE], ids=[c[0] for c in SENT_ONCE])
def test_add_chat_reset_and_the_deletes_are_never_sent_twice(wire: Wire, call: Any) -> None:
    wire.answer(PROXY_DOWN, httpx.Response(200, json=OK))
    with pytest.raises(ServerError, match=r"HTTP 503.*Service Temporarily Unavailable"):
        call(wire.client())
    assert len(wire.requests) == 1


def test_a_delete_that_reached_the_server_behind_a_gateway_timeout_is_not_reported_missing(wire: Wire) -> None:
    """The proxy's 504 came after the server deleted m1: sent again, the delete would answer memory_not_found."""
    wire.answer(
        httpx.Response(504, text="<html>Gateway Timeout</html>"), wire.error("memory_not_found", "no memory", 404)
    )
    with pytest.raises(ServerError, match="HTTP 504"):
        wire.client().delete("m1")
    assert len(wire.requests) == 1


@pytest.mark.parametrize(
    "call", [c[1] for c in IDEMPOTENT] + [c[1] for c in SENT_ONCE], ids=[c[0] for c in IDEMPOTENT + SENT_ONCE]
)
def test_every_call_retries_a_connection_that_could_not_be_made(wire: Wire, call: Any) -> None:
    """Nothing was sent, so even add and chat try again."""
    wire.answer(httpx.ConnectError("connection refused"), wire.error("invalid_input", "reached", 400))
    with pytest.raises(ValueError, match="reached"):  # the second attempt got the server's answer
        call(wire.client())
    assert len(wire.requests) == 2


def _rate_limited(retry_after: str | None) -> httpx.Response:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    body = {"error": {"code": "rate_limited", "type": "RateLimitedError", "message": "try again in 1 s"}}
    return httpx.Response(429, json=body, headers=headers)


@pytest.mark.parametrize(
    "call", [c[1] for c in IDEMPOTENT] + [c[1] for c in SENT_ONCE], ids=[c[0] for c in IDEMPOTENT + SENT_ONCE]
)
@pytest.mark.parametrize("retry_after", ["0", None])
def test_every_call_retries_a_429_whose_request_never_ran(wire: Wire, call: Any, retry_after: str | None) -> None:
    """A 429 refuses the request before it runs (the server's key-check budget, a proxy's rate limit), so even add,
    chat and the deletes send it again; the streamed chat too, before its first chunk."""
    wire.answer(_rate_limited(retry_after), wire.error("invalid_input", "reached", 400))
    with pytest.raises(ValueError, match="reached"):  # the second attempt got the server's answer
        call(wire.client())
    assert len(wire.requests) == 2
    first, second = wire.requests
    assert (first.method, first.url, first.content) == (second.method, second.url, second.content)


def test_the_wait_before_trying_a_429_again_is_its_retry_after(wire: Wire) -> None:
    """Not the exponential back-off's 10 ms (the conftest's): the server said when a key check may run again."""
    wire.answer(_rate_limited("1"), httpx.Response(200, json=OK))
    assert wire.client().search("tea", user_id="u") == OK
    assert 1.0 <= wire.times[1] - wire.times[0] < 1.5


@pytest.mark.parametrize(
    "call", [lambda m: m.search("tea", user_id="u"), lambda m: m.chat_stream_open("Hi", user_id="u")]
)
def test_a_429_that_asks_for_a_longer_wait_than_the_client_waits_is_raised_at_once_with_it(
    wire: Wire, call: Any
) -> None:
    wire.answer(_rate_limited("61"), httpx.Response(200, json=OK))
    with pytest.raises(RateLimitedError) as raised:
        call(wire.client())
    assert raised.value.retry_after_s == 61 and len(wire.requests) == 1


@pytest.mark.parametrize(
    "call", [lambda m: m.add("I like tea", user_id="u"), lambda m: m.chat_stream_open("Hi", user_id="u")]
)
def test_the_last_429_is_raised_with_the_wait_its_retry_after_asked_for(wire: Wire, call: Any) -> None:
    """The error built from the body alone held the default, 1 s."""
    wire.answer(_rate_limited("7"))
    with pytest.raises(RateLimitedError, match="try again") as raised:
        call(wire.client(retries=0))
    assert raised.value.retry_after_s == 7 and len(wire.requests) == 1


def test_a_proxys_503_that_asks_for_a_long_wait_is_not_tried_again(wire: Wire) -> None:
    wire.answer(
        httpx.Response(503, text="down for maintenance", headers={"Retry-After": "3600"}), httpx.Response(200, json=OK)
    )
    with pytest.raises(ServerError, match=r"HTTP 503.*maintenance"):
        wire.client().search("tea", user_id="u")
    assert len(wire.requests) == 1


def _wait_of(value: str | bytes) -> float | None:
    return parse_retry_after(httpx.Headers({"Retry-After": value}))


def test_retry_after_reads_seconds_and_http_dates_and_ignores_anything_else() -> None:
    """RFC 9110 §10.2.3: delay-seconds or an HTTP-date (also the obsolete asctime form, read as GMT, §5.6.7); the
    wait from a date is counted against this clock."""
    ahead = datetime.now(UTC) + timedelta(seconds=30)
    assert _wait_of("12") == 12.0 and _wait_of(" 0 ") == 0.0
    assert 28.0 <= (_wait_of(format_datetime(ahead, usegmt=True)) or 0) <= 30.0
    assert 28.0 <= (_wait_of(ahead.strftime("%a %b %d %H:%M:%S %Y")) or 0) <= 30.0  # asctime
    assert _wait_of("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # past: no wait
    assert _wait_of("Wed, 21 Oct 2015 07:28:00 -0000") == 0.0
    huge_year = "Wed, 21 Oct 99999999999999999999 07:28:00 GMT"  # overflowed inside parsedate_to_datetime
    for unreadable in ("-5", "1.5", "soon", "\uff11\uff12", "", "9" * 400, huge_year):
        # full-width digits pass str.isdigit: sent as UTF-8 bytes, which httpx decodes; 400 nines overflow a float
        assert _wait_of(unreadable.encode()) is None, unreadable
    assert parse_retry_after(httpx.Headers()) is None


def test_a_429_whose_retry_after_overflows_a_float_is_a_rate_limited_error(wire: Wire) -> None:
    """A review's find: ``Retry-After: 999...9`` (400 digits) read as infinity, and building the error raised a bare
    ``OverflowError``. The header is ignored: the back-off's waits, then the error with its default wait."""
    wire.answer(_rate_limited("9" * 400))
    with pytest.raises(RateLimitedError) as raised:
        wire.client(retries=1).search("tea", user_id="u")
    assert raised.value.retry_after_s == 1 and len(wire.requests) == 2


def test_retries_back_off_exponentially_then_raise_the_last_reply(wire: Wire) -> None:
    wire.answer(PROXY_DOWN)
    with pytest.raises(ServerError, match="HTTP 503"):
        wire.client(retries=3).search("tea", user_id="u")
    assert len(wire.requests) == 4
    gaps = [b - a for a, b in zip(wire.times, wire.times[1:], strict=False)]
    for gap, wait in zip(gaps, (0.01, 0.02, 0.04), strict=True):  # the conftest's 10 ms, doubling
        assert wait <= gap < wait + 0.5


def test_no_retries_means_one_attempt(wire: Wire) -> None:
    wire.answer(PROXY_DOWN, httpx.Response(200, json=OK))
    with pytest.raises(ServerError):
        wire.client(retries=0).search("tea", user_id="u")
    assert len(wire.requests) == 1


def test_a_reply_that_breaks_off_is_a_server_error_and_not_retried(wire: Wire) -> None:
    wire.answer(httpx.ReadTimeout("timed out"), httpx.Response(200, json=OK))
    with pytest.raises(ServerError, match=r"no complete reply.*ReadTimeout.*timeout is 7 s"):
        wire.client(timeout=7).search("tea", user_id="u")
    assert len(wire.requests) == 1


@pytest.mark.parametrize("kind", ["remote", "remote-async"])
def test_a_server_that_refuses_connections_is_a_server_error_naming_the_host(kind: str) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        host = f"http://127.0.0.1:{sock.getsockname()[1]}"
    cls = RemoteMemoryClient if kind == "remote" else AsyncRemoteMemoryClient
    client = ClientAdapter(cls(host, retries=2))
    try:
        for call in (lambda: client.add("x", user_id="u"), lambda: client.search("x", user_id="u")):
            with pytest.raises(ServerError, match=rf"cannot connect to the InferScale server at {host} \(3 attempts"):
                call()
    finally:
        client.close()
