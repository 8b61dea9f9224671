"""Mem0's stored memories, read for an import into InferScale (:meth:`inferscale.MemoryClient.import_memories`,
``inferscale import-mem0``).

A Mem0 user moves by swapping the import; the memories Mem0 stored move with this module. It reads two shapes of
one memory, both Mem0 2.x's (``mem0/memory/main.py``):

- a result item, as ``Memory.get``/``get_all`` return it: ``{"id", "memory", "hash", "created_at", "updated_at",
  "user_id", "agent_id", "run_id", "actor_id", "role", "metadata", ...}``; the one way out of every vector store
  Mem0's open-source ``Memory`` runs on (Qdrant, pgvector, Chroma, ...). Items of Mem0's platform carry more keys
  (``owner``, ``organization``, ``immutable``, ...), which have no counterpart here and are refused by name;
- a vector store payload, as Mem0 writes it: ``{"data", "hash", "created_at", "updated_at", "user_id", ...}`` with
  the memory's metadata as the payload's other keys. Mem0's faiss store keeps them in ``<collection>.json``
  (``{"docstore": {id: payload}, "index_to_id": ...}``), which :func:`read_mem0_file` reads as is, and its local
  Qdrant store (Mem0's default) as points whose payloads these are.

Every record needs its id, a canonical UUID as Mem0 gives every memory: the memory keeps it (an application may hold
it), and a second import knows it by it. Every memory keeps its text, scope and times; ``role`` and ``actor_id`` go
into its metadata, where InferScale keeps them (and shows them beside the scope ids, as Mem0 does). Mem0's vectors
are not read: they come from Mem0's embedder, and InferScale embeds each text with its own. Mem0's ``hash`` (md5)
and ``text_lemmatized`` (its BM25 text) are derived values, left out.

Mem0 hides a memory whose ``expiration_date`` (``YYYY-MM-DD``) is before today (UTC); such a memory is skipped
here too. InferScale does not expire memories, so one that would expire later is refused rather than kept for good.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from inferscale.arguments import check_metadata
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.json_text import loads_json
from inferscale.mem0_config import DEFAULT_COLLECTION, is_file_name
from inferscale.scope import SCOPE_KEYS, Scope
from inferscale.storage.change_sets import NewMemory
from inferscale.storage.records import ATTRIBUTION_KEYS
from inferscale.storage.validation import check_new_id, check_text, check_utc_time
from inferscale.validation_text import shown_input

DERIVED_KEYS = frozenset({"hash", "text_lemmatized"})
"""Left out: Mem0's md5 of the text and its BM25 text, derived from the text (beside the metadata in a payload)."""
RESULT_KEYS = frozenset(
    {"id", "memory", "created_at", "updated_at", "metadata", "attributed_to", "expiration_date", "categories", "score"}
    | set(SCOPE_KEYS)
    | set(ATTRIBUTION_KEYS)
    | DERIVED_KEYS
)
"""The keys of a Mem0 result item: what ``get_all`` gives (Mem0's platform adds ``categories``, a search ``score``,
which is left out). In a payload, a ``score`` key is the metadata's own."""
KEPT_IN_METADATA = ("attributed_to", "categories")
"""Top-level keys of a result item that Mem0 holds in the payload beside the metadata: kept in the metadata."""
PAYLOAD_KEYS = frozenset(
    {"id", "data", "created_at", "updated_at", "expiration_date"}
    | set(SCOPE_KEYS)
    | set(ATTRIBUTION_KEYS)
    | DERIVED_KEYS
)
"""The keys of a Mem0 payload that are not the memory's metadata (every other key is)."""
PAGE_KEYS = frozenset({"results", "relations", "count", "next", "previous"})
"""The keys of a ``get_all`` return value: ``{"results": [...]}``, with ``relations`` when Mem0 has a graph store (not
read: InferScale has no graph memory), and a page's count and links on Mem0's platform."""


