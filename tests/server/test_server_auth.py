"""API keys: the store (hashed, scrypt once per key, revocation at once), the budget of failed key checks (one
scrypt at a time, 429 past the budget, never for a key verified before) and the server's authentication (open
without keys, 401 for a missing, unknown or revoked key, 403 for a non-admin reset)."""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import MakeServer, Served, app_routes
from sqlalchemy import text

from inferscale.errors import APIKeyNotFoundError, ConfigError, InvalidInputError, RateLimitedError
from inferscale.server import key_checks
from inferscale.server import keys as keys_module
from inferscale.server.key_checks import KeyCheckLimiter, KeyCheckLimits
from inferscale.server.keys import KeyStore
from inferscale.server.options import ServerOptions
from inferscale.storage import make_engine


def _code(reply: Any) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


# ---- the store -------------------------------------------------------------------------------------------------


def test_a_key_is_stored_as_a_scrypt_hash_and_authenticates(tmp_path: Path) -> None:
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db")
    key, secret = store.create("alice's agent", user_ids=["alice"])
    prefix, key_id, rest = secret.split("_", 2)
    assert (prefix, key_id) == ("isk", key.key_id) and len(key_id) == 12 and len(rest) == 43
    assert (key.name, key.admin, key.user_ids, key.agent_ids, key.run_ids) == (
        "alice's agent",
        False,
        ("alice",),
        None,
        None,
    )
    assert store.authenticate(secret) == key
    engine = make_engine(store.url)
    with engine.connect() as conn:
        salt, stored = conn.execute(text("select salt, secret_hash from api_keys")).one()
    engine.dispose()
    assert stored == hashlib.scrypt(rest.encode(), salt=salt, n=2**14, r=8, p=1) and len(salt) == 16
    for wrong in (secret[:-1] + ("A" if secret[-1] != "A" else "B"), f"isk_{'0' * 12}_{rest}", "", "Token x", 5):
        assert store.authenticate(wrong) is None  # type: ignore[arg-type]
    store.close()


