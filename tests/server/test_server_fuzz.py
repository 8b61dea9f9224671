"""Fuzzing from the server's own OpenAPI schema (schemathesis): requests that fit the schema and requests that do
not, on every published operation, against the running server. No reply is a 5xx, every error reply has the
structured shape, and a rejected request (4xx) stores nothing: the memory and history row counts are read before
and after each one."""

from __future__ import annotations

from collections import Counter
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from server_harness import Served

from inferscale.server.schemas import ChatBody

EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 30, schemathesis.GenerationMode.NEGATIVE: 10}
"""Examples per operation, by generation mode (deterministic: hypothesis is derandomised)."""


NEUTRAL = ("timestamp", "expiration_date", "reference_date", "rerank", "explain", "version", "output_format", "n")
"""Fields the client accepts at their neutral value only (Mem0 features InferScale lacks), and OpenAI's ``n``."""


def steered(label: str, body: Any) -> Any:
    """A copy of a schema-valid ``body`` that the client is likelier to accept, so that fuzzing reaches the paths
    that store and generate: the neutral-only fields left out, a scope added where none is named, and for a chat
    only OpenAI's known fields, a valid conversation and a budget of at most 8 tokens (the sampling fields and the
    ``inferscale`` object stay as generated)."""
    if not isinstance(body, dict):
        return body
    out = {k: v for k, v in body.items() if k not in NEUTRAL}
    if label == "POST /v1/chat/completions":
        out = {k: v for k, v in out.items() if k in ChatBody.model_fields}
        out["messages"] = [{"role": "user", "content": "Where do I live?"}]
        for budget in ("max_tokens", "max_completion_tokens"):
            if isinstance(out.get(budget), int):
                out[budget] = max(1, min(out[budget], 8))
        if not out.get("user"):
            out["user"] = "alice"
    elif not any(out.get(k) for k in ("user_id", "agent_id", "run_id", "filters")):
        out["user_id"] = "alice"
    return out


def test_fuzzing_finds_no_server_error_and_a_rejected_request_stores_nothing(served: Served) -> None:
    with served.http() as http:  # some stored memories, so reads and searches have something to find
        for fact in ("I live in Porto.", "My dog is called Biscuit."):
            http.post("/v1/memories/", json={"messages": fact, "user_id": "alice", "infer": False}).raise_for_status()
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 17  # every route of the contract's table but /openapi.json itself
    statuses: Counter[tuple[str, int]] = Counter()
    failures: list[str] = []
    unbreakable: list[str] = []

    def check(case: Any) -> None:
        send(case)
        if case.meta.generation.mode == schemathesis.GenerationMode.POSITIVE and isinstance(case.body, dict):
            case.body = steered(case.operation.label, case.body)
            send(case)

    def send(case: Any) -> None:
        before = served.row_counts()
        reply = case.call(base_url=served.url, timeout=60)
        statuses[(case.operation.label, reply.status_code)] += 1
        where = f"{case.operation.label} {case.body!r:.200} {case.query!r:.200} -> {reply.status_code}"
        if reply.status_code >= 500:
            failures.append(f"{where}: {reply.text[:300]}")
        elif reply.status_code >= 400:
            error = reply.json().get("error", {})
            if set(error) != {"code", "type", "message"}:
                failures.append(f"{where}: unstructured error {reply.text[:300]}")
            if served.row_counts() != before:
                failures.append(f"{where}: a rejected request changed the row counts")

    for operation in operations:
        for mode in EXAMPLES:
            fuzz = settings(
                max_examples=EXAMPLES[mode],
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )(given(case=operation.as_strategy(generation_mode=mode))(check))
            try:
                fuzz()
            except Unsatisfiable:  # nothing to get wrong: no parameters and no body
                assert mode == schemathesis.GenerationMode.NEGATIVE
                unbreakable.append(operation.label)
    assert failures == []
    assert unbreakable == ["GET /health"]  # /metrics takes an API key (an admin's on a server with keys)
    # both outcomes were reached on the routes that store or generate
    for label in ("POST /v1/memories/", "POST /v1/memories/search/", "POST /v1/chat/completions"):
        assert statuses[(label, 200)] > 0 and statuses[(label, 400)] > 0, sorted(statuses.items())