@dataclass(frozen=True, slots=True)
class ImportedMemory:
    """One Mem0 memory, checked and ready to store.

    Attributes:
        scope: its user, agent and run ids.
        memory: its text; its metadata, ``role`` and ``actor_id`` included when Mem0 had them; its Mem0 id (a
            canonical UUID); its times (tz-aware UTC; ``None`` when the record has none). Its context is laid out
            when it is stored (:func:`inferscale.new_memories.one_by_one`).
    """

    scope: Scope
    memory: NewMemory

    def __post_init__(self) -> None:
        if self.memory.memory_id is None:
            raise InvalidInputError("an imported memory keeps its id: give it one")

    @property
    def memory_id(self) -> str:
        """Its Mem0 id (``memory.memory_id``, which every imported memory has)."""
        return self.memory.memory_id or ""


@dataclass(frozen=True, slots=True)
class ReadMemories:
    """What :func:`mem0_memories` read.

    Attributes:
        memories: the memories to store, in the order given.
        expired: ``(id, expiration date)`` of each memory skipped because Mem0 hides it as expired.
    """

    memories: list[ImportedMemory]
    expired: list[tuple[str, str]]


def mem0_memories(
    records: object,
    max_memory_chars: int,
    *,
    only: Scope | None = None,
    assume_utc: bool = False,
    today: date | None = None,
) -> ReadMemories:
    """Check every record before anything is stored: one bad record refuses them all.

    Args:
        records: a sequence of Mem0 result items or payloads (see the module's docstring); a Mem0 ``get_all``
            return value (``{"results": [...]}``, a platform page's ``count``, ``next`` and ``previous`` too) is
            taken too.
        max_memory_chars: the longest text taken (``MemoryConfig.max_memory_chars``, characters).
        only: keep only the memories of this scope (every id it names equal, as a search's scope); ``None``: all.
            Every record is checked all the same.
        assume_utc: read a time without a zone as UTC. Mem0 writes its own times with one, but keeps a
            ``created_at`` a caller put in a memory's metadata as it was given; by default such a time is refused,
            as its zone would be a guess.
        today: the UTC date expiration dates are compared with (default: today's).

    Returns:
        :class:`ReadMemories`.

    Raises:
        InvalidInputError: naming the record (its position and id) for a record that is not a dict, has no id, no
            text (``memory`` or ``data``) or an empty one, a text longer than ``max_memory_chars``, an id that is not
            a canonical UUID, a time that is not ISO 8601 (or has no zone, unless ``assume_utc``), metadata that is
            not a dict of plain JSON or names a scope id or ``actor_id``, a key given both in the metadata and
            beside it, an unknown key in a result item, or an ``expiration_date`` that is not ``YYYY-MM-DD`` or is
            today or later; when two records that differ have the same id (two equal ones are taken once: the same
            memory in two exports).
        ScopeError: for a record with no user, agent or run id, or one that is not a non-empty str or an int.
    """
    records = _unwrapped(records)
    if isinstance(records, str | bytes) or not isinstance(records, Sequence):
        raise InvalidInputError(f"memories must be a list of Mem0 memories, got {type(records).__name__}")
    today = today or datetime.now(UTC).date()
    memories: list[ImportedMemory] = []
    expired: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for position, record in enumerate(records):
        where = _where(position, record)
        if _repeats(record, records, seen):
            continue
        try:
            imported, expires = _memory(record, max_memory_chars, assume_utc)
            if expires is not None and expires >= today:
                raise InvalidInputError(
                    f"expiration_date {expires.isoformat()} is not past: InferScale does not expire memories; drop the "
                    "key from the record to keep the memory for good, or leave the record out"
                )
        except InvalidInputError as error:  # ScopeError included, and kept
            raise type(error)(f"{where}: {error}") from error
        memory_id = imported.memory_id
        if memory_id in seen:
            raise InvalidInputError(f"{where}: its id is the id of record {seen[memory_id]} too, which differs")
        seen[memory_id] = position
        if only is not None and not _within(imported.scope, only):
            continue
        if expires is not None:
            expired.append((memory_id, expires.isoformat()))
        else:
            memories.append(imported)
    return ReadMemories(memories, expired)


