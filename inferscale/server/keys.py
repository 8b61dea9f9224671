"""API keys of the server: created, listed, revoked and checked, stored hashed in the memory database.

A key reads ``isk_<key_id>_<secret>``: ``key_id`` is 12 hex characters, stored in clear (``keys list`` shows it),
``secret`` is ``secrets.token_urlsafe(32)``. The table ``api_keys`` keeps the secret's scrypt hash
(``hashlib.scrypt``, n=2**14, r=8, p=1, a 16-byte random salt per key), compared with ``hmac.compare_digest``. A key
verified once is remembered in this process (by the sha256 of the key string), so scrypt runs once per key; each
check still reads the key's row, so a revocation is seen at once, by every process sharing the database.

A key binds the scopes it may touch: lists of ``user_ids``, ``agent_ids`` and ``run_ids`` (``None``: any value).
A non-admin key binds at least one list; an admin key binds none: it may touch every scope and reset the store.
No route manages keys: they are created, listed and revoked by whoever can open the database (``inferscale keys``,
or this class).

Every failed check of a well-formed key costs one scrypt: an unknown or revoked ``key_id`` is hashed against a fixed
dummy hash, so the time of a 401 does not tell which ids exist. These checks run within a budget
(:mod:`inferscale.server.key_checks`): one at a time, and refused at once with ``RateLimitedError`` once too many
failed lately; a key string that failed is remembered too (the last :data:`REFUSED_KEYS_KEPT`), and refused again
without a scrypt. A key verified before skips both.
"""

from __future__ import annotations

import builtins
import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import JSON, Engine, LargeBinary, MetaData, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from inferscale.config import MemoryConfig
from inferscale.errors import APIKeyNotFoundError, InvalidInputError
from inferscale.scope import SCOPE_KEYS
from inferscale.server.key_checks import KeyCheckLimiter, KeyCheckLimits
from inferscale.storable import is_blank
from inferscale.storage import make_engine
from inferscale.storage.models import UTCDateTime, utc_now
from inferscale.storage.schema import SchemaChain, ensure_schema
from inferscale.storage.uninterrupted import guarded_session