def test_creating_a_key_waits_for_another_writer_instead_of_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's ``inferscale keys create`` while the server wrote memories to the same SQLite file failed at
    once with "database is locked ... past the busy timeout" (2 of 8 tries): its transaction read first and then
    wrote, and SQLite refuses a write from a read snapshot that another writer's commit made stale. Here another
    connection writes while ``create`` is between its read and its write."""
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db")
    store.create("first", user_ids=["a"])  # the schema exists
    setup = sqlite3.connect(tmp_path / "keys.db")
    setup.execute("CREATE TABLE other_writes (x INTEGER)")
    setup.commit()
    setup.close()
    written = threading.Event()

    def write_elsewhere() -> None:
        conn = sqlite3.connect(tmp_path / "keys.db", timeout=10)
        conn.execute("INSERT INTO other_writes VALUES (1)")
        conn.commit()
        conn.close()
        written.set()

    real = keys_module._hash
    writer = threading.Thread(target=write_elsewhere)

    def hash_while_another_writes(secret: str, salt: bytes) -> bytes:  # runs after create's read, before its write
        writer.start()
        written.wait(1.0)  # without the write lock held, the other commit lands now
        return real(secret, salt)

    monkeypatch.setattr(keys_module, "_hash", hash_while_another_writes)
    key, _ = store.create("second", user_ids=["b"])
    writer.join(15)
    assert written.is_set() and not writer.is_alive()  # the other writer waited its turn, then wrote
    assert [k.key_id for k in store.list()][-1] == key.key_id
    store.close()


def test_scrypt_runs_once_per_key_and_revocation_is_seen_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db")
    calls: list[int] = []
    real = keys_module._hash

    def counting(secret: str, salt: bytes) -> bytes:
        calls.append(1)
        return real(secret, salt)

    monkeypatch.setattr(keys_module, "_hash", counting)
    key, secret = store.create("agent", agent_ids=["travel"])
    assert len(calls) == 1
    for _ in range(3):
        assert store.authenticate(secret) == key
    assert len(calls) == 2  # verified once, then remembered
    other = KeyStore(store.url)  # another process's view of the same database
    revoked = other.revoke(key.key_id)
    assert revoked.revoked_at is not None and revoked.key_id == key.key_id
    assert store.authenticate(secret) is None  # the cached verification does not outlive the revocation
    assert other.revoke(key.key_id).revoked_at == revoked.revoked_at  # revoking again keeps the first time
    assert [k.key_id for k in store.list()] == [key.key_id] and store.has_keys()
    store.close()
    other.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"name": "k"}, "must bind user_ids, agent_ids or run_ids"),
        ({"name": "k", "user_ids": "alice"}, "user_ids must be a list"),
        ({"name": "k", "user_ids": []}, "user_ids must hold 1 to"),
        ({"name": "k", "run_ids": ["r", " "]}, "run_ids must hold non-empty strings"),
        ({"name": "k", "admin": "yes"}, "admin must be True or False"),
        ({"name": "k", "admin": True, "user_ids": ["alice"]}, "an admin key .* cannot bind user_ids"),
        ({"name": "k", "admin": True, "agent_ids": ["a"], "run_ids": ["r"]}, "cannot bind agent_ids or run_ids"),
    ],
)
def test_create_refuses_bad_keys(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db")
    with pytest.raises(InvalidInputError, match=match):
        store.create(**kwargs)
    assert store.list() == [] and not store.has_keys()
    with pytest.raises(APIKeyNotFoundError, match="no API key has id 'nope'"):  # exits 1 in the CLI, as not found
        store.revoke("nope")
    store.close()


def test_every_failed_check_of_a_well_formed_key_runs_scrypt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unknown id, revoked id and wrong secret all cost one scrypt (the time of a 401 tells no id apart); only a
    malformed key fails without one."""
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db")
    key, secret = store.create("agent", user_ids=["alice"])
    revoked, revoked_secret = store.create("old", user_ids=["alice"])
    store.revoke(revoked.key_id)
    calls: list[bytes] = []
    real = keys_module._hash

    def counting(secret: str, salt: bytes) -> bytes:
        calls.append(salt)
        return real(secret, salt)

    monkeypatch.setattr(keys_module, "_hash", counting)
    rest = secret.split("_", 2)[2]
    wrong_secret = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    for failing in (f"isk_{'0' * 12}_{rest}", revoked_secret, wrong_secret):
        calls.clear()
        assert store.authenticate(failing) is None
        assert len(calls) == 1, failing
    calls.clear()
    assert store.authenticate("isk_short") is None and calls == []
    assert store.authenticate(secret) == key
    store.close()


def _made_up_key() -> str:
    """A well-formed key no store holds (an id of 12 hex characters, a secret of 43)."""
    return f"isk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