def _repeats(record: object, records: Sequence[object], seen: Mapping[str, int]) -> bool:
    """Whether ``record`` equals an earlier record with its id: the same memory exported twice (Mem0's ``get_all``
    of a user and of an agent both list a memory of that user and agent), taken once."""
    memory_id = record.get("id") if isinstance(record, Mapping) else None
    return isinstance(memory_id, str) and memory_id in seen and records[seen[memory_id]] == record


def _within(scope: Scope, only: Scope) -> bool:
    """Whether every id ``only`` names is ``scope``'s."""
    return all(value == getattr(scope, key) for key, value in only.as_dict().items())


def _unwrapped(value: object) -> object:
    """The ``results`` of a ``get_all`` return value (:data:`PAGE_KEYS`); any other value as it is."""
    if isinstance(value, Mapping) and "results" in value and set(value) <= PAGE_KEYS:
        return value["results"]
    return value


def _where(position: int, record: object) -> str:
    memory_id = record.get("id") if isinstance(record, Mapping) else None
    return f"record {position}" + (f" (id {memory_id!r})" if isinstance(memory_id, str) else "")


def _memory(record: object, max_memory_chars: int, assume_utc: bool) -> tuple[ImportedMemory, date | None]:
    """One record as a memory, and its expiration date (``None`` when it has none)."""
    if not isinstance(record, Mapping):
        raise InvalidInputError(f"a Mem0 memory is a dict, got {type(record).__name__}")
    if any(not isinstance(key, str) for key in record):
        raise InvalidInputError("a Mem0 memory's keys are strs")
    fields: dict[str, Any] = dict(record)
    if "memory" in fields and "data" in fields:
        raise InvalidInputError(
            "a record has either 'memory' (a Mem0 result item) or 'data' (a Mem0 payload), not both"
        )
    if "memory" in fields:
        metadata = _result_metadata(fields)
        text = fields.pop("memory")
    elif "data" in fields:
        text = fields.pop("data")
        metadata = {k: v for k, v in fields.items() if k not in PAYLOAD_KEYS}
    else:
        raise InvalidInputError("no text: a Mem0 result item has 'memory', a Mem0 payload 'data'")
    text = check_text(text, "the memory's text")
    if len(text) > max_memory_chars:
        raise InvalidInputError(
            f"its text is {len(text)} characters; at most {max_memory_chars} are taken (max_memory_chars in the "
            "client's config)"
        )
    if "id" not in fields:
        raise InvalidInputError("no id: every Mem0 memory has one, which the memory keeps")
    metadata = {**check_metadata(metadata)}
    for key in ATTRIBUTION_KEYS:  # Mem0 keeps them beside the metadata: InferScale in it, as add(infer=False) does
        if fields.get(key) is not None:
            metadata[key] = check_text(fields[key], key)
    memory = NewMemory(
        text,
        metadata,
        memory_id=check_new_id(fields["id"]),
        created_at=mem0_time(fields.get("created_at"), "created_at", assume_utc),
        updated_at=mem0_time(fields.get("updated_at"), "updated_at", assume_utc),
    )
    scope = Scope.of(*(fields.get(key) for key in SCOPE_KEYS))
    return ImportedMemory(scope, memory), _expiration(fields.get("expiration_date"))


