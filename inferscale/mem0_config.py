"""Config dicts: a dict of :class:`~inferscale.config.MemoryConfig` fields, Mem0's config shape, or both side by
side, read into a :class:`~inferscale.config.MemoryConfig` (:func:`config_from_dict`).

Mem0's sections (``llm``, ``embedder``, ``vector_store``) are translated key by key: each provider config key is
either read, accepted as inert (a warning names it and says why it has no effect here), or refused with a
:class:`~inferscale.errors.ConfigError`, so that no setting is dropped without a word.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ValidationError
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from inferscale.config import EmbedderConfig, EngineConfig, KVConfig, LLMConfig, MemoryConfig, sqlite_url
from inferscale.errors import ConfigError
from inferscale.json_text import loads_json
from inferscale.validation_text import describe_errors

log = logging.getLogger(__name__)

MEM0_KEYS: frozenset[str] = frozenset(
    {
        "llm",
        "embedder",
        "vector_store",
        "history_db_path",
        "version",
        "graph_store",
        "custom_fact_extraction_prompt",
        "custom_update_memory_prompt",
        "custom_instructions",
        "reranker",
    }
)
"""Top-level keys of Mem0's config. ``llm`` and ``embedder`` are :class:`MemoryConfig` fields too: their own
fields tell the two shapes apart (:func:`section_shape`); the others mark a dict as Mem0's."""

_MEM0_ONLY_KEYS = MEM0_KEYS - {"llm", "embedder"}
_MEM0_SECTION_KEYS = frozenset({"provider", "config"})
_SECTIONS: dict[str, type[BaseModel]] = {"llm": LLMConfig, "embedder": EmbedderConfig}
_LLM_PROVIDERS: tuple[str, ...] = get_args(LLMConfig.model_fields["provider"].annotation)
_SECTION_NAMES: tuple[Literal["llm", "embedder"], ...] = ("llm", "embedder")
ConfigShape = Literal["inferscale", "mem0"]
DEFAULT_COLLECTION = "mem0"
"""Mem0's default ``collection_name``."""

_OPENAI_COMPATIBLE = frozenset({"openai", "vllm", "lmstudio", "ollama", "deepseek", "together", "groq", "xai"})
_LOCAL_LLM = frozenset({"inferscale", "engine", "huggingface", "transformers"})
_BASE_URL_KEYS = (
    "base_url",
    "openai_base_url",
    "vllm_base_url",
    "lmstudio_base_url",
    "ollama_base_url",
    "deepseek_base_url",
    "xai_base_url",
)
_DEFAULT_BASE_URLS: dict[str, tuple[str | None, str]] = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "vllm": ("VLLM_BASE_URL", "http://localhost:8000/v1"),
    "lmstudio": (None, "http://localhost:1234/v1"),
    "ollama": ("OLLAMA_HOST", "http://localhost:11434"),
    "deepseek": ("DEEPSEEK_API_BASE", "https://api.deepseek.com"),
    "together": (None, "https://api.together.xyz/v1"),
    "groq": (None, "https://api.groq.com/openai/v1"),
    "xai": ("XAI_API_BASE", "https://api.x.ai/v1"),
}
"""Where each Mem0 LLM provider's client sends requests when its config names no base URL: the environment variable
Mem0 reads first (if any), then its default (Mem0's own, or the provider's OpenAI-compatible endpoint for providers
whose Mem0 client uses the provider's SDK: Groq, Together, xAI). A valid Mem0 config of those providers names no
URL at all."""

_PGVECTOR_URL_KEYS = ("user", "password", "host", "port", "dbname", "sslmode")
_API_KEY_VARIABLES = {
    "openai": "OPENAI_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "together": "TOGETHER_API_KEY",
    "groq": "GROQ_API_KEY",
    "xai": "XAI_API_KEY",
}
"""The environment variable each Mem0 LLM provider reads its key from when its config gives no ``api_key``."""