class _Scrypts:
    """Counts the key store's scrypt calls (``keys._hash``) and the most that ran at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, wait_for_company_s: float = 0.0) -> None:
        self.calls = 0
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        self._second_started = threading.Event()
        self._wait_s = wait_for_company_s
        self._real = keys_module._hash
        monkeypatch.setattr(keys_module, "_hash", self)

    def __call__(self, secret: str, salt: bytes) -> bytes:
        with self._lock:
            self.calls += 1
            first = self.calls == 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            if self.running > 1:
                self._second_started.set()
        try:
            if first and self._wait_s:  # give a second check the chance to start beside the first (none may)
                self._second_started.wait(self._wait_s)
            return self._real(secret, salt)
        finally:
            with self._lock:
                self.running -= 1


def test_the_failed_check_budget_spends_a_token_per_failure_and_refills_by_the_clock() -> None:
    now = [100.0]
    limiter = KeyCheckLimiter(KeyCheckLimits(failures_per_s=0.5, failure_burst=2), clock=lambda: now[0])
    ran: list[bool] = []

    def verify(result: bool) -> Any:
        return lambda: ran.append(result) or result

    assert [limiter.check(verify(True)) for _ in range(5)] == [True] * 5  # a key that verifies gives its token back
    assert [limiter.check(verify(False)) for _ in range(2)] == [False, False]
    ran.clear()
    with pytest.raises(RateLimitedError, match=r"try again in 2 s") as refused:
        limiter.check(verify(True))  # a valid key not verified before waits for the budget too
    assert refused.value.retry_after_s == 2 and ran == []  # no token for 1 / 0.5 s; nothing ran
    now[0] += 1.0  # half a token back
    with pytest.raises(RateLimitedError) as refused:
        limiter.check(verify(False))
    assert refused.value.retry_after_s == 1 and ran == []
    now[0] += 1.0  # a whole token
    assert limiter.check(verify(True)) is True and limiter.check(verify(False)) is False
    with pytest.raises(RateLimitedError):
        limiter.check(verify(False))
    now[0] += 1000.0  # refills up to the burst, not past it
    assert [limiter.check(verify(False)) for _ in range(2)] == [False, False]
    with pytest.raises(RateLimitedError):
        limiter.check(verify(False))

    def broken() -> bool:
        raise MemoryError("scrypt")

    now[0] += 2.0
    with pytest.raises(MemoryError):
        limiter.check(broken)  # a check that raises spends its token too
    with pytest.raises(RateLimitedError):
        limiter.check(verify(True))


def test_valid_keys_not_verified_yet_are_all_verified_at_once_while_no_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's find in the first budget: a check took a token as it started and a valid key gave it back only
    once verified, with the burst also capping the checks in progress, so 11 tenants reconnecting together after a
    restart (burst 10) got one 429 though no check had failed. Only failed checks spend the budget now."""
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db", KeyCheckLimits(failures_per_s=0.001, failure_burst=2))
    created = [store.create(f"tenant{i}", user_ids=[f"u{i}"]) for i in range(11)]
    store.close()
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db", KeyCheckLimits(failures_per_s=0.001, failure_burst=2))
    scrypts = _Scrypts(monkeypatch)
    with ThreadPoolExecutor(11) as pool:
        found = list(pool.map(store.authenticate, [secret for _, secret in created]))
    assert found == [key for key, _ in created] and (scrypts.calls, scrypts.most_at_once) == (11, 1)
    store.close()


def test_checks_past_the_waiting_cap_are_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = KeyCheckLimiter(KeyCheckLimits(failures_per_s=1.0, failure_burst=1))
    monkeypatch.setattr(key_checks, "KEY_CHECKS_WAITING", 2)
    release, started = threading.Event(), threading.Event()

    def slow() -> bool:
        started.set()
        return release.wait(30)

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(limiter.check, slow)
        assert started.wait(30)
        waiting = pool.submit(limiter.check, lambda: True)  # admitted: waits for its turn
        while limiter.admitted < 2:  # waits for the second admission, not for a time
            threading.Event().wait(0.01)
        with pytest.raises(RateLimitedError, match="2 key checks are waiting") as refused:
            limiter.check(lambda: True)
        release.set()
        assert running.result() is True and waiting.result() is True and refused.value.retry_after_s == 1


