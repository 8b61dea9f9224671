"""An open server (no API keys) answers only its own machine's clients: a request whose ``Origin`` (a web page of
another site: CSRF) or ``Host`` (a DNS-rebinding page) is not a loopback one is refused with 403 before it does
anything; with keys the key decides."""

from __future__ import annotations

import httpx
import pytest
from server_harness import Served
from starlette.datastructures import Headers

from inferscale.server.local_only import cross_site_reason, is_loopback_host

CROSS_SITE = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},  # sandboxed frames, file:// pages
    {"Origin": "http://127.0.0.1.evil.example:8000"},
    {"Origin": "chrome-extension://abc"},
    {"Host": "evil.example:18732"},
    {"Host": "localhost.evil.example"},
    {"Host": "[::1"},  # unreadable
]
LOOPBACK = [
    {},
    {"Origin": "http://localhost:3000"},
    {"Origin": "https://127.0.0.1"},
    {"Origin": "http://[::1]:8000", "Host": "[::1]:8000"},
    {"Host": "localhost:8000"},
    {"Host": "LOCALHOST."},
    {"Host": "127.0.0.2:8000"},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_other_sites_and_rebound_names_are_named_in_the_reason(headers: dict[str, str]) -> None:
    reason = cross_site_reason(Headers(headers=headers))
    assert reason is not None and repr(next(iter(headers.values()))[:100]) in reason


@pytest.mark.parametrize("headers", LOOPBACK)
def test_loopback_hosts_and_origins_pass(headers: dict[str, str]) -> None:
    assert cross_site_reason(Headers(headers=headers)) is None


def test_loopback_names() -> None:
    assert [is_loopback_host(h) for h in ("localhost", "127.9.9.9", "::1", "0.0.0.0", "10.0.0.1", "", None)] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
    ]


def _post(served: Served, path: str, headers: dict[str, str], **kwargs: object) -> httpx.Response:
    with httpx.Client(base_url=served.url, timeout=60.0) as http:
        return http.post(path, headers=headers, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_an_open_server_refuses_a_cross_site_reset_and_rebound_reads(served: Served, headers: dict[str, str]) -> None:
    with served.http() as http:
        http.post(
            "/v1/memories/", json={"messages": "I like tea.", "user_id": "dev", "infer": False}
        ).raise_for_status()
    # the finding: a form post (text/plain, no body) from another site wiped the store
    reset = _post(served, "/v1/reset/", {**headers, "content-type": "text/plain"})
    assert reset.status_code == 403, reset.text
    assert reset.json()["error"]["code"] == "permission_denied"
    assert reset.json()["error"]["type"] == "PermissionDeniedError"
    assert served.row_counts() == (1, 1)
    with httpx.Client(base_url=served.url, timeout=60.0) as http:
        read = http.get("/v1/memories/", params={"user_id": "dev"}, headers=headers)
    assert read.status_code == 403 and read.json()["error"]["code"] == "permission_denied"


def test_an_open_server_answers_loopback_clients(served: Served) -> None:
    port = served.url.rsplit(":", 1)[1]
    for headers in ({"Host": f"localhost:{port}"}, {"Origin": "http://localhost:3000"}):
        assert _post(served, "/v1/memories/search/", headers, json={"query": "x", "user_id": "u"}).status_code == 200


def test_with_keys_the_key_decides_whatever_the_host_or_origin(served: Served) -> None:
    _, secret = served.keys.create("admin", admin=True)
    page = {"Origin": "http://evil.example", "Host": "memory.example"}
    assert _post(served, "/v1/reset/", page).json()["error"]["code"] == "unauthenticated"
    reply = _post(served, "/v1/reset/", {**page, "Authorization": f"Token {secret}"})
    assert reply.json() == {"message": "Reset successful."}