_MEM0_READ_KEYS: dict[str, frozenset[str]] = {
    "llm": frozenset({"model", "api_key", "max_tokens", *_BASE_URL_KEYS}),
    "local llm": frozenset({"model", "max_tokens"}),
    "embedder": frozenset({"model"}),
    "faiss": frozenset({"path", "collection_name"}),
    "pgvector": frozenset({"connection_string", "collection_name", *_PGVECTOR_URL_KEYS}),
}
"""The keys of each Mem0 provider config that InferScale translates (``from_mem0_dict``)."""

_LLM_INERT = (
    frozenset({"temperature", "top_p", "top_k", "enable_vision", "vision_details", "http_client_proxies"}),
    "extraction and reconcile decode greedily under a JSON schema, so that the same turns give the same facts",
)
_MEM0_INERT_KEYS: dict[str, tuple[frozenset[str], str]] = {
    "llm": _LLM_INERT,
    "local llm": _LLM_INERT,
    "embedder": (frozenset({"embedding_dims"}), "the dimension is read from the embedding model"),
    "faiss": (
        frozenset({"distance_strategy", "normalize_L2", "embedding_model_dims"}),
        "the index always scores by cosine similarity, at the embedding model's dimension",
    ),
    "pgvector": (
        frozenset({"embedding_model_dims", "diskann", "hnsw", "minconn", "maxconn"}),
        "vectors live in the FAISS index, and the connection pool is SQLAlchemy's",
    ),
}
"""The keys of each Mem0 provider config that are accepted and have no effect (a warning names them), and why."""


def section_shape(name: Literal["llm", "embedder"], value: object) -> ConfigShape | None:
    """The shape the ``llm`` or ``embedder`` section of a config dict is written in, read from its keys.

    - ``"mem0"``: Mem0's ``{"provider": ..., "config": {...}}`` (``config`` may be left out when ``provider`` is
      not a value of our field, e.g. ``{"provider": "huggingface"}``);
    - ``"inferscale"``: an :class:`LLMConfig` / :class:`EmbedderConfig`, or a dict of its fields (``{}`` and
      ``{"provider": "openai"}`` included);
    - ``None``: the section is missing or ``None``.

    Raises:
        ConfigError: for a value that is not a dict, or a dict whose keys fit neither shape; the message names
            the section, the keys that do not fit each shape and the fields each shape takes.
    """
    model = _SECTIONS[name]
    if value is None:
        return None
    if isinstance(value, model):
        return "inferscale"
    fields = set(model.model_fields)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"config[{name!r}] must be a dict: Mem0's {{'provider': ..., 'config': {{...}}}} or {model.__name__} "
            f"fields {sorted(fields)}; got {value!r}"
        )
    keys = {str(k) for k in value}
    if keys <= _MEM0_SECTION_KEYS and ("config" in keys or not _validates(model, value)):
        return "mem0"
    if keys <= fields:
        provider = value.get("provider")
        if name == "llm" and provider is not None and provider not in _LLM_PROVIDERS:
            raise ConfigError(
                f"config['llm'] names provider {provider!r} next to LLMConfig fields {sorted(keys - {'provider'})}: "
                f"LLMConfig's providers are {list(_LLM_PROVIDERS)} ('openai' is any OpenAI-compatible endpoint, "
                f"with base_url and model); Mem0's shape puts the settings under 'config', e.g. "
                f"{{'provider': {provider!r}, 'config': {{'model': ...}}}}"
            )
        return "inferscale"
    raise ConfigError(
        f"config[{name!r}] has keys {sorted(keys)}, which fit neither shape: Mem0's takes only 'provider' and "
        f"'config' (not {sorted(keys - _MEM0_SECTION_KEYS)}), {model.__name__} takes {sorted(fields)} (not "
        f"{sorted(keys - fields)}). Write e.g. {{'provider': 'vllm', 'config': {{'model': ...}}}} or "
        f"{{'provider': 'openai', 'model': ..., 'base_url': ...}}"
    )


def _validates(model: type[BaseModel], value: Mapping[Any, Any]) -> bool:
    try:
        model.model_validate(value)
    except ValidationError:
        return False
    return True