@pytest.mark.parametrize(
    ("rate", "burst", "match"),
    [
        (0, 10, "--failed-key-checks-per-s"),
        (float("inf"), 10, "--failed-key-checks-per-s"),
        (-1.0, 10, "--failed-key-checks-per-s"),
        (True, 10, "--failed-key-checks-per-s"),
        (5.0, 0, "--failed-key-check-burst"),
        (5.0, 2.5, "--failed-key-check-burst"),
    ],
)
def test_the_server_refuses_a_budget_out_of_bounds(rate: Any, burst: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ServerOptions(failed_key_checks_per_s=rate, failed_key_check_burst=burst)
    assert ServerOptions().key_check_limits == KeyCheckLimits(failures_per_s=5.0, failure_burst=10)


def test_checks_of_keys_not_verified_run_one_at_a_time_and_a_failed_key_is_refused_again_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent checks of made-up keys each took a core (a tester's 16 clients took the server's CPU)."""
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db", KeyCheckLimits(failures_per_s=0.001, failure_burst=5))
    key, secret = store.create("agent", user_ids=["alice"])
    scrypts = _Scrypts(monkeypatch, wait_for_company_s=1.0)
    made_up = [_made_up_key() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(store.authenticate, made_up)) == [None] * 4
    assert (scrypts.calls, scrypts.most_at_once) == (4, 1)
    assert [store.authenticate(k) for k in made_up] == [None] * 4  # remembered as refused
    assert store.authenticate(secret) == key and scrypts.calls == 5  # first use: one scrypt, its token back
    store.revoke(key.key_id)
    assert store.authenticate(secret) is None and scrypts.calls == 5  # revoked since verified: no scrypt
    assert store.authenticate(_made_up_key()) is None and scrypts.calls == 6
    with pytest.raises(RateLimitedError):
        store.authenticate(_made_up_key())  # 5 failures: the burst is spent
    assert scrypts.calls == 6
    store.close()


def test_a_flood_of_made_up_keys_is_refused_past_the_budget_and_a_verified_key_is_still_answered(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tester's find: 964 requests with made-up keys from 16 clients cost one scrypt each, and a legitimate chat
    took 21.7-26.2 s instead of 0.59 s. Past the budget they are answered 429 at once, with no scrypt; a key verified
    before is answered throughout."""
    served = make_server(ServerOptions(failed_key_checks_per_s=0.001, failed_key_check_burst=4))
    key, alice = served.keys.create("alice", user_ids=["alice"])
    _, bob = served.keys.create("bob", user_ids=["bob"])
    with served.http(alice) as http:
        assert http.get("/v1/ping/").status_code == 200  # alice's key is verified now
    scrypts = _Scrypts(monkeypatch)

    def request(credential: str) -> tuple[str, int, str | None, str | None, str | None]:
        with served.http(credential) as http:
            reply = http.get("/v1/memories/", params={"user_id": "alice"})
        code = reply.json()["error"]["code"] if reply.status_code != 200 else None
        headers = reply.headers
        return credential, reply.status_code, code, headers.get("retry-after"), headers.get("x-should-retry")

    credentials = [alice if i % 4 == 0 else _made_up_key() for i in range(80)]  # alice's among the flood's
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(request, credentials))
    assert [reply[1:3] for reply in replies if reply[0] == alice] == [(200, None)] * 20
    flooded = [reply[1:] for reply in replies if reply[0] != alice]
    assert sorted(reply[:2] for reply in flooded) == [(401, "unauthenticated")] * 4 + [(429, "rate_limited")] * 56
    limited = [reply for reply in flooded if reply[0] == 429]
    assert all(after is not None and 1 <= int(after) <= 1000 and retry is None for *_, after, retry in limited)
    assert (scrypts.calls, scrypts.most_at_once) == (4, 1)  # the budget's 4 failures, one at a time; none else
    with served.http(bob) as http:  # a key not verified before waits for the budget like any other
        reply = http.get("/v1/ping/")
        assert _code(reply) == (429, "rate_limited") and reply.json()["error"]["type"] == "RateLimitedError"
    with served.http(alice) as http:
        assert http.get("/v1/ping/").json()["scopes"]["user_ids"] == ["alice"]
        served.keys.revoke(key.key_id)
        assert _code(http.get("/v1/ping/")) == (401, "unauthenticated")  # revoked: refused, not rate limited
    assert scrypts.calls == 4


def test_an_admin_row_with_lists_is_not_trusted_with_reset() -> None:
    """A row written around :meth:`KeyStore.create` (by hand, or by an older version) that is admin yet bound to a
    user may not reset every tenant's memories."""
    from datetime import UTC, datetime

    from inferscale.errors import PermissionDeniedError
    from inferscale.server.auth import Caller
    from inferscale.server.keys import ApiKey

    now = datetime.now(UTC)
    bound = Caller(ApiKey("0" * 12, "tenant admin", True, ("alice",), None, None, now))
    assert not bound.admin and not bound.unbound
    with pytest.raises(PermissionDeniedError, match="reset needs an admin API key"):
        bound.require_admin("reset")
    assert Caller(ApiKey("1" * 12, "root", True, None, None, None, now)).admin