KEY_PREFIX = "isk_"
_KEY = re.compile(r"isk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_MAX_SCOPE_IDS = 1000

REFUSED_KEYS_KEPT = 4096
"""Key strings that failed their check, remembered (by sha256, the oldest forgotten first) and refused again without a
scrypt: a client retrying a revoked or mistyped key spends neither CPU nor the failed-check budget."""


def _baseline() -> MetaData:
    from inferscale.server.migrations.baseline import baseline_metadata

    return baseline_metadata()


KEYS_SCHEMA = SchemaChain(
    name="API key",
    script_location=Path(__file__).resolve().parent / "migrations",
    version_table="inferscale_keys_schema_version",
    baseline_revision="0001_api_keys",
    baseline=_baseline,
)
"""The versioned schema of ``api_keys``: a chain of its own beside the memory store's, so the storage layer knows
nothing of keys and each part upgrades on its own."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One API key, without its secret or hash.

    Attributes:
        key_id: 12 hex characters, the public part of the key.
        name: a label for people.
        admin: binds no list: may touch every scope and reset the store.
        user_ids, agent_ids, run_ids: the scope ids the key may touch; ``None`` means any.
        created_at: when it was created (UTC).
        revoked_at: when it was revoked (UTC), or ``None`` while it is valid.
    """

    key_id: str
    name: str
    admin: bool
    user_ids: tuple[str, ...] | None
    agent_ids: tuple[str, ...] | None
    run_ids: tuple[str, ...] | None
    created_at: datetime
    revoked_at: datetime | None = None

    def bound(self, field: str) -> tuple[str, ...] | None:
        """The ids the key binds for ``field`` (``"user_id"``, ``"agent_id"`` or ``"run_id"``); ``None``: any."""
        value: tuple[str, ...] | None = getattr(self, f"{field}s")
        return value

    def scopes(self) -> dict[str, list[str] | None]:
        """``{"user_ids", "agent_ids", "run_ids"}`` as JSON-ready lists (``None``: any)."""
        return {f"{k}s": None if (v := self.bound(k)) is None else list(v) for k in SCOPE_KEYS}


class _Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {list[str]: JSON, datetime: UTCDateTime}


class ApiKeyRow(_Base):
    """A row of ``api_keys``."""

    __tablename__ = "api_keys"

    key_id: Mapped[str] = mapped_column(String(12), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    salt: Mapped[bytes] = mapped_column(LargeBinary(16))
    secret_hash: Mapped[bytes] = mapped_column(LargeBinary(64))
    admin: Mapped[bool]
    user_ids: Mapped[list[str] | None]
    agent_ids: Mapped[list[str] | None]
    run_ids: Mapped[list[str] | None]
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]

    def record(self) -> ApiKey:
        """The key as a frozen :class:`ApiKey`."""
        return ApiKey(
            key_id=self.key_id,
            name=self.name,
            admin=self.admin,
            user_ids=None if self.user_ids is None else tuple(self.user_ids),
            agent_ids=None if self.agent_ids is None else tuple(self.agent_ids),
            run_ids=None if self.run_ids is None else tuple(self.run_ids),
            created_at=self.created_at,
            revoked_at=self.revoked_at,
        )


def _hash(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(secret.encode(), salt=salt, **_SCRYPT)


_DUMMY_SALT = bytes(16)
_DUMMY_HASH = bytes(64)
"""What an unknown or revoked key's secret is hashed with and compared to (no secret hashes to 64 zero bytes)."""


def _ids(field: str, ids: Sequence[str] | None) -> list[str] | None:
    """``ids`` as a list of distinct non-empty strings, or ``None``.

    Raises:
        InvalidInputError: for a string instead of a list, an empty list, a blank or non-string id.
    """
    if ids is None:
        return None
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidInputError(f"{field} must be a list of ids or None, got {ids!r}")
    if not ids or len(ids) > _MAX_SCOPE_IDS:
        raise InvalidInputError(f"{field} must hold 1 to {_MAX_SCOPE_IDS} ids (None binds any), got {len(ids)}")
    if not all(isinstance(i, str) and not is_blank(i) for i in ids):
        raise InvalidInputError(f"{field} must hold non-empty strings, got {list(ids)!r}")
    return list(dict.fromkeys(ids))


class KeyStore:
    """The API keys in the table ``api_keys`` of a SQL database (any SQLAlchemy URL; the memory database's).

    The constructor does no I/O; the table is created or upgraded (:data:`KEYS_SCHEMA`) on first use, safely when
    several processes open one new database at once. Thread-safe; every method runs in its own transaction.

    Args:
        url: the database, e.g. ``MemoryConfig.database_url()``.
        limits: the budget of failed checks of keys not verified yet (:class:`KeyCheckLimits`; ``None``: its
            defaults).
    """

    def __init__(self, url: str, limits: KeyCheckLimits | None = None) -> None:
        self.url = url
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._verified: dict[str, str] = {}  # sha256 of a key string -> its key_id, once scrypt accepted it
        self._refused: dict[str, None] = {}  # sha256 of key strings that failed scrypt, oldest first
        self._refused_lock = threading.Lock()
        self._checks = KeyCheckLimiter(limits or KeyCheckLimits())
        self._has_keys = False

    @classmethod
    def for_config(cls, config: MemoryConfig, limits: KeyCheckLimits | None = None) -> KeyStore:
        """The key store in ``config``'s memory database, with ``limits`` (``None``: the defaults)."""
        return cls(config.database_url(), limits)

    def _db(self) -> Engine:
        with self._lock:
            if self._engine is None:
                engine = make_engine(self.url)
                try:
                    ensure_schema(engine, KEYS_SCHEMA)
                except BaseException:
                    engine.dispose()
                    raise
                self._engine = engine
            return self._engine

    def create(
        self,
        name: str,
        *,
        user_ids: Sequence[str] | None = None,
        agent_ids: Sequence[str] | None = None,
        run_ids: Sequence[str] | None = None,
        admin: bool = False,
    ) -> tuple[ApiKey, str]:
        """Create a key; returns it and its key string ``isk_<key_id>_<secret>`` (shown once: only a hash is kept).

        Raises:
            InvalidInputError: for a blank name (or over 255 characters), a bad id list, a non-admin key that binds
                no list (it could touch every memory), or an admin key that binds one (an admin key touches every
                scope and may reset the store, so its lists would bind nothing).
        """
        if not isinstance(name, str) or is_blank(name) or len(name) > 255:
            raise InvalidInputError(f"a key's name must be a non-empty string of at most 255 characters, got {name!r}")
        lists = {"user_ids": _ids("user_ids", user_ids), "agent_ids": _ids("agent_ids", agent_ids)}
        lists["run_ids"] = _ids("run_ids", run_ids)
        if not isinstance(admin, bool):
            raise InvalidInputError(f"admin must be True or False, got {admin!r}")
        if admin and (bound := [field for field, v in lists.items() if v is not None]):
            raise InvalidInputError(
                f"an admin key touches every scope and may reset the store, so it cannot bind {' or '.join(bound)}; "
                f"create a non-admin key bound to them, or an admin key without them"
            )
        if not admin and all(v is None for v in lists.values()):
            raise InvalidInputError(
                "a non-admin key must bind user_ids, agent_ids or run_ids (the scopes it may touch); "
                "pass admin=True for a key that may touch every scope"
            )
        secret, salt = secrets.token_urlsafe(32), secrets.token_bytes(16)
        with guarded_session(self._db(), write=True) as s:
            key_id = secrets.token_hex(6)
            while s.get(ApiKeyRow, key_id) is not None:
                key_id = secrets.token_hex(6)
            row = ApiKeyRow(
                key_id=key_id,
                name=name,
                salt=salt,
                secret_hash=_hash(secret, salt),
                admin=admin,
                created_at=utc_now(),
                revoked_at=None,
                **lists,
            )
            s.add(row)
            s.flush()
            key = row.record()
        self._has_keys = True
        return key, f"{KEY_PREFIX}{key_id}_{secret}"

    def list(self) -> builtins.list[ApiKey]:
        """Every key, revoked ones included, oldest first."""
        with guarded_session(self._db()) as s:
            rows = s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.key_id))
            return [row.record() for row in rows]

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key at once (a key already revoked keeps its first ``revoked_at``); returns it.

        Raises:
            APIKeyNotFoundError: when no key has this id.
        """
        with guarded_session(self._db(), write=True) as s:
            row = s.get(ApiKeyRow, key_id) if isinstance(key_id, str) else None
            if row is None:
                raise APIKeyNotFoundError(f"no API key has id {key_id!r}; `inferscale keys list` shows the ids")
            if row.revoked_at is None:
                row.revoked_at = utc_now()
            return row.record()

    def authenticate(self, key: str) -> ApiKey | None:
        """The valid key ``key`` is, or ``None`` when it is malformed, unknown, wrong or revoked.

        A key verified before in this process costs no scrypt and is never limited (its row is still read: a
        revocation is seen at once, and refused without a scrypt). Any other well-formed key costs one scrypt whatever
        the reason it fails (an unknown or revoked id is hashed against a dummy hash), so the reply time does not tell
        which key ids exist; that scrypt runs within the store's :class:`KeyCheckLimits` (one at a time: waits while
        another runs). A malformed key, or a key string that failed before (the last :data:`REFUSED_KEYS_KEPT`),
        fails at once.

        Raises:
            RateLimitedError: for a key not verified before, at once and without a scrypt, while the budget of
                failed checks is spent (:meth:`KeyCheckLimiter.check`).
        """
        match = _KEY.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            return None
        key_id, secret = match.groups()
        digest = hashlib.sha256(key.encode()).hexdigest()
        if digest in self._refused:
            return None
        with guarded_session(self._db()) as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None or row.revoked_at is not None:
                found, salt, stored = None, _DUMMY_SALT, _DUMMY_HASH
            else:
                found, salt, stored = row.record(), row.salt, row.secret_hash
        if self._verified.get(digest) == key_id:  # verified before: only its holder knows it, and that its id exists
            if found is None:  # revoked since
                self._refuse(digest)
            return found
        if not self._checks.check(lambda: hmac.compare_digest(_hash(secret, salt), stored)) or found is None:
            self._refuse(digest)
            return None
        self._verified[digest] = key_id
        return found

    def _refuse(self, digest: str) -> None:
        """Remember the key string of sha256 ``digest`` as refused (the last :data:`REFUSED_KEYS_KEPT`)."""
        with self._refused_lock:
            self._refused[digest] = None
            if len(self._refused) > REFUSED_KEYS_KEPT:
                del self._refused[next(iter(self._refused))]

    def has_keys(self) -> bool:
        """Whether any key was ever created in this database (revoked ones count: revoking every key never
        reopens a server)."""
        if not self._has_keys:
            with guarded_session(self._db()) as s:
                self._has_keys = s.scalar(select(ApiKeyRow.key_id).limit(1)) is not None
        return self._has_keys

    def close(self) -> None:
        """Release the database connections (the next call opens them again)."""
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None