def is_mem0_config(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` needs translating from Mem0's shape: it has a key only Mem0 uses (``"vector_store"``,
    ``"history_db_path"``, ``"version"``, ...) or an ``llm``/``embedder`` section in Mem0's shape
    (:func:`section_shape`). A dict of :class:`MemoryConfig` fields, ``llm`` and ``embedder`` included, is not.

    Raises:
        ConfigError: for an ``llm`` or ``embedder`` section that fits neither shape.
    """
    shapes = [section_shape(name, config.get(name)) for name in _SECTION_NAMES]
    return any(key in _MEM0_ONLY_KEYS for key in config) or "mem0" in shapes


def config_from_dict(config: Mapping[str, Any]) -> MemoryConfig:
    """A :class:`MemoryConfig` from a dict of its fields, from Mem0's shape, or from both side by side: each of
    ``llm`` and ``embedder`` is read in the shape its keys show (:func:`section_shape`), Mem0's other keys are
    translated (:func:`from_mem0_dict`) and the other fields are taken as they are. A dict of fields alone gives
    what ``MemoryConfig(**config)`` gives.

    Raises:
        ConfigError: for a non-dict, a section that fits neither shape (naming it and the keys that do not fit),
            an unsupported Mem0 provider or key, or a value that does not validate.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a MemoryConfig or a dict, got {type(config).__name__}")
    if is_mem0_config(config):
        return from_mem0_dict(config)
    try:
        return MemoryConfig(**config)
    except ValidationError as exc:
        raise ConfigError(f"invalid InferScale config: {describe_errors(exc.errors(), show_input=True)}") from exc
    except (TypeError, ValueError) as exc:  # TypeError: a non-str key
        raise ConfigError(f"invalid InferScale config: {exc}") from exc


def _section(config: Mapping[str, Any], name: str) -> tuple[str | None, dict[str, Any]]:
    raw = config.get(name)
    if raw is None:
        return None, {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name!r} must be a dict like {{'provider': ..., 'config': {{...}}}}, got {raw!r}")
    unknown = set(raw) - {"provider", "config"}
    if unknown:
        raise ConfigError(f"{name!r} has unknown keys {sorted(unknown)}; expected 'provider' and 'config'")
    inner = raw.get("config") or {}
    if not isinstance(inner, Mapping):
        raise ConfigError(f"{name}.config must be a dict, got {inner!r}")
    provider = raw.get("provider")
    return (str(provider).lower() if provider is not None else None), dict(inner)


def _require_provider(name: str, provider: str | None, cfg: Mapping[str, Any], fix: str) -> None:
    """Check that Mem0's ``name`` section, read by :func:`_section` as ``(provider, cfg)``, names its provider when
    it gives a config (``fix`` says which to name).

    Raises:
        ConfigError: when it gives a ``config`` but no ``provider``. Mem0 reads that as its default provider,
            OpenAI: serving it from a local model instead would change the user's model unannounced.
    """
    if provider is None and cfg:
        raise ConfigError(
            f"Mem0's {name!r} section has a config but no provider, which Mem0 reads as 'openai'. Name the provider: "
            f"{fix}"
        )


def _check_mem0_keys(what: str, cfg: Mapping[str, Any]) -> None:
    """Refuse the keys of Mem0's ``what`` provider config that InferScale neither reads nor knows to be inert, and
    warn about inert ones that are set (a key set to ``None``, as a dumped Mem0 config holds many, sets nothing).

    Raises:
        ConfigError: naming the unknown keys and the keys that are read.
    """
    inert, why = _MEM0_INERT_KEYS[what]
    unknown = {key for key, value in cfg.items() if value is not None} - _MEM0_READ_KEYS[what] - inert
    if unknown:
        raise ConfigError(
            f"Mem0 {what} config keys {sorted(unknown)} are not supported by InferScale; it reads "
            f"{sorted(_MEM0_READ_KEYS[what])} (and accepts {sorted(inert)}, which have no effect)"
        )
    if ignored := sorted(key for key in inert if cfg.get(key) is not None):
        log.warning("Mem0 %s config keys %s have no effect in InferScale: %s", what, ignored, why)


def _check_collection(cfg: Mapping[str, Any]) -> None:
    """Raises:
    ConfigError: when Mem0's pgvector ``collection_name`` is not its default (see :func:`_pgvector_url`)."""
    if cfg.get("collection_name") not in (None, DEFAULT_COLLECTION):
        raise ConfigError(
            f"Mem0's pgvector collection_name {cfg['collection_name']!r}: InferScale keeps one set of tables per "
            "database, so collections would share their users' memories. Give each collection its own database "
            f"(dbname, or db_url), and leave collection_name out or {DEFAULT_COLLECTION!r}"
        )


def _pgvector_url(cfg: Mapping[str, Any]) -> str:
    """The SQLAlchemy URL of Mem0's pgvector config: its ``connection_string`` (a ``postgresql://`` or
    ``postgres://`` URL, or libpq's ``key=value`` words, as Mem0 takes it), else one built from ``user``,
    ``password``, ``host``, ``port``, ``dbname`` (Mem0's default ``postgres``), for the psycopg driver; ``sslmode``
    sets (or replaces) the URL's, as Mem0 adds it to a connection string (it was dropped: a helper's find).

    Raises:
        ConfigError: when neither a connection string nor a host is given, a value has the wrong type, a keyword
            string psycopg cannot read, or ``collection_name`` is not Mem0's default: InferScale keeps one set of
            tables per database, so two collections in one database would share their users' memories.
    """
    _check_collection(cfg)
    sslmode = {"sslmode": str(cfg["sslmode"])} if cfg.get("sslmode") else {}
    if cfg.get("connection_string"):
        given = str(cfg["connection_string"])
        if not _URL_SCHEME.match(given):  # libpq's key=value words (a password there may hold "://")
            return _conninfo_url(given, sslmode)
        for scheme in ("postgresql://", "postgres://"):
            if given.startswith(scheme):
                given = "postgresql+psycopg://" + given.removeprefix(scheme)
        try:
            url = make_url(given)
        except ArgumentError as exc:
            raise ConfigError(f"Mem0's pgvector connection_string is not a database URL: {exc}") from exc
        return url.update_query_dict(sslmode).render_as_string(hide_password=False)
    if not cfg.get("host"):
        raise ConfigError(
            "Mem0's pgvector config needs a connection_string, or a host (with user, password, port and dbname): "
            "InferScale will not fall back to a local SQLite file"
        )
    try:
        url = URL.create(
            "postgresql+psycopg",
            username=cfg.get("user"),
            password=cfg.get("password") or None,
            host=cfg["host"],
            port=int(cfg["port"]) if cfg.get("port") is not None else None,
            database=cfg.get("dbname") or "postgres",
            query=sslmode,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Mem0's pgvector config has a value of the wrong type: {exc}") from exc
    return url.render_as_string(hide_password=False)


_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""The start of a URL (its scheme), as opposed to libpq's ``key=value`` connection words."""


def _conninfo_url(conninfo: str, sslmode: Mapping[str, str]) -> str:
    """The psycopg URL of a libpq keyword string (``"host=db dbname=app user=u"``), read by psycopg's own parser, its
    fields carried as the URL's query (``postgresql+psycopg:///?host=db&dbname=app&user=u``); ``sslmode`` wins over
    the string's.

    Raises:
        ConfigError: when psycopg is not installed or cannot read the string.
    """
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError as exc:
        raise ConfigError(
            f"a PostgreSQL connection_string needs psycopg: pip install 'inferscale-memory[postgres]' ({exc})"
        ) from exc
    try:
        fields = {key: str(value) for key, value in conninfo_to_dict(conninfo).items()}
    except ProgrammingError as exc:
        raise ConfigError(f"Mem0's pgvector connection_string is not a URL nor libpq's key=value words: {exc}") from exc
    # Every field as a query key, which the psycopg dialect passes to connect() as it is: a socket folder as host,
    # a password without a user, libpq's own defaults (dbname: the user's name) all stay libpq's.
    url = URL.create("postgresql+psycopg", query={**fields, **sslmode})
    return url.render_as_string(hide_password=False)


def _llm_fields(provider: str | None, cfg: dict[str, Any]) -> dict[str, Any]:
    local = provider is None or provider in _LOCAL_LLM
    _check_mem0_keys("local llm" if local else "llm", cfg)
    out: dict[str, Any] = {}
    if cfg.get("max_tokens") is not None:
        out["max_new_tokens"] = cfg["max_tokens"]
    if local:
        if cfg.get("model"):
            out["engine_model"] = cfg["model"]
        return out
    if provider not in _OPENAI_COMPATIBLE:
        raise ConfigError(
            f"llm provider {provider!r} is not supported; use an OpenAI-compatible one ({sorted(_OPENAI_COMPATIBLE)}) "
            f"with a base URL, or {sorted(_LOCAL_LLM)} for the local engine"
        )
    base_url = next((cfg[k] for k in _BASE_URL_KEYS if cfg.get(k)), None)
    if base_url is None and provider in _DEFAULT_BASE_URLS:
        variable, default = _DEFAULT_BASE_URLS[provider]
        base_url = (os.environ.get(variable) if variable else None) or default
        if "://" not in base_url:  # OLLAMA_HOST may be host:port alone, as the ollama client takes it
            base_url = f"http://{base_url}"
    if base_url is None:
        raise ConfigError(f"llm provider {provider!r} needs a base URL (one of {list(_BASE_URL_KEYS)})")
    if not cfg.get("model"):
        raise ConfigError(f"llm provider {provider!r} needs config.model")
    api_key = cfg.get("api_key") or os.environ.get(_API_KEY_VARIABLES.get(provider, ""))
    out.update(provider="openai", base_url=base_url, api_key=api_key or None, model=cfg["model"])
    return out


def is_file_name(name: object) -> bool:
    """Whether ``name`` is a plain file name (no folder, not ``.`` or ``..``): what a faiss ``collection_name`` must
    be, since it names files in the store's folder."""
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name


def _faiss_store(own: dict[str, Any], cfg: Mapping[str, Any], history_db_path: object) -> None:
    """Set the index file and the database of Mem0's faiss ``path`` and ``collection_name`` in ``own``: the index
    ``<path>/<collection>.faiss`` and, unless ``db_url`` names a database, the SQLite file ``<path>/<collection>.db``.

    Mem0 keeps a collection's memories in its faiss files, so two collections or paths are two stores. They shared
    the default database, and then one ``history_db_path`` (Mem0's file for the change history alone, which every
    collection of an app may name): another collection saw the memories, and ``reset`` of one emptied the other (two
    helpers' finds). Memories and their history live in one database here, so ``history_db_path`` has no effect
    beside a faiss path (a warning says so), and no file of Mem0's is written to. What an earlier version stored is
    kept in sight, with a warning: a ``history_db_path`` that already holds InferScale's memories (and no collection
    database beside the index) stays the database, and so does the default one for a folder holding the index alone.

    Raises:
        ConfigError: for a ``collection_name`` that is not a plain file name, or one other than Mem0's default without
            a ``path`` (every such collection would share the default database); for a folder that holds Mem0's own
            store of the collection (its index and its ``.json`` or ``.pkl`` docstore), which InferScale's index
            cannot share: its lists looked empty, and the first write advised deleting Mem0's index (a helper's
            find). The message names ``inferscale import-mem0``, which moves those memories over.
    """
    name = cfg.get("collection_name") or DEFAULT_COLLECTION
    if not is_file_name(name):
        raise ConfigError(f"Mem0's faiss collection_name must be a plain file name, got {name!r}")
    if not cfg.get("path"):
        if name != DEFAULT_COLLECTION and "db_url" not in own:
            raise ConfigError(
                f"Mem0's faiss collection_name {name!r} without a path: every such collection would share the default "
                "database, and its users' memories. Give it a path (its store is then <path>/<collection>.db), or "
                "set db_url to the default database (InferScale's data_dir/memory.db) to keep what an earlier version "
                "stored there for it"
            )
        return
    folder = Path(str(cfg["path"])).expanduser()
    index, database = folder / f"{name}.faiss", folder / f"{name}.db"
    docstores = [folder / f"{name}{suffix}" for suffix in (".json", ".pkl")]
    if index.exists() and any(docstore.exists() for docstore in docstores):
        raise ConfigError(
            f"{folder} holds Mem0's faiss store of collection {name!r} ({index.name} and its docstore): InferScale's "
            "own index cannot share that file. Give InferScale another path, then move Mem0's memories into it "
            f"with `inferscale import-mem0 {folder} --collection {name}` (or MemoryClient.import_memories with "
            "inferscale.mem0_import.read_mem0_file); Mem0's files are left as they are"
        )
    own.setdefault("index_path", str(index))
    if history_db_path and "db_url" in own:
        log.warning("Mem0's history_db_path has no effect: db_url names the database of memories and their history")
    if "db_url" in own:
        return
    if history_db_path:
        shared = Path(str(history_db_path)).expanduser()
        if index.exists() and not database.exists() and _holds_memories(shared):  # this collection's, stored so
            log.warning(
                "%s holds memories, as an earlier version kept them: it stays the database of collection %r, and of "
                "every faiss collection of that version naming it as history_db_path (a new one gets its own). To "
                "give this one its own, copy it to %s and delete the other collections' memories from the copy",
                shared,
                name,
                database,
            )
            own["db_url"] = sqlite_url(shared)
            return
        log.warning(
            "Mem0's history_db_path has no effect beside a faiss path: %s holds the memories and history", database
        )
    if index.exists() and not database.exists():
        log.warning(
            "%s was written by an earlier version, whose memories live in the default database: it is kept; set "
            "db_url=%r (and move the database file there) to give this collection its own",
            index,
            sqlite_url(database),
        )
        return
    own["db_url"] = sqlite_url(database)


def _holds_memories(path: Path) -> bool:
    """Whether the SQLite file ``path`` exists and has InferScale's ``memories`` table (a Mem0 history file has
    only ``history``); nothing is created."""
    if not path.is_file():
        return False
    engine = create_engine(sqlite_url(path))  # the file exists: reading its schema writes nothing
    try:
        return inspect(engine).has_table("memories")
    except SQLAlchemyError:
        return False  # not a database InferScale can read: not its memories
    finally:
        engine.dispose()


def _with_instructions(llm: Mapping[str, Any] | None, instructions: object) -> dict[str, Any]:
    """The ``llm`` section (ours, or one translated from Mem0's) with Mem0's top-level ``custom_instructions``.

    Raises:
        ConfigError: when the section sets ``custom_instructions`` too.
    """
    section = dict(llm or {})
    if section.get("custom_instructions") is not None:
        raise ConfigError("custom_instructions is given twice, at the top and in llm; keep one")
    section["custom_instructions"] = instructions
    return section


def from_mem0_dict(config: Mapping[str, Any]) -> MemoryConfig:
    """Build a :class:`MemoryConfig` from Mem0's config shape.

    Mapping:
        - ``llm``: providers ``openai``, ``vllm``, ``lmstudio``, ``ollama`` (and other OpenAI-compatible ones) become
          ``llm.provider="openai"`` with ``base_url`` (``openai_base_url``, ``vllm_base_url``, ... or
          ``base_url``), ``api_key`` and ``model``; ``huggingface``/``transformers``/``inferscale`` use the local
          engine, whose model is ``config.model``. ``max_tokens`` becomes ``llm.max_new_tokens``.
        - ``embedder``: ``huggingface`` (sentence-transformers) with ``config.model``; other providers are refused.
        - ``vector_store``: ``faiss`` with ``config.path`` (and ``collection_name``) gives the index file and the
          SQLite database of that collection (:func:`_faiss_store`);
          ``pgvector`` with ``config.connection_string``, or ``user``/``password``/``host``/``port``/``dbname``/
          ``sslmode``, gives the database URL unless ``db_url`` is given too (vectors stay in FAISS; a
          ``collection_name`` other than ``"mem0"`` is refused); no provider, or another, is refused.
        - ``history_db_path`` becomes a SQLite ``db_url`` when no other sets it (else a warning says it is unused).
        - A provider config key InferScale neither reads nor knows to have no effect here is refused; an inert one
          (sampling settings, index tuning, dimensions: ``_MEM0_INERT_KEYS``) is accepted with a warning.
        - ``db_url`` may also be given directly.
        - ``version`` is accepted and ignored (both Mem0 call shapes are always accepted).
        - ``custom_instructions`` (Mem0 2.x's guidance for fact extraction) becomes ``llm.custom_instructions``.
          Mem0 1.x's ``custom_fact_extraction_prompt`` and ``custom_update_memory_prompt``, which replaced its
          prompts whole, are refused: the extraction prompt's worked examples and JSON answer are InferScale's own.
        - Any :class:`MemoryConfig` field (``engine``, ``kv``, ``data_dir``, ...) passes through, and so does an
          ``llm`` or ``embedder`` section written as our fields (:func:`section_shape`).

    Returns:
        The validated config.

    Raises:
        ConfigError: for an unsupported provider or key (``graph_store``, Mem0 1.x's custom prompts, rerankers),
            a section that fits neither shape, ``custom_instructions`` given both at the top and in ``llm``, or a
            result that does not validate.
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a dict, got {type(config).__name__}")
    for key in ("graph_store", "custom_fact_extraction_prompt", "custom_update_memory_prompt", "reranker"):
        if config.get(key):
            raise ConfigError(f"Mem0 config key {key!r} is not supported by InferScale; remove it")
    own = {k: v for k, v in config.items() if k not in MEM0_KEYS}
    for section in _SECTION_NAMES:
        if section_shape(section, config.get(section)) == "inferscale":
            own[section] = config[section]
    mem0 = {k: v for k, v in config.items() if k not in own}
    llm: dict[str, Any] = {}
    engine = dict(own.get("engine") or {})
    llm_provider, llm_cfg = _section(mem0, "llm")
    _require_provider(
        "llm", llm_provider, llm_cfg, "'openai' to keep OpenAI's models, or 'inferscale' for the local engine"
    )
    mapped = _llm_fields(llm_provider, llm_cfg)
    if "engine_model" in mapped:
        engine["model"] = mapped.pop("engine_model")
    llm.update(mapped)
    emb_provider, emb_cfg = _section(mem0, "embedder")
    _require_provider(
        "embedder", emb_provider, emb_cfg, "'huggingface' with a sentence-transformers model (OpenAI's are not served)"
    )
    if emb_provider not in (None, "huggingface", "sentence_transformers", "sentence-transformers", "inferscale"):
        raise ConfigError(
            f"embedder provider {emb_provider!r} is not supported; use 'huggingface' (sentence-transformers)"
        )
    _check_mem0_keys("embedder", emb_cfg)
    embedder: dict[str, Any] = {}
    if emb_cfg.get("model"):
        embedder["model"] = emb_cfg["model"]
    vs_provider, vs_cfg = _section(config, "vector_store")
    if vs_provider == "faiss":
        _check_mem0_keys("faiss", vs_cfg)
        _faiss_store(own, vs_cfg, config.get("history_db_path"))
    elif vs_provider == "pgvector":
        _check_mem0_keys("pgvector", vs_cfg)
        _check_collection(vs_cfg)
        if "db_url" not in own:  # a db_url given beside it wins
            own["db_url"] = _pgvector_url(vs_cfg)
    elif vs_provider is not None or config.get("vector_store") is not None:
        raise ConfigError(
            f"vector_store provider {vs_provider!r} is not supported; use 'faiss' or 'pgvector' (Mem0's default, "
            "qdrant, is not served; `inferscale import-mem0 <its path>` moves a local Qdrant store's memories over)"
        )
    if config.get("history_db_path") and not (vs_provider == "faiss" and vs_cfg.get("path")):  # else: above
        if "db_url" in own:
            log.warning("Mem0's history_db_path has no effect: memories and their history share one database")
        own.setdefault("db_url", sqlite_url(Path(str(config["history_db_path"])).expanduser()))
    if llm:
        own["llm"] = llm
    if config.get("custom_instructions") is not None:
        own["llm"] = _with_instructions(own.get("llm"), config["custom_instructions"])
    if engine:
        own["engine"] = engine
    if embedder:
        own["embedder"] = embedder
    try:
        return MemoryConfig(**own)
    except (TypeError, ValidationError) as exc:  # TypeError: a key that is not a string
        raise ConfigError(f"invalid config after translating the Mem0 shape: {exc}") from exc


def config_from_file(path: str) -> MemoryConfig:
    """The client config in the JSON file ``path`` (``~`` expanded), as :func:`config_from_dict` reads a dict: what
    ``inferscale <command> --config FILE`` and ``inferscale serve --config FILE`` start from.

    Raises:
        ConfigError: when the file cannot be read or is not a JSON object, or as :func:`config_from_dict`.
    """
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as file:
            data = loads_json(file.read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"the config file {path} must hold a JSON object, got {type(data).__name__}")
    return config_from_dict(data)


def config_with_flags(
    config_file: str | None,
    *,
    data_dir: str | None = None,
    db_url: str | None = None,
    engine: Mapping[str, Any] | None = None,
    kv: Mapping[str, Any] | None = None,
    fields: Mapping[str, Any] | None = None,
) -> MemoryConfig:
    """The client config a command or the server runs on: the file ``config_file``'s (:func:`config_from_file`;
    every field at its default without one), with what its flags give over it. Every command and ``inferscale
    serve`` build it here, so that the same file and flags name the same store everywhere.

    Args:
        config_file: the ``--config`` file, or ``None``.
        data_dir: ``--data-dir``: the folder then holds the database, the index and the K/V folder together, the
            file's ``index_path``, ``kv.store_dir`` and SQLite ``db_url`` set aside (``db_url`` still names the
            database). A file's ``db_url`` of a database server (PostgreSQL) is kept: it is in no folder, and the
            command would otherwise write to a new, empty SQLite store without a word (a review's find).
        db_url: ``--db-url``.
        engine, kv, fields: ``EngineConfig``, ``KVConfig`` and other ``MemoryConfig`` fields set over the file's.
            Every entry is applied, a ``None`` value too: leave out the flags that were not given.

    Raises:
        ConfigError: as :func:`config_from_file`, or for a value the configs refuse, naming it.
    """
    settings = {} if config_file is None else config_from_file(config_file).model_dump()
    if data_dir is not None:  # the folder holds all three (db_url, when given, still names the database)
        settings.update(index_path=None, kv={**settings.get("kv", {}), "store_dir": None})
        if _is_sqlite(settings.get("db_url")):
            settings["db_url"] = None
    engine_fields = {**settings.get("engine", {}), **(engine or {})}
    kv_fields = {**settings.get("kv", {}), **(kv or {})}
    flags = {"data_dir": data_dir, "db_url": db_url}
    settings.update({**(fields or {}), **{name: value for name, value in flags.items() if value is not None}})
    try:
        return MemoryConfig.model_validate(
            {**settings, "engine": EngineConfig.model_validate(engine_fields), "kv": KVConfig.model_validate(kv_fields)}
        )
    except ValidationError as exc:
        raise ConfigError(f"invalid options: {describe_errors(exc.errors(), show_input=True)}") from exc
    except ValueError as exc:
        raise ConfigError(f"invalid options: {exc}") from exc


def _is_sqlite(db_url: object) -> bool:
    """Whether ``db_url`` is a SQLite URL (a file, or an in-memory database); ``False`` for ``None``, another
    backend, or a URL SQLAlchemy cannot parse (the store reports that one when it opens)."""
    if not isinstance(db_url, str):
        return False
    try:
        return make_url(db_url).get_backend_name() == "sqlite"
    except ArgumentError:
        return False