def test_list_is_oldest_first_and_an_admin_key_may_bind_nothing(tmp_path: Path) -> None:
    store = KeyStore(f"sqlite:///{tmp_path}/keys.db")
    admin, _ = store.create("admin", admin=True)
    scoped, _ = store.create("scoped", user_ids=["a", "b", "a"], run_ids=["r1"])
    assert [k.key_id for k in store.list()] == [admin.key_id, scoped.key_id]
    assert admin.admin and admin.scopes() == {"user_ids": None, "agent_ids": None, "run_ids": None}
    assert scoped.scopes() == {"user_ids": ["a", "b"], "agent_ids": None, "run_ids": ["r1"]}
    store.close()


# ---- the server ------------------------------------------------------------------------------------------------


def test_without_keys_the_server_is_open_and_the_first_key_closes_it_at_once(served: Served) -> None:
    with served.http() as open_http:
        assert open_http.get("/v1/ping/").json() == {
            "status": "ok",
            "admin": True,
            "scopes": {"user_ids": None, "agent_ids": None, "run_ids": None},
        }
        elsewhere = KeyStore(served.keys.url)  # e.g. `inferscale keys create` in another process
        elsewhere.create("alice", user_ids=["alice"])
        elsewhere.close()
        assert _code(open_http.get("/v1/ping/")) == (401, "unauthenticated")


def test_a_missing_unknown_malformed_or_revoked_key_is_401(served: Served) -> None:
    key, secret = served.keys.create("alice", user_ids=["alice"])
    _, other = served.keys.create("bob", user_ids=["bob"])
    forged = f"isk_{key.key_id}_{other.split('_', 2)[2]}"  # a real id with another key's secret
    for credential in (None, "isk_nope", forged):
        with served.http(credential) as http:
            assert _code(http.get("/v1/memories/", params={"user_id": "alice"})) == (401, "unauthenticated")
    with served.http(secret, scheme="Basic") as http:
        assert _code(http.get("/v1/ping/")) == (401, "unauthenticated")
    for scheme in ("Token", "Bearer"):
        with served.http(secret, scheme=scheme) as http:
            assert http.get("/v1/ping/").json() == {
                "status": "ok",
                "admin": False,
                "scopes": {"user_ids": ["alice"], "agent_ids": None, "run_ids": None},
            }
    with served.http(secret) as http:
        assert http.get("/v1/memories/", params={"user_id": "alice"}).status_code == 200
        served.keys.revoke(key.key_id)
        assert _code(http.get("/v1/memories/", params={"user_id": "alice"})) == (401, "unauthenticated")
    with served.http() as http:  # health and the schema need no key
        assert [http.get(p).status_code for p in ("/health", "/openapi.json")] == [200, 200]


def test_a_request_with_two_authorization_headers_is_401_whichever_key_comes_first(served: Served) -> None:
    """A tester's find: ``Token <bob>`` then ``Token <alice>`` was answered with bob's memories."""
    _, bob = served.keys.create("bob", user_ids=["bob"])
    _, alice = served.keys.create("alice", user_ids=["alice"])
    with served.http(bob) as http:
        http.post("/v1/memories/", json={"messages": "Bob likes tea.", "infer": False}).raise_for_status()
        for first, second in ((bob, alice), (alice, bob), (bob, bob)):
            headers = [("Authorization", f"Token {first}"), ("Authorization", f"Token {second}")]
            reply = http.get("/v1/memories/", params={"user_id": "bob"}, headers=httpx.Headers(headers))
            assert _code(reply) == (401, "unauthenticated")
            assert "2 Authorization headers" in reply.json()["error"]["message"]
        assert [m["memory"] for m in http.get("/v1/memories/", params={"user_id": "bob"}).json()["results"]] == [
            "Bob likes tea."
        ]


