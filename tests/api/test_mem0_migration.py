"""The Mem0 quickstart example runs unchanged on InferScale (fakes keep it fast); Mem0-shaped configs map."""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest
from client_adapter import ClientAdapter
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config

from inferscale import Memory, MemoryConfig
from inferscale.config import LLMConfig
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.mem0_config import from_mem0_dict, is_mem0_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "migrate_from_mem0.py"


def load_example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("migrate_from_mem0", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_runs_in_both_call_shapes(tmp_path: Path) -> None:
    source = EXAMPLE.read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert "inferscale" in imported and not any("mem0" in (name or "") for name in imported)
    gen = ScriptedGenerator(
        facts=facts("Dislikes long strategy games", "Loves quick card games"),
        decisions=json.dumps({"memory": []}),
    )
    m = Memory(fake_config(tmp_path), embedder=HashEmbedder(), generator=gen)
    seen = load_example().quickstart(m)
    assert [r["event"] for r in seen["added"]] == ["ADD", "ADD"]
    assert len(seen["v1_search"]) == len(seen["v2_search"]) == 2
    assert [r["id"] for r in seen["v1_search"]] == [r["id"] for r in seen["v2_search"]]
    assert seen["v1_all"] == seen["v2_all"]
    assert [h["event"] for h in seen["history"]] == ["ADD", "UPDATE"]
    assert seen["deleted_all"]["deleted"] == 1
    assert m.get_all(user_id="alice")["results"] == []


def test_mem0_config_shape_maps(tmp_path: Path) -> None:
    config = {
        "llm": {
            "provider": "vllm",
            "config": {"model": "qwen", "vllm_base_url": "http://localhost:8000/v1", "max_tokens": 300},
        },
        "embedder": {"provider": "huggingface", "config": {"model": "/models/minilm"}},
        "vector_store": {"provider": "faiss", "config": {"path": str(tmp_path / "vs"), "collection_name": "c"}},
        "history_db_path": str(tmp_path / "h.db"),
        "version": "v1.1",
        "data_dir": str(tmp_path),
    }
    assert is_mem0_config(config)
    mapped = from_mem0_dict(config)
    assert mapped.llm.provider == "openai" and mapped.llm.base_url == "http://localhost:8000/v1"
    assert mapped.llm.model == "qwen" and mapped.llm.max_new_tokens == 300
    assert mapped.embedder.model == "/models/minilm"
    assert mapped.index_path == str(tmp_path / "vs" / "c.faiss")
    assert mapped.db_url == f"sqlite:///{tmp_path / 'vs' / 'c.db'}"  # the collection's own (history_db_path: below)
    client = Memory.from_config(config)
    assert client.config == mapped
    local = from_mem0_dict({"llm": {"provider": "huggingface", "config": {"model": "/m/smol"}}})
    assert local.llm.provider == "engine" and local.engine.model == "/m/smol"
    pg = from_mem0_dict(
        {"vector_store": {"provider": "pgvector", "config": {"connection_string": "postgresql://u@h/d"}}}
    )
    assert pg.db_url == "postgresql+psycopg://u@h/d"
    assert isinstance(Memory.from_config({"data_dir": str(tmp_path)}).config, MemoryConfig)


@pytest.mark.parametrize(
    "bad",
    [
        {"llm": {"provider": "anthropic", "config": {"model": "x"}}},
        {"embedder": {"provider": "openai", "config": {}}},
        {"vector_store": {"provider": "qdrant", "config": {}}},
        {"graph_store": {"provider": "neo4j"}},
        {"llm": {"provider": "vllm", "config": {}}},  # no model (without a URL it takes vLLM's default one)
        {"llm": {"provider": "openai", "config": {}}},
    ],
)
def test_unsupported_mem0_config_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Memory.from_config(bad)


def test_pgvectors_usual_config_names_the_database_it_gives(caplog: pytest.LogCaptureFixture) -> None:
    """Mem0's usual pgvector config (user, password, host, port, dbname) used to be dropped without a word, and the
    memories went to a local SQLite file; it now gives the PostgreSQL URL, and a config that names no database is
    refused rather than replaced by SQLite."""
    given = {"user": "postgres", "password": "p@ss:w/rd", "host": "127.0.0.1", "port": 5432, "dbname": "newuser2"}
    pg = from_mem0_dict({"vector_store": {"provider": "pgvector", "config": given}})
    assert pg.db_url == "postgresql+psycopg://postgres:p%40ss%3Aw%2Frd@127.0.0.1:5432/newuser2"
    with_ssl = {"user": "u", "host": "db", "sslmode": "require", "hnsw": True, "collection_name": "mem0"}
    with caplog.at_level(logging.WARNING, logger="inferscale.mem0_config"):
        assert from_mem0_dict({"vector_store": {"provider": "pgvector", "config": with_ssl}}).db_url == (
            "postgresql+psycopg://u@db/postgres?sslmode=require"
        )
    assert "['hnsw'] have no effect" in caplog.text
    heroku = {"connection_string": "postgres://u:p@h:5433/d"}
    assert from_mem0_dict({"vector_store": {"provider": "pgvector", "config": heroku}}).db_url == (
        "postgresql+psycopg://u:p@h:5433/d"
    )
    with pytest.raises(ConfigError, match="will not fall back to a local SQLite file"):
        from_mem0_dict({"vector_store": {"provider": "pgvector", "config": {"dbname": "d"}}})


@pytest.mark.parametrize(
    ("connection_string", "url"),
    [
        ("postgresql://u:p@h:5433/d", "postgresql+psycopg://u:p@h:5433/d?sslmode=verify-full"),
        (
            "postgres://u@h/d?sslmode=disable&connect_timeout=5",
            "postgresql+psycopg://u@h/d?connect_timeout=5&sslmode=verify-full",
        ),
        (
            "host=h port=5433 dbname=d user=u password=p",
            "postgresql+psycopg://?dbname=d&host=h&password=p&port=5433&sslmode=verify-full&user=u",
        ),
        (
            "host=h dbname=d sslmode=disable application_name=app",
            "postgresql+psycopg://?application_name=app&dbname=d&host=h&sslmode=verify-full",
        ),
        # a socket folder as host, and a password without a user (with "://" in it): libpq's, passed on as they are
        (
            "host=/var/run/postgresql dbname=app user=u",
            "postgresql+psycopg://?dbname=app&host=%2Fvar%2Frun%2Fpostgresql&sslmode=verify-full&user=u",
        ),
        ("password=a://b host=h", "postgresql+psycopg://?host=h&password=a%3A%2F%2Fb&sslmode=verify-full"),
    ],
    ids=["url", "url-with-sslmode", "keywords", "keywords-with-sslmode", "socket", "password-alone"],
)
def test_pgvectors_sslmode_applies_to_its_connection_string(connection_string: str, url: str) -> None:
    """Mem0 adds sslmode to the connection string, replacing the string's own; it was dropped without a word, and
    the connection was made with weaker TLS than asked for. libpq's key=value form, which Mem0 also takes, failed
    at first use as "not a SQLAlchemy URL" (a helper's finds)."""
    given = {"connection_string": connection_string, "sslmode": "verify-full"}
    assert from_mem0_dict({"vector_store": {"provider": "pgvector", "config": given}}).db_url == url
    alone = from_mem0_dict(
        {"vector_store": {"provider": "pgvector", "config": {"connection_string": connection_string}}}
    )
    assert ("sslmode=disable" in str(alone.db_url)) == ("sslmode=disable" in connection_string)  # its own kept
    with pytest.raises(ConfigError, match="not a URL nor libpq's key=value words"):
        from_mem0_dict({"vector_store": {"provider": "pgvector", "config": {"connection_string": "host=h dbname"}}})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"vector_store": {"config": {"host": "db"}}}, "provider None is not supported; use 'faiss' or 'pgvector'"),
        (
            {"vector_store": {"provider": "pgvector", "config": {"host": "db", "collection_name": "app2"}}},
            "collection_name 'app2': InferScale keeps one set of tables per database",
        ),
        ({"vector_store": {"provider": "pgvector", "config": {"host": "db", "port": "x"}}}, "wrong type"),
        ({"vector_store": {"provider": "pgvector", "config": {"host": 5}}}, "wrong type"),
        # a local provider takes no endpoint: it ran the local engine and dropped the URL
        ({"llm": {"provider": "huggingface", "config": {"base_url": "http://tgi:8080"}}}, r"\['base_url'\] are not"),
        # Mem0 reads a section without a provider as OpenAI: it ran the local engine with model "gpt-4o-mini"
        ({"llm": {"config": {"model": "gpt-4o-mini"}}}, "'llm' section has a config but no provider"),
        ({"llm": {"provider": None, "config": {"max_tokens": 300}}}, "which Mem0 reads as 'openai'"),
        ({"embedder": {"config": {"model": "text-embedding-3-small"}}}, "'embedder' section has a config but no"),
    ],
)
def test_mem0_configs_that_would_lose_a_setting_are_refused(config: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mem0_dict(config)


def test_mem0_config_settings_that_another_one_overrides(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A db_url beside pgvector wins (it was refused when pgvector named no host); history_db_path beside a
    database URL is unused, and a warning says so; a key set to None, as a dumped Mem0 config holds, sets nothing;
    Mem0's deepseek and xai base-URL keys are read."""
    both = {"db_url": "sqlite:///x.db", "vector_store": {"provider": "pgvector", "config": {"collection_name": "mem0"}}}
    assert from_mem0_dict(both).db_url == "sqlite:///x.db"
    with caplog.at_level(logging.WARNING, logger="inferscale.mem0_config"):
        pg = {"provider": "pgvector", "config": {"host": "db", "models": None}}
        assert from_mem0_dict({"vector_store": pg, "history_db_path": str(tmp_path / "h.db")}).db_url == (
            "postgresql+psycopg://db/postgres"
        )
    assert "history_db_path has no effect" in caplog.text
    for key, provider in (("deepseek_base_url", "deepseek"), ("xai_base_url", "xai")):
        llm = {"provider": provider, "config": {"model": "m", key: "http://127.0.0.1:9/v1"}}
        assert from_mem0_dict({"llm": llm}).llm.base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize("key", ["api_key", "max_tokens", "openai_base_url"])
def test_a_read_mem0_key_set_to_none_sets_nothing(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_tokens: None`` became ``max_new_tokens=None`` and failed validation; every optional key read is checked
    (``model`` is required: ``None`` is refused, see test_unsupported_mem0_config_is_refused)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    given = {"model": "m", "api_key": "k", "max_tokens": 300, "openai_base_url": "http://127.0.0.1:9/v1"}
    mapped = from_mem0_dict({"llm": {"provider": "openai", "config": {**given, key: None}}}).llm
    expected = {"api_key": "k", "max_new_tokens": 300, "base_url": "http://127.0.0.1:9/v1"}
    defaults = {"api_key": None, "max_new_tokens": LLMConfig().max_new_tokens, "base_url": "https://api.openai.com/v1"}
    field = {"max_tokens": "max_new_tokens", "openai_base_url": "base_url"}.get(key, key)
    assert getattr(mapped, field) == defaults[field]
    assert all(getattr(mapped, f) == v for f, v in expected.items() if f != field)


def test_mem0s_api_key_variable_is_read_when_the_config_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mem0 reads OPENAI_API_KEY (DEEPSEEK_API_KEY, ...) when the config has no api_key: the translation sent no key."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-from-env")
    assert from_mem0_dict({"llm": {"provider": "openai", "config": {"model": "m"}}}).llm.api_key == "sk-from-env"
    given = {"provider": "openai", "config": {"model": "m", "api_key": "k"}}
    assert from_mem0_dict({"llm": given}).llm.api_key == "k"
    deepseek = {"provider": "deepseek", "config": {"model": "m", "deepseek_base_url": "http://127.0.0.1:9/v1"}}
    assert from_mem0_dict({"llm": deepseek}).llm.api_key == "ds-from-env"
    vllm = {"provider": "vllm", "config": {"model": "m", "vllm_base_url": "http://127.0.0.1:9/v1"}}
    assert from_mem0_dict({"llm": vllm}).llm.api_key is None  # a local server: no variable, no key


@pytest.mark.parametrize(
    "config",
    [{"vector_store": {}}, {"vector_store": {"config": {}}}, {"version": "v1.1", 1: 2}],
    ids=["empty vector_store", "vector_store without provider", "a key that is not a string"],
)
def test_more_mem0_configs_are_refused_with_a_config_error(config: dict[object, object]) -> None:
    """An empty vector_store passed (Mem0 would use qdrant); a non-string key raised a plain TypeError."""
    with pytest.raises(ConfigError):
        from_mem0_dict(config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("vector_store", {"provider": "pgvector", "config": {"host": "h", "bogus_key": 1}}),
        ("vector_store", {"provider": "faiss", "config": {"path": "/tmp/x", "bogus": 1}}),
        ("llm", {"provider": "openai", "config": {"model": "m", "bogus": 1}}),
        ("embedder", {"provider": "huggingface", "config": {"huggingface_base_url": "http://tei:8080"}}),
    ],
)
def test_a_mem0_provider_key_inferscale_does_not_read_is_refused(section: str, key: dict[str, object]) -> None:
    """Every key inside a Mem0 section was dropped without a word: one InferScale cannot honour is refused now."""
    with pytest.raises(ConfigError, match="are not supported by InferScale; it reads"):
        from_mem0_dict({section: key})


def test_inert_mem0_keys_are_accepted_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = {
        "llm": {"provider": "openai", "config": {"model": "m", "temperature": 0.1, "top_p": None}},
        "embedder": {"provider": "huggingface", "config": {"embedding_dims": 384}},
        "vector_store": {"provider": "faiss", "config": {"distance_strategy": "cosine"}},
    }
    with caplog.at_level(logging.WARNING, logger="inferscale.mem0_config"):
        from_mem0_dict(config)
    warned = [r.getMessage() for r in caplog.records]
    assert [m.split(" have no effect")[0] for m in warned] == [
        "Mem0 llm config keys ['temperature']",  # top_p=None sets nothing
        "Mem0 embedder config keys ['embedding_dims']",
        "Mem0 faiss config keys ['distance_strategy']",
    ]


def test_extraction_endpoint_config_builds_an_http_generator(tmp_path: Path) -> None:
    m = Memory.from_config(
        {
            "llm": {"provider": "openai", "config": {"model": "m", "openai_base_url": "http://127.0.0.1:9/v1"}},
            "data_dir": str(tmp_path),
        }
    )
    from inferscale.memory import OpenAIJSONGenerator

    generator = m._json_generator()
    assert isinstance(generator, OpenAIJSONGenerator) and generator.url == "http://127.0.0.1:9/v1/chat/completions"
    m.close()


def test_unused_scripted_generator_is_harmless() -> None:
    assert ScriptedGenerator().titles() == []


@pytest.mark.parametrize(
    ("call", "kwargs", "match"),
    [
        ("add", {"timestamp": 1_700_000_000}, "timestamped when it is added"),
        ("add", {"expiration_date": "2027-01-01"}, "do not expire"),
        ("update", {"expiration_date": "2027-01-01"}, "do not expire"),
        ("search", {"rerank": True}, "no reranker"),
        ("search", {"explain": True}, "no explanation"),
        ("search", {"reference_date": "2026-11-30"}, "no date to judge expiry"),
    ],
)
def test_mem0_2x_arguments_are_refused_when_set_and_accepted_at_their_defaults(
    m: ClientAdapter, call: str, kwargs: dict[str, Any], match: str
) -> None:
    m.add("I like tea", user_id="u", infer=False, timestamp=None, expiration_date=None)
    m.add("I like rooibos tea", user_id="u", infer=False, timestamp=False, expiration_date=False)  # neutral too
    stored = ["I like rooibos tea", "I like tea"]
    defaults = {"rerank": False, "explain": False, "reference_date": None, "show_expired": True}
    assert sorted(r["memory"] for r in m.search("tea", user_id="u", **defaults)["results"]) == stored
    neutral = {"rerank": None, "explain": None, "reference_date": False}
    assert sorted(r["memory"] for r in m.search("tea", user_id="u", **neutral)["results"]) == stored
    tea = next(r["id"] for r in m.get_all(user_id="u")["results"] if r["memory"] == "I like tea")
    m.update(tea, "I like tea", expiration_date=None)  # Mem0's default: the update goes through
    with pytest.raises(InvalidInputError, match=match):
        if call == "add":
            m.add("I like coffee", user_id="u", infer=False, **kwargs)
        elif call == "update":
            m.update(tea, "I like green tea", **kwargs)
        else:
            m.search("tea", user_id="u", **kwargs)
    assert sorted(r["memory"] for r in m.get_all(user_id="u")["results"]) == stored
    assert m.get_all(user_id="u", show_expired=True) == m.get_all(user_id="u", show_expired=False)  # nothing expires
    with pytest.raises(InvalidInputError, match="show_expired must be True or False"):
        m.get_all(user_id="u", show_expired="yes")


def test_delete_all_takes_the_ids_positionally_as_mem0s(m: ClientAdapter) -> None:
    """Mem0's delete_all(user_id=None, agent_id=None, run_id=None) takes them by position too; ours were keyword-only
    (a TypeError for Mem0 code calling delete_all("u9"), a helper's find)."""
    m.add("I like tea", user_id="u9", infer=False)
    m.add("I like tea", user_id="u8", infer=False)
    m.add("I run", user_id="u9", agent_id="coach", infer=False)
    assert m.delete_all("u9", "coach")["deleted"] == 1
    assert m.delete_all("u9")["deleted"] == 1
    assert [r["memory"] for r in m.get_all(user_id="u8")["results"]] == ["I like tea"]


def test_output_format_v1_1_is_the_shape_returned_and_other_formats_are_refused(m: ClientAdapter) -> None:
    added = m.add("I like tea", user_id="u", infer=False, output_format="v1.1")
    assert [r["memory"] for r in added["results"]] == ["I like tea"]
    assert [r["memory"] for r in m.search("tea", user_id="u", output_format="v1.1")["results"]] == ["I like tea"]
    assert [r["memory"] for r in m.get_all(user_id="u", output_format="v1.1")["results"]] == ["I like tea"]
    for call in (
        lambda: m.add("I like coffee", user_id="u", infer=False, output_format="v1.0"),
        lambda: m.search("tea", user_id="u", output_format="v1.0"),
        lambda: m.get_all(user_id="u", output_format="v2"),
    ):
        with pytest.raises(InvalidInputError, match="output_format"):
            call()
    assert [r["memory"] for r in m.get_all(user_id="u")["results"]] == ["I like tea"]


def test_an_int_scope_id_is_its_decimal_string_as_in_mem0(m: ClientAdapter) -> None:
    """Apps keyed by a database's integer keys call ``add(..., user_id=42)``; Mem0 2.2.1 takes 42 as "42", and
    InferScale refused it with a ScopeError on every call. An int id is now its string, in arguments and in
    filters alike, on every client (the remote ones send the string)."""
    added = m.get(m.add("I like tea", user_id=42, agent_id=7, infer=False)["results"][0]["id"])
    assert added is not None and (added["user_id"], added["agent_id"]) == ("42", "7")
    m.add("I like coffee", user_id=420, infer=False)
    assert [r["memory"] for r in m.get_all(user_id="42")["results"]] == ["I like tea"]
    assert [r["memory"] for r in m.search("tea", user_id=42)["results"]] == ["I like tea"]
    assert [r["memory"] for r in m.search("tea", filters={"user_id": 42, "agent_id": 7})["results"]] == ["I like tea"]
    assert [r["memory"] for r in m.get_all(filters={"user_id": {"in": [42, 43]}, "agent_id": 7})["results"]] == [
        "I like tea"
    ]
    for both in ({"user_id": 42, "filters": {"user_id": 42}}, {"user_id": "42", "filters": {"user_id": 42}}):
        assert [r["memory"] for r in m.get_all(**both)["results"]] == ["I like tea"]  # keyword and filter agree
        assert [r["memory"] for r in m.search("tea", **both)["results"]] == ["I like tea"]
    for huge in ({"user_id": 10**300}, {"filters": {"user_id": 10**5000}}):  # str() of the second: a bare ValueError
        with pytest.raises(InvalidInputError, match="an integer of over 255 digits"):
            m.get_all(**huge)
    m.delete_all(user_id=42)
    assert m.get_all(user_id=42)["results"] == []
    assert [r["memory"] for r in m.get_all(user_id=420)["results"]] == ["I like coffee"]


def _faiss(path: Path, collection: str | None = None) -> dict[str, object]:
    cfg: dict[str, object] = {"path": str(path)}
    if collection is not None:
        cfg["collection_name"] = collection
    return {
        "vector_store": {"provider": "faiss", "config": cfg},
        "data_dir": str(path.parent / "home"),
        "kv": {"encode_on_add": False},  # no model: the stores are the point
    }


def test_each_faiss_collection_and_path_is_a_store_of_its_own(tmp_path: Path) -> None:
    """Mem0 keeps a collection's memories in its faiss files; every faiss config shared the default database, so
    another collection (or path) saw the memories, and its reset() or delete_all() emptied them."""
    work, personal, other = (
        from_mem0_dict(_faiss(tmp_path / "vs", "work")),
        from_mem0_dict(_faiss(tmp_path / "vs", "personal")),
        from_mem0_dict(_faiss(tmp_path / "app2")),
    )
    assert work.db_url == f"sqlite:///{tmp_path / 'vs' / 'work.db'}"
    assert other.db_url == f"sqlite:///{tmp_path / 'app2' / 'mem0.db'}"
    with Memory(work, embedder=HashEmbedder()) as client:
        client.add("Quarterly report is due Friday.", user_id="alice", infer=False)
    for config in (personal, other):
        with Memory(config, embedder=HashEmbedder()) as client:
            assert client.get_all(user_id="alice")["results"] == []
            assert client.delete_all(user_id="alice")["deleted"] == 0
            client.reset()
    with Memory(work, embedder=HashEmbedder()) as client:
        assert [r["memory"] for r in client.get_all(user_id="alice")["results"]] == ["Quarterly report is due Friday."]
    with pytest.raises(ConfigError, match="plain file name"):
        from_mem0_dict(_faiss(tmp_path / "vs", "../escape"))


def test_faiss_collections_naming_one_history_db_path_are_stores_of_their_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Mem0's history_db_path holds the change history alone, and every collection of an app may name the same one:
    it was the collections' one database, so "books" saw what "movies" stored, and books.reset() emptied movies (a
    helper's find). Mem0's own file is not written to either."""
    history = tmp_path / "history.db"
    with closing(sqlite3.connect(history)) as mem0s:  # the table Mem0 keeps there
        mem0s.execute("create table history (id text primary key, memory_id text, event text)")
        mem0s.commit()
    shared = {"history_db_path": str(history)}
    movies = from_mem0_dict({**_faiss(tmp_path / "faiss", "movies"), **shared})
    books = from_mem0_dict({**_faiss(tmp_path / "faiss", "books"), **shared})
    assert movies.db_url == f"sqlite:///{tmp_path / 'faiss' / 'movies.db'}"
    assert "history_db_path has no effect beside a faiss path" in caplog.text
    with Memory(movies, embedder=HashEmbedder()) as client:
        client.add("I love Inception.", user_id="alice", infer=False)
    with Memory(books, embedder=HashEmbedder()) as client:
        assert client.get_all(user_id="alice")["results"] == []
        client.reset()
    with Memory(movies, embedder=HashEmbedder()) as client:
        assert [r["memory"] for r in client.get_all(user_id="alice")["results"]] == ["I love Inception."]
    with closing(sqlite3.connect(history)) as mem0s:
        assert [row[0] for row in mem0s.execute("select name from sqlite_master where type='table'")] == ["history"]
    with pytest.raises(ConfigError, match=r"collection_name 'books' without a path.*or set db_url"):
        from_mem0_dict({"vector_store": {"provider": "faiss", "config": {"collection_name": "books"}}})
    assert from_mem0_dict({"vector_store": {"provider": "faiss", "config": {"collection_name": "mem0"}}}).db_url is None


def test_a_history_db_path_holding_an_earlier_versions_memories_stays_their_database(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before collections got their own database, history_db_path beside a faiss path was the database: a collection
    stored so keeps it (with a warning), or its memories would vanish from sight; a collection new since then gets
    its own, or it would see the old one's memories (a review's find)."""
    history = tmp_path / "h.db"
    earlier = MemoryConfig(
        db_url=f"sqlite:///{history}", index_path=str(tmp_path / "vs" / "movies.faiss"), kv={"encode_on_add": False}
    )
    with Memory(earlier, embedder=HashEmbedder()) as client:  # as an earlier version mapped movies' config
        client.add("Alice loves Inception.", user_id="alice", infer=False)
    movies = from_mem0_dict({**_faiss(tmp_path / "vs", "movies"), "history_db_path": str(history)})
    assert movies.db_url == f"sqlite:///{history}"
    assert "holds memories, as an earlier version kept them" in caplog.text
    books = from_mem0_dict({**_faiss(tmp_path / "vs", "books"), "history_db_path": str(history)})
    assert books.db_url == f"sqlite:///{tmp_path / 'vs' / 'books.db'}"
    with Memory(books, embedder=HashEmbedder()) as client:
        assert client.get_all(user_id="alice")["results"] == []
        client.reset()
    with Memory(movies, embedder=HashEmbedder()) as client:
        assert [r["memory"] for r in client.get_all(user_id="alice")["results"]] == ["Alice loves Inception."]
    kept = from_mem0_dict(
        {"vector_store": {"provider": "faiss", "config": {"collection_name": "books"}}, "db_url": "sqlite:///x.db"}
    )
    assert kept.db_url == "sqlite:///x.db"  # a collection without a path keeps the database it is told


@pytest.mark.parametrize("docstore", ["mem0.json", "mem0.pkl"])
def test_a_folder_holding_mem0s_own_faiss_store_is_refused_and_left_alone(tmp_path: Path, docstore: str) -> None:
    """InferScale's index cannot share Mem0's file: opened on Mem0's folder, get_all() answered [] without a word,
    and the first add advised deleting Mem0's index (a helper's find). The refusal names the import that moves the
    memories over."""
    folder = tmp_path / "faiss"
    folder.mkdir()
    index = faiss.IndexFlatL2(8)  # what Mem0 writes, beside its docstore
    index.add(np.ones((1, 8), dtype=np.float32))
    faiss.write_index(index, str(folder / "mem0.faiss"))
    (folder / docstore).write_bytes(b"{}")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(ConfigError, match=r"holds Mem0's faiss store of collection 'mem0'.*another path") as refused:
        from_mem0_dict(_faiss(folder))
    assert f"inferscale import-mem0 {folder} --collection mem0" in str(refused.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert from_mem0_dict(_faiss(folder, "other")).db_url == f"sqlite:///{folder / 'other.db'}"  # another collection


def test_a_faiss_folder_of_an_earlier_version_keeps_its_database(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "vs").mkdir()
    (tmp_path / "vs" / "mem0.faiss").write_bytes(b"")  # the index only: its memories are in the default database
    legacy = from_mem0_dict(_faiss(tmp_path / "vs"))
    assert legacy.db_url is None and legacy.index_path == str(tmp_path / "vs" / "mem0.faiss")
    assert "written by an earlier version" in caplog.text
    explicit = from_mem0_dict({**_faiss(tmp_path / "new"), "db_url": "sqlite:///" + str(tmp_path / "mine.db")})
    assert explicit.db_url == f"sqlite:///{tmp_path / 'mine.db'}"


def test_folders_whose_names_look_like_url_syntax_hold_their_database(tmp_path: Path) -> None:
    """``f"sqlite:///{path}"`` read ``%41`` as ``A`` and ``?...`` as query options: the database went elsewhere,
    and a Mem0 faiss store opened again looked like an earlier version's and lost sight of its memories."""
    odd = tmp_path / "p%41th?x=1#y"
    for config in (
        from_mem0_dict(_faiss(odd)),
        from_mem0_dict({"history_db_path": str(odd / "mem0.db"), "kv": {"encode_on_add": False}}),
        MemoryConfig(data_dir=str(odd), kv={"encode_on_add": False}),
    ):
        with Memory(config, embedder=HashEmbedder()) as client:
            client.reset()
            client.add("I keep bees.", user_id="alice", infer=False)
        with Memory(config, embedder=HashEmbedder()) as client:  # opened again: the same store
            assert [r["memory"] for r in client.get_all(user_id="alice")["results"]] == ["I keep bees."]
        database = odd / ("memory.db" if config.db_url is None else "mem0.db")
        assert database.is_file() and database.with_suffix(".faiss").is_file()
    assert not (tmp_path / "pAth").exists()


@pytest.mark.parametrize(
    ("provider", "base_url"),
    [
        ("groq", "https://api.groq.com/openai/v1"),
        ("together", "https://api.together.xyz/v1"),
        ("vllm", "http://localhost:8000/v1"),
        ("lmstudio", "http://localhost:1234/v1"),
        ("deepseek", "https://api.deepseek.com"),
        ("openai", "https://api.openai.com/v1"),
    ],
)
def test_a_provider_config_without_a_url_uses_the_providers_endpoint(
    provider: str, base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid Mem0 configs of these providers name no URL (groq and together have no URL key at all): every one was
    refused with "needs a base URL"."""
    for variable in ("VLLM_BASE_URL", "DEEPSEEK_API_BASE", "OPENAI_BASE_URL", "OLLAMA_HOST", "XAI_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    mapped = from_mem0_dict({"llm": {"provider": provider, "config": {"model": "m", "api_key": "k"}}})
    assert (mapped.llm.provider, mapped.llm.base_url, mapped.llm.model) == ("openai", base_url, "m")
    for variable in ("OPENAI_BASE_URL", "OLLAMA_HOST", "XAI_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("VLLM_BASE_URL", "http://gpu-box:9000/v1")  # read first, as Mem0 reads it
    assert (
        from_mem0_dict({"llm": {"provider": "vllm", "config": {"model": "m"}}}).llm.base_url == "http://gpu-box:9000/v1"
    )


def test_the_providers_environment_variables_are_read_as_mem0_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """An app behind an OpenAI proxy sets OPENAI_BASE_URL: its key went to api.openai.com instead."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://proxy:8080/v1")
    monkeypatch.setenv("XAI_API_BASE", "http://xai-proxy/v1")
    monkeypatch.setenv("OLLAMA_HOST", "ollama-box:11434")  # host:port, as the ollama client takes it
    for provider, base_url in (
        ("openai", "http://proxy:8080/v1"),
        ("xai", "http://xai-proxy/v1"),
        ("ollama", "http://ollama-box:11434"),
    ):
        assert from_mem0_dict({"llm": {"provider": provider, "config": {"model": "m"}}}).llm.base_url == base_url
