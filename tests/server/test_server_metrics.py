"""``/metrics``: exact request counts by route, method and status, latency histogram counts, chat token counters
equal to what the replies reported, and the K/V store's hits and misses per tier."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from server_harness import Served


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text page."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _requests(route: str, method: str, status: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return "inferscale_http_requests_total", (("method", method), ("route", route), ("status", status))


def test_metrics_count_requests_tokens_and_kv_lookups(served: Served) -> None:
    chat: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Where do I live?"}],
        "user": "alice",
        "max_tokens": 3,
    }
    with served.http() as http:
        before = _samples(http.get("/metrics").text)
        assert ("inferscale_kv_hits_total", (("tier", "host"),)) not in before  # no K/V used yet: nothing built
        for fact in ("I live in Porto.", "I have a dog."):
            http.post("/v1/memories", json={"messages": fact, "user_id": "alice", "infer": False}).raise_for_status()
        assert http.post("/v1/memories/search/", json={"query": "tea"}).status_code == 400
        assert http.get("/v1/memories/nope/").status_code == 404
        first = http.post("/v1/chat/completions", json=chat).json()  # 2 memories: K/V misses, encoded, stored
        second = http.post("/v1/chat/completions", json={**chat, "stream": True}).text  # the same 2: host hits
        page = http.get("/metrics").text
    final = [line for line in second.splitlines() if '"inferscale"' in line]
    assert len(final) == 1
    streamed = json.loads(final[0].removeprefix("data: "))["inferscale"]
    reports = [first["inferscale"], streamed]
    assert [len(r["memory_ids"]) for r in reports] == [2, 2]

    samples = _samples(page)
    assert samples[_requests("/v1/memories", "POST", "200")] == 2
    assert samples[_requests("/v1/memories/search", "POST", "400")] == 1
    assert samples[_requests("/v1/memories/{memory_id}", "GET", "404")] == 1
    assert samples[_requests("/v1/chat/completions", "POST", "200")] == 2
    assert samples[_requests("/metrics", "GET", "200")] == 1  # the first scrape; this one is counted after it
    assert sum(v for (name, _), v in samples.items() if name == "inferscale_http_requests_total") == 7
    latency = "inferscale_http_request_duration_seconds_count"
    assert samples[(latency, (("route", "/v1/memories"),))] == 2
    assert samples[(latency, (("route", "/v1/chat/completions"),))] == 2
    assert samples[("inferscale_chat_prompt_tokens_total", ())] == sum(r["prompt_tokens"] for r in reports)
    assert samples[("inferscale_chat_completion_tokens_total", ())] == sum(r["generated_tokens"] for r in reports)
    assert samples[("inferscale_chat_memory_tokens_total", ())] == sum(r["memory_tokens"] for r in reports) > 0
    # lookups go host ▸ disk: the first chat misses both tiers twice, the second hits the host tier twice
    assert samples[("inferscale_kv_hits_total", (("tier", "host"),))] == 2
    assert samples[("inferscale_kv_hits_total", (("tier", "disk"),))] == 0
    assert samples[("inferscale_kv_misses_total", (("tier", "host"),))] == 2
    assert samples[("inferscale_kv_misses_total", (("tier", "disk"),))] == 2


def test_labels_take_no_value_the_client_makes_up(served: Served) -> None:
    """Made-up methods count as ``other`` and paths by their route template (or ``unmatched``), so a client cannot
    grow the number of series; counted before authentication too."""
    served.keys.create("alice", user_ids=["alice"])
    _, admin = served.keys.create("admin", admin=True)
    with served.http() as http:  # no key: every request below is refused or unknown, and still counted
        for i in range(3):
            assert http.request(f"BREW{i}", "/v1/memories/").status_code == 405
            assert http.request("PURGE", f"/made/up/path{i}").status_code == 404
            assert http.get(f"/v1/memories/secret-id-{i}/").status_code == 401
    with served.http(admin) as http:  # the scrape: an admin key on a server with keys
        page = http.get("/metrics").text
    samples = _samples(page)
    assert samples[_requests("/v1/memories", "other", "405")] == 3
    assert samples[_requests("unmatched", "other", "404")] == 3
    assert samples[_requests("/v1/memories/{memory_id}", "GET", "401")] == 3
    labels = {value for (name, items) in samples for _, value in items if name.startswith("inferscale_http")}
    assert not any(made_up in label for label in labels for made_up in ("BREW", "PURGE", "made", "secret-id"))


def test_the_docs_are_labelled_by_their_path(served: Served) -> None:
    """``/docs``, ``/redoc`` and ``/openapi.json`` (FastAPI's own routes, with no template in the scope) were counted
    as ``unmatched``; an unknown path still is."""
    with served.http() as http:
        for path in ("/docs", "/redoc", "/openapi.json", "/openapi.json", "/nowhere"):
            http.get(path)
        samples = _samples(http.get("/metrics").text)
    assert [samples.get(_requests(p, "GET", s)) for p, s in [("/docs", "200"), ("/redoc", "200")]] == [1, 1]
    assert samples[_requests("/openapi.json", "GET", "200")] == 2
    assert samples[_requests("unmatched", "GET", "404")] == 1


def test_an_upload_its_client_cut_short_counts_as_499_not_500(served: Served) -> None:
    """An upload cut short gets no reply (the body size limit stops reading at the client's disconnect) and was
    counted as a 500: 5 aborted uploads raised the 500 series by 5 (a tester's find), paging whoever alerts on 5xx."""
    import socket
    import time
    from urllib.parse import urlsplit

    where = urlsplit(served.url)
    head = (
        "POST /v1/memories/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    for _ in range(5):
        with socket.create_connection((where.hostname, where.port)) as sock:
            sock.sendall(head.encode() + b'{"messages":')
    with served.http() as http:
        deadline = time.monotonic() + 60  # the server notices each disconnect soon after: poll, not a timed assert
        while True:
            samples = _samples(http.get("/metrics").text)
            if samples.get(_requests("unmatched", "POST", "499"), 0) == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert samples.get(_requests("unmatched", "POST", "499")) == 5
    assert not any(name == "inferscale_http_requests_total" and ("status", "500") in labels for name, labels in samples)
