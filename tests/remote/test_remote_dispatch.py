"""``MemoryClient(host=...)`` and ``AsyncMemoryClient(host=...)`` return the remote clients, which have the local
clients' public methods with the same arguments; arguments that cannot go together are refused."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from mem0_fakes import HashEmbedder, ScriptedGenerator

from inferscale import AsyncMemoryClient, ConfigError, MemoryClient, MemoryConfig
from inferscale.remote import AsyncRemoteMemoryClient, RemoteMemoryClient

HOST = "http://127.0.0.1:8000"
API = ("add", "search", "get", "get_all", "update", "delete", "delete_all", "history", "reset", "chat", "close")
PAIRS = [(MemoryClient, RemoteMemoryClient), (AsyncMemoryClient, AsyncRemoteMemoryClient)]


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
def test_host_makes_a_remote_client(local: Any, remote: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERSCALE_API_KEY", raising=False)
    client = local(host=HOST + "/", api_key="isk_0123456789ab_s")
    assert type(client) is remote
    assert client.host == HOST
    assert client._transport.connection.headers["Authorization"] == "Token isk_0123456789ab_s"
    tuned = local(host=HOST, timeout=5, retries=0)
    assert (tuned._transport.connection.timeout, tuned._transport.connection.retries) == (5.0, 0)
    defaults = local(host=HOST)._transport.connection
    assert (defaults.timeout, defaults.retries, "Authorization" in defaults.headers) == (300.0, 3, False)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
def test_no_host_is_the_local_client(local: Any, remote: Any, tmp_path: Path) -> None:
    config = MemoryConfig(data_dir=str(tmp_path))
    assert type(local(config, host=None)) is local
    assert type(local(config, embedder=HashEmbedder(), api_key=None)) is local
    assert type(local.from_config({"data_dir": str(tmp_path)})) is local


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize(
    "given",
    [
        {"config": {"data_dir": "/tmp/x"}},
        {"engine": object()},
        {"embedder": HashEmbedder()},
        {"generator": ScriptedGenerator()},
    ],
    ids=["config", "engine", "embedder", "generator"],
)
def test_host_with_a_local_argument_is_refused_naming_it(local: Any, remote: Any, given: dict[str, Any]) -> None:
    (name,) = given
    with pytest.raises(ConfigError, match=rf"host='{HOST}' makes a remote client.*so {name} would be ignored"):
        local(host=HOST, **given)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize("given", [{"api_key": "isk_x"}, {"timeout": 5.0}, {"retries": 1}], ids=str)
def test_a_remote_argument_without_host_is_refused_naming_it(local: Any, remote: Any, given: dict[str, Any]) -> None:
    (name,) = given
    with pytest.raises(ConfigError, match=rf"^{name} is for a remote client: pass host="):
        local(**given)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"host": "127.0.0.1:8000"}, "http"),
        ({"host": "ftp://h"}, "http"),
        ({"host": ""}, "http"),
        ({"host": "http://"}, "http"),
        ({"host": HOST, "api_key": 5}, "api_key"),
        ({"host": HOST, "timeout": 0}, "timeout"),
        ({"host": HOST, "timeout": "5"}, "timeout"),
        ({"host": HOST, "timeout": True}, "timeout"),
        ({"host": HOST, "retries": -1}, "retries"),
        ({"host": HOST, "retries": 1.5}, "retries"),
    ],
)
def test_bad_connection_settings_are_config_errors(local: Any, remote: Any, given: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        local(**given)
    options = dict(given)
    host = options.pop("host")
    with pytest.raises(ConfigError, match=match):
        remote(host, **options)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"api_key": "m0-abc", "org_id": "o", "project_id": "p"}, "org_id and project_id are Mem0 platform arguments"),
        ({"host": HOST, "org_id": "o"}, "org_id is a Mem0 platform argument"),
        ({"project_id": "p"}, "project_id is a Mem0 platform argument"),
    ],
)
def test_mem0_platform_arguments_are_config_errors_and_none_passes(
    local: Any, remote: Any, given: dict[str, Any], match: str
) -> None:
    """The failing input of a bug: ``MemoryClient(api_key=..., org_id=..., project_id=...)``, Mem0's platform call,
    raised a ``TypeError`` naming ``ClientCore.__new__``."""
    with pytest.raises(ConfigError, match=match):
        local(**given)
    assert isinstance(local(org_id=None, project_id=None), local)
    assert isinstance(local(host=HOST, org_id=None, project_id=None), remote)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize("name", API)
def test_the_remote_methods_have_the_local_signatures(local: Any, remote: Any, name: str) -> None:
    """Same parameters (names, kinds, defaults, annotations), same result annotation, and a coroutine where the
    local one is; ``chat`` also has the same typed overloads."""
    ours, theirs = getattr(remote, name), getattr(local, name)
    assert inspect.signature(ours) == inspect.signature(theirs)
    assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
def test_the_remote_clients_are_context_managers_like_the_local_ones(local: Any, remote: Any) -> None:
    for method in ("__enter__", "__exit__", "__aenter__", "__aexit__"):
        assert hasattr(remote, method) == hasattr(local, method)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize(
    ("given", "says"),
    [
        (HOST, rf"not a server URL: pass it as host='{HOST}'"),
        ("isk_0123456789ab_secret", r"not an API key: pass the key as api_key=\.\.\. together with host="),
        ("./memory.db", r"not a string \('./memory.db'\); for a server pass host="),
    ],
    ids=["url", "key", "other"],
)
def test_a_string_as_the_first_argument_says_to_pass_host_or_api_key(
    local: Any, remote: Any, given: str, says: str
) -> None:
    """Mem0's platform client takes its API key first: ``MemoryClient("http://...")`` once failed with "dictionary
    update sequence element #0 has length 1"."""
    with pytest.raises(ConfigError, match=says) as refused:
        local(given)
    assert "secret" not in str(refused.value)  # a key is never repeated
    with pytest.raises(ConfigError, match=says):
        local(given, host=HOST)


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=["sync", "async"])
@pytest.mark.parametrize(
    "key", ["isk_0123456789ab_secret\n", " isk_0123456789ab_secret", "isk_0123456789ab_sé", "a\tb"]
)
@pytest.mark.parametrize("from_env", [False, True], ids=["argument", "environment"])
def test_a_key_an_authorization_header_cannot_carry_is_refused_without_showing_it(
    local: Any, remote: Any, key: str, from_env: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failing input of a new user's report: a key read from a file with its newline was sent, httpx refused the
    header, and the error (a ``ServerError`` blaming the server and its timeout) held the whole secret."""
    monkeypatch.setenv("INFERSCALE_API_KEY", key if from_env else "")
    arguments = {} if from_env else {"api_key": key}
    source = r"\$INFERSCALE_API_KEY" if from_env else "api_key"
    for build in (lambda: local(host=HOST, **arguments), lambda: remote(HOST, **arguments)):
        with pytest.raises(ConfigError, match=rf"^{source} holds whitespace, a control or a non-ASCII char") as bad:
            build()
        assert "secret" not in str(bad.value) and "sé" not in str(bad.value)