def test_metrics_need_an_admin_key_on_a_server_with_keys(served: Served) -> None:
    """An adversarial tester's find: /metrics answered anyone, keyless, with every tenant's request and token counts
    and the encoder's backlog, which /v1/encoding/wait/ refuses a bound key."""
    _, admin = served.keys.create("admin", admin=True)
    _, alice = served.keys.create("alice", user_ids=["alice"])
    with served.http() as http:
        assert _code(http.get("/metrics")) == (401, "unauthenticated")
    with served.http(alice) as http:
        assert _code(http.get("/metrics")) == (403, "permission_denied")
        assert "inferscale_kv_encode_pending" not in http.get("/metrics").text
    with served.http(admin) as http:
        page = http.get("/metrics")
        assert page.status_code == 200 and "inferscale_kv_encode_pending" in page.text


def test_reset_needs_an_admin_key(served: Served) -> None:
    _, admin = served.keys.create("admin", admin=True)
    _, alice = served.keys.create("alice", user_ids=["alice"])
    with served.http(alice) as http:
        http.post("/v1/memories/", json={"messages": "I like tea.", "infer": False}).raise_for_status()
        assert _code(http.post("/v1/reset/")) == (403, "permission_denied")
    assert served.row_counts() == (1, 1)
    with served.http(admin) as http:
        assert http.post("/v1/reset/").json() == {"message": "Reset successful."}
    assert served.row_counts() == (0, 0)


def test_waiting_for_the_encoder_needs_an_admin_key(served: Served) -> None:
    """Review: any valid key could ask about the encoder's queue, which holds every tenant's memories."""
    _, admin = served.keys.create("admin", admin=True)
    _, alice = served.keys.create("alice", user_ids=["alice"])
    with served.http(alice) as http:
        assert _code(http.post("/v1/encoding/wait/", json={"timeout": 0})) == (403, "permission_denied")
    with served.http(admin) as http:
        assert http.post("/v1/encoding/wait/", json={"timeout": 0}).json() == {"done": True}


OPEN_PATHS = {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
"""The only paths a keyed server answers without a key."""


def test_every_route_but_health_and_the_docs_needs_a_key(tmp_path: Path) -> None:
    """Every route of the app, every method it answers (HEAD included), both trailing-slash spellings: 401 without a
    key once the store has one. A route added later without the caller dependency fails here."""
    from fastapi.testclient import TestClient
    from mem0_fakes import HashEmbedder, ScriptedGenerator, fake_config

    from inferscale import AsyncMemoryClient
    from inferscale.server.app import create_app
    from inferscale.server.options import ServerOptions

    config = fake_config(tmp_path)
    keys = KeyStore.for_config(config)
    keys.create("alice", user_ids=["alice"])
    client = AsyncMemoryClient(config, embedder=HashEmbedder(), generator=ScriptedGenerator())
    app = create_app(client, keys=keys, options=ServerOptions())
    answered: dict[tuple[str, str], int] = {}
    heads: dict[str, int] = {}
    with TestClient(app) as http:
        for path_template, methods in app_routes(app):
            path = path_template.replace("{memory_id}", "m1")
            for spelling in {path, path.rstrip("/") or "/", f"{path.rstrip('/')}/"}:
                for method in sorted(methods):
                    answered[(method, spelling)] = http.request(method, spelling).status_code
                heads[spelling] = http.head(spelling).status_code
    keys.close()
    refused = {request for request, status in answered.items() if status == 401}
    open_requests = {request for request in answered if request[1].rstrip("/") in OPEN_PATHS}
    assert refused == set(answered) - open_requests, sorted(set(answered) - open_requests - refused)
    assert {m for m, p in refused} == {"GET", "POST", "PUT", "DELETE"}
    # HEAD, where a route does not declare it, is 405 before any handler runs; where it does, it needs the key too
    assert {p: s for p, s in heads.items() if p.rstrip("/") not in OPEN_PATHS and s not in (401, 405)} == {}
    for must in [
        ("POST", "/v1/reset/"),
        ("POST", "/v1/reset"),
        ("GET", "/v1/memories/m1/history"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions/"),
        ("GET", "/v1/ping"),
        ("GET", "/metrics"),
    ]:
        assert must in refused, must
    assert all(answered[("GET", p)] == 200 for p in ("/health", "/openapi.json", "/docs", "/redoc"))