def _result_metadata(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A result item's metadata: its ``metadata`` dict and the keys Mem0 promotes out of it (``attributed_to``).

    Raises:
        InvalidInputError: for a key Mem0's result items do not have, ``metadata`` that is not a dict, or a key given
            both beside the metadata and in it (``role``, ``actor_id``, ``attributed_to``, ``categories``).
    """
    unknown = sorted(set(fields) - RESULT_KEYS)
    if unknown:
        raise InvalidInputError(
            f"unknown keys {unknown} in a Mem0 result item (its own keys: {sorted(RESULT_KEYS)}); put them in "
            "'metadata' to keep them"
        )
    metadata = fields.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a dict, got {type(metadata).__name__}")
    kept = {key: fields[key] for key in KEPT_IN_METADATA if fields.get(key) is not None}
    beside = {key for key in ATTRIBUTION_KEYS if fields.get(key) is not None}
    clash = sorted((set(kept) | beside) & set(metadata))
    if clash:
        raise InvalidInputError(f"{clash} given both as keys of the memory and in its metadata")
    return {**metadata, **kept}


def mem0_time(value: object, name: str, assume_utc: bool) -> datetime | None:
    """An ISO 8601 time with a zone (Mem0 writes ``datetime.isoformat()`` of a tz-aware time), or a tz-aware
    ``datetime``, in UTC; ``None`` for ``None``. With ``assume_utc``, a time without a zone is read as UTC.

    Raises:
        InvalidInputError: for anything else (a time without a zone included, unless ``assume_utc``: which zone it
            meant is unknown).
    """
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidInputError(f"{name} {value!r} is not an ISO 8601 time") from None
    if isinstance(value, datetime) and value.utcoffset() is None:
        if not assume_utc:  # the generic message named no way out of an export written without zones
            raise InvalidInputError(
                f"{name} {value.isoformat()!r} has no time zone: give one (e.g. +00:00 for UTC), or read such times "
                "as UTC with assume_utc=True (`inferscale import-mem0 --assume-utc`)"
            )
        value = value.replace(tzinfo=UTC)
    if not isinstance(value, datetime):  # the generic "must be a datetime" did not say a string is taken
        raise InvalidInputError(f"{name} must be an ISO 8601 time string or a datetime, got {shown_input(value)}")
    return check_utc_time(value, name)


def _expiration(value: object) -> date | None:
    """Mem0's ``expiration_date``: ``YYYY-MM-DD``; ``None`` (or an empty value, which Mem0 reads as none) for
    none.

    Raises:
        InvalidInputError: for a value that is not such a date.
    """
    if value is None or value == "":
        return None
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise InvalidInputError(f"expiration_date {value!r} is not a YYYY-MM-DD date") from None


QDRANT_PAGE = 1_000
"""Points read from a local Qdrant collection per request."""


def usable_path(path: object) -> Path:
    """``path`` (a str or ``os.PathLike``) as a :class:`~pathlib.Path`, ``~`` expanded.

    Raises:
        InvalidInputError: for a value that is no path, or a ``~user`` whose home does not exist.
    """
    try:
        return Path(path).expanduser()  # type: ignore[arg-type]  # checked here: a TypeError is refused
    except (RuntimeError, TypeError, ValueError) as error:  # "~nobody/x": no such home; not a path at all
        raise InvalidInputError(f"not a usable path: {path!r} ({error})") from None


def read_mem0_file(path: str | Path, collection: str = DEFAULT_COLLECTION) -> list[dict[str, Any]]:
    """The Mem0 memories a file or folder holds, as records for :func:`mem0_memories`.

    ``path`` is one of (``collection`` matters for a folder alone):

    - a folder of Mem0's local Qdrant store (Mem0's default vector store; its ``path``, ``/tmp/qdrant`` by default):
      the collection's points are read with Qdrant's own client (``pip install 'inferscale-memory[mem0-import]'``),
      which needs the folder to itself: stop the Mem0 process that has it open first;
    - a folder of Mem0's faiss store (its ``path`` setting): the docstore ``<collection>.json`` there is read;
    - such a docstore file itself;
    - a JSON file of Mem0 result items: a list, or a ``get_all`` return value ``{"results": [...]}``; e.g. written
      by ``json.dump(memory.get_all(filters={"user_id": "alice"}, top_k=100_000), f)``, which works on every
      vector store Mem0 supports.

    Nothing is written; Mem0's files are only read.

    Raises:
        InvalidInputError: when ``collection`` is not a plain file name, the path does not exist, a Qdrant folder
            has no such collection or is open in another process, a faiss folder holds no ``<collection>.json``
            (Mem0's older pickle docstore ``<collection>.pkl`` is not read: Mem0 2.x rewrites it as JSON when it
            opens the store), the file is not UTF-8 JSON, or its JSON is none of these shapes.
        ConfigError: for a Qdrant folder when ``qdrant-client`` is not installed.
    """
    if not is_file_name(collection):
        raise InvalidInputError(f"a collection's name is a plain file name, got {collection!r}")
    source = usable_path(path)
    try:
        is_folder = source.is_dir()
    except (OSError, ValueError) as error:  # a name longer than the file system takes; a NUL in the path
        raise InvalidInputError(f"not a usable path: {path!r} ({error})") from None
    if is_folder and (source / "collection").is_dir() and (source / "meta.json").is_file():
        return _qdrant_points(source, collection)
    if is_folder:
        docstore = source / f"{collection}.json"
        if not docstore.is_file():
            pickled = source / f"{collection}.pkl"
            found = f"only Mem0's older pickle docstore {pickled.name}, which is not read" if pickled.is_file() else ""
            raise InvalidInputError(
                f"{source} holds no Mem0 faiss docstore {docstore.name}{': ' + found if found else ''}. Open the store "
                "once with Mem0 2.x, which writes it, or give the collection's name (--collection)"
            )
        source = docstore
    return _json_records(source)


def _qdrant_points(folder: Path, collection: str) -> list[dict[str, Any]]:
    """The payloads of a local Qdrant collection, each with its point's id (Mem0's memory id).

    Raises:
        ConfigError: when ``qdrant-client`` is not installed.
        InvalidInputError: when the collection is not there, or another process has the folder open.
    """
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        raise ConfigError(
            f"{folder} is a local Qdrant store (Mem0's default): reading it needs Qdrant's client, "
            "pip install 'inferscale-memory[mem0-import]'; or export the memories with Mem0's get_all to a JSON file"
        ) from None
    try:
        client = QdrantClient(path=str(folder))
    except RuntimeError as error:  # its folder lock: a running Mem0 holds it
        raise InvalidInputError(f"{folder} cannot be opened: {error}. Stop the process that has it open") from None
    try:
        if not client.collection_exists(collection):
            names = sorted(c.name for c in client.get_collections().collections)
            raise InvalidInputError(f"{folder} has no collection {collection!r} (it has {names}): give --collection")
        records: list[dict[str, Any]] = []
        offset = None
        while True:
            points, offset = client.scroll(collection, limit=QDRANT_PAGE, offset=offset, with_payload=True)
            records += [{**(point.payload or {}), "id": str(point.id)} for point in points]
            if offset is None:
                return records
    finally:
        client.close()


def _json_records(source: Path) -> list[dict[str, Any]]:
    """The records of a JSON file: a faiss docstore's payloads (each with its id), or a list of result items.

    Raises:
        InvalidInputError: when the file is missing, unreadable, not UTF-8 JSON, or none of these shapes.
    """
    try:
        loaded = loads_json(source.read_text(encoding="utf-8"))
    except ValueError as error:  # a JSON or UTF-8 error (both ValueErrors), or a path the OS cannot take
        raise InvalidInputError(f"{source} cannot be read as JSON: {error}") from None
    except FileNotFoundError:
        raise InvalidInputError(f"no such file or folder: {source}") from None
    except OSError as error:
        raise InvalidInputError(f"{source} cannot be read: {error.strerror}") from None
    if isinstance(loaded, dict) and isinstance(loaded.get("docstore"), dict):
        payloads: dict[str, Any] = loaded["docstore"]
        return [{**payload, "id": key} if isinstance(payload, dict) else payload for key, payload in payloads.items()]
    loaded = _unwrapped(loaded)
    if not isinstance(loaded, list):
        raise InvalidInputError(
            f"{source} holds none of Mem0's shapes: a list of memories, a get_all result {{'results': [...]}}, or a "
            "faiss docstore {'docstore': {...}}"
        )
    return loaded


__all__ = [
    "DEFAULT_COLLECTION",
    "ImportedMemory",
    "ReadMemories",
    "mem0_memories",
    "mem0_time",
    "read_mem0_file",
    "usable_path",
]
