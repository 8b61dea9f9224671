"""What every KV tier is: a small mapping from :class:`KVKey` to :class:`FactKV` with a size in bytes.

A tier only stores. Which entry leaves a full tier is decided by an eviction policy
(:mod:`inferscale.kv.tiers.eviction`), and where an evicted entry goes next is decided by the composite store
(:class:`inferscale.kv.store.TieredKVStore`), never by the tier itself.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeGuard, runtime_checkable

from inferscale.errors import InvalidInputError
from inferscale.kv.fact import FactKV
from inferscale.kv.quantization import tag_of_encoding_key

# A memory id names a folder of the disk tier, so it must be one plain path component.
_MEMORY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_memory_id(name: object) -> TypeGuard[str]:
    """Whether ``name`` is a plain id that can name a folder (see :func:`check_memory_id`)."""
    return isinstance(name, str) and _MEMORY_ID.fullmatch(name) is not None


def check_memory_id(memory_id: object) -> str:
    """``memory_id`` when it is a plain id that can name a folder, else an error.

    Raises:
        InvalidInputError: when it is not a str of letters, digits, ``.``, ``_``, ``-`` (1 to 128 characters, not
            starting with ``.``).
    """
    if not is_memory_id(memory_id):
        raise InvalidInputError(
            f"memory id {memory_id!r} is not a plain id (letters, digits, '.', '_', '-'; 1 to 128 characters; "
            "not starting with '.')"
        )
    return memory_id


@dataclass(frozen=True, slots=True)
class KVKey:
    """Identity of one stored entry.

    Attributes:
        memory_id: the memory's public id; letters, digits, ``.``, ``_``, ``-`` (at most 128, not starting with
            ``.``), since it names a folder of the disk tier.
        text_hash: sha256 hex of the memory's text (a changed text is a different entry).
        fingerprint: :func:`inferscale.kv.fingerprint.model_fingerprint` of the encoding model.
        encoding_key: :func:`inferscale.kv.fingerprint.encoding_key`: the encoding settings (the storage format
            among them, :attr:`storage_tag`) and a digest of what the fact was encoded after (the system prefix's
            token ids, its context turns).

    Raises:
        InvalidInputError: when a field is not a non-empty str, or ``memory_id`` is not a plain path component.
    """

    memory_id: str
    text_hash: str
    fingerprint: str
    encoding_key: str

    def __post_init__(self) -> None:
        for name in ("memory_id", "text_hash", "fingerprint", "encoding_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidInputError(f"KVKey.{name} must be a non-empty str, got {value!r}")
        check_memory_id(self.memory_id)

    @property
    def storage_tag(self) -> str:
        """The storage format and scale layout the entry is held in, as the encoding key records it
        (:func:`inferscale.kv.quantization.tag_of_encoding_key`): ``"model"``, or e.g.
        ``"int8:k=channel,v=token,offset"``. A key of one format never names an entry of another: the stores refuse
        such a write and such a file."""
        return tag_of_encoding_key(self.encoding_key)

    def digest(self) -> str:
        """32 hex characters naming this entry on disk (sha256 over all four fields)."""
        raw = "\x1f".join((self.memory_id, self.text_hash, self.fingerprint, self.encoding_key))
        return hashlib.sha256(raw.encode()).hexdigest()[:32]


Evicted: TypeAlias = list[tuple[KVKey, FactKV]]
"""Entries a tier gave up to make room, least recently used first; the caller decides where they go."""


@runtime_checkable
class KVTier(Protocol):
    """One storage tier. Implementations are thread-safe; none of them moves entries to another tier.

    Attributes:
        name: short tier name used in statistics and locations (``"device"``, ``"host"``, ``"disk"``).
    """

    name: str

    def get(self, key: KVKey) -> FactKV | None:
        """The entry for ``key`` (marked most recently used), or ``None`` when this tier does not hold it."""
        ...

    def contains(self, key: KVKey) -> bool:
        """Whether this tier holds ``key``, without loading or touching the entry."""
        ...

    def put(self, key: KVKey, fact: FactKV) -> Evicted:
        """Store ``fact`` under ``key`` (replacing any entry there); returns the entries evicted to make room.

        A fact larger than the tier's whole budget is not kept: it comes back in the evicted list itself.
        """
        ...

    def pop(self, key: KVKey) -> FactKV | None:
        """Remove and return the entry for ``key`` (``None`` when absent), e.g. to move it to another tier."""
        ...

    def delete_memory(self, memory_id: str) -> int:
        """Remove every entry of ``memory_id``; returns how many were removed."""
        ...

    def clear(self) -> None:
        """Remove every entry of this tier."""
        ...

    def keys(self) -> list[KVKey]:
        """Keys held, in no particular order (a snapshot)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes held by this tier (bytes): K and V for memory tiers, whole files for the disk tier."""
        ...
