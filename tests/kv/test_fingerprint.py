"""Model fingerprint guarantees: another weight, dtype or rope_theta is another key, so a stored entry becomes a
miss and the fact is encoded again; entries survive a restart; a file of another fingerprint is never injected.

The engine here is a small stand-in with the methods :class:`FactKVManager` uses, around a tiny random Llama and
the real :class:`FactEncoder` and :func:`model_fingerprint`; the store and the SQL rows are the real ones.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from inferscale.config import KVConfig
from inferscale.errors import KVFingerprintMismatchError
from inferscale.fact_kv import FactKVManager
from inferscale.kv import EncodeRequest, FactEncoder, FactKV, KVStore, model_fingerprint
from inferscale.kv.fingerprint import config_digest, depends_on_context, encoding_key, weights_digest
from inferscale.kv.tiers import DiskTier
from inferscale.scope import Scope
from inferscale.storage import MemoryRecord, MemoryStore
from tests.tiny_models import tiny_model

SCOPE = Scope(user_id="alice")


class ByteTokenizer:
    """What :func:`model_fingerprint` reads from a tokenizer: a 257-entry vocabulary and its special tokens."""

    all_special_tokens = ("<pad>",)

    def get_vocab(self) -> dict[str, int]:
        return {"<pad>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}}


class TinyEngine:
    """The part of :class:`inferscale.engines.base.Engine` that :class:`FactKVManager` calls, over a tiny model.

    Attributes:
        encoded: how many facts :meth:`encode_facts` has encoded.
    """

    def __init__(self, model: Any, model_id: str = "tiny-llama") -> None:
        self.max_context_tokens = int(model.config.max_position_embeddings)
        self._fingerprint = model_fingerprint(model, ByteTokenizer(), model_id)
        self._encoder = FactEncoder(model, batch_size=4)
        self.encoded = 0

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def system_prefix_ids(self) -> list[int]:
        return [1, 2, 3, 4]

    def fact_token_ids(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode()]

    def context_token_ids(self, turns: Sequence[str]) -> list[int]:
        return [b + 1 for turn in turns for b in turn.encode()]

    def control_token_texts(self) -> frozenset[str]:
        return frozenset()  # byte ids: no text is read as a control token

    def encode_facts(self, requests: Sequence[EncodeRequest]) -> list[FactKV]:
        self.encoded += len(requests)
        return self._encoder.encode(requests)


@pytest.fixture(scope="module")
def base_model() -> Any:
    return tiny_model("llama", seed=0)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[MemoryStore]:
    store = MemoryStore(f"sqlite:///{tmp_path / 'memory.db'}")
    yield store
    store.close()


def manager(engine: TinyEngine, directory: Path, db: MemoryStore) -> FactKVManager:
    return FactKVManager(engine, KVStore(directory), db, KVConfig())  # type: ignore[arg-type]


def records(db: MemoryStore) -> list[MemoryRecord]:
    return [db.add(text, SCOPE) for text in ("Maya lives in Porto.", "Tom's dog is called Biscuit.")]


def variant(base: Any, change: str) -> Any:
    """``base`` with exactly one thing changed: one weight, the dtype, or rope_theta (same weights)."""
    if change == "one weight":
        model = copy.deepcopy(base)
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight[3, 5] += 1e-3
        return model
    if change == "dtype":
        return copy.deepcopy(base).to(torch.bfloat16)
    if change == "rope_theta":
        model = tiny_model("llama", seed=0, rope_parameters={"rope_type": "default", "rope_theta": 20000.0})
        assert weights_digest(model) == weights_digest(base)  # only the rope parameters differ
        return model
    raise ValueError(change)


def same(a: FactKV, b: FactKV) -> bool:
    return a.keys.dtype == b.keys.dtype and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_stored_entry_is_reused_and_survives_a_restart(base_model: Any, tmp_path: Path, db: MemoryStore) -> None:
    rows = records(db)
    engine = TinyEngine(base_model)
    first = manager(engine, tmp_path / "kv", db).ensure(rows)
    assert engine.encoded == 2
    assert all(same(a, b) for a, b in zip(manager(engine, tmp_path / "kv", db).ensure(rows), first, strict=True))
    assert engine.encoded == 2  # a new store object on the same folder: read from disk, bit-exactly
    kv = manager(engine, tmp_path / "kv", db)
    assert db.get_kv_entry(rows[0].id, engine.fingerprint, kv.encoding_key(rows[0])) is not None


@pytest.mark.parametrize("change", ["one weight", "dtype", "rope_theta"])
def test_a_changed_model_misses_the_stored_entry_and_encodes_again(
    base_model: Any, tmp_path: Path, db: MemoryStore, change: str
) -> None:
    rows = records(db)
    base = TinyEngine(base_model)
    manager(base, tmp_path / "kv", db).ensure(rows)
    changed = TinyEngine(variant(base_model, change))
    assert changed.fingerprint != base.fingerprint

    facts = manager(changed, tmp_path / "kv", db).ensure(rows)
    assert changed.encoded == 2  # every stored entry was a miss
    if change == "dtype":
        assert all(f.keys.dtype == torch.bfloat16 for f in facts)
    on_disk = DiskTier(tmp_path / "kv").keys()
    stored = {k.fingerprint for k in on_disk if k.memory_id == rows[0].id}
    assert stored == {base.fingerprint, changed.fingerprint}

    manager(base, tmp_path / "kv", db).ensure(rows)  # the original model still finds its own entries
    assert base.encoded == 2


def test_a_file_written_under_another_fingerprint_is_refused(base_model: Any, tmp_path: Path, db: MemoryStore) -> None:
    rows = records(db)[:1]
    base, changed = TinyEngine(base_model), TinyEngine(variant(base_model, "one weight"))
    base_kv, changed_kv = manager(base, tmp_path / "kv", db), manager(changed, tmp_path / "kv", db)
    base_kv.ensure(rows)
    disk = DiskTier(tmp_path / "kv")
    shutil.copy(disk.path(base_kv.key(rows[0])), disk.path(changed_kv.key(rows[0])))  # planted under its name

    with pytest.raises(KVFingerprintMismatchError, match="fingerprint"):
        changed_kv.ensure(rows)
    assert changed.encoded == 0  # refused before anything was encoded or injected


def test_forget_removes_the_memory_from_every_tier(base_model: Any, tmp_path: Path, db: MemoryStore) -> None:
    rows = records(db)
    engine = TinyEngine(base_model)
    kv = manager(engine, tmp_path / "kv", db)
    kv.ensure(rows)
    kv.forget(rows[0].id)
    assert db.get_kv_entry(rows[0].id, engine.fingerprint, kv.encoding_key(rows[0])) is None
    on_disk = DiskTier(tmp_path / "kv").keys()
    assert [k.memory_id for k in on_disk] == [rows[1].id]
    kv.ensure(rows)
    assert engine.encoded == 3  # only the forgotten memory is encoded again


def test_the_config_digest_follows_what_changes_kv_and_nothing_else() -> None:
    """A config field the K/V depend on is another digest; the attention kernel (rounding only) and the output
    switches of a forward pass are not, so neither invalidates the store."""
    config = tiny_model("llama", seed=0).config
    base = config_digest(config)
    for switch, value in (
        ("_attn_implementation", "sdpa"),
        ("use_cache", False),
        ("output_attentions", True),
        ("output_hidden_states", True),
        ("return_dict", False),
    ):
        same = copy.deepcopy(config)
        setattr(same, switch, value)
        assert config_digest(same) == base, switch
    for field, value in (
        ("rope_parameters", {"rope_type": "default", "rope_theta": 1234.0}),
        ("rms_norm_eps", 1e-3),
        ("hidden_act", "gelu"),
    ):
        other = copy.deepcopy(config)
        setattr(other, field, value)
        assert config_digest(other) != base, field


def test_the_weights_digest_sees_the_last_bit_of_the_smallest_weight(base_model: Any) -> None:
    """The weights digest hashes the bytes, not a reduction of them: one weight set to 1e-30, then moved to the next
    float32 (a change that a float64 sum of its layer rounds away), is another digest; an equal copy is the same."""
    model = copy.deepcopy(base_model)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = 1e-30
    moved = copy.deepcopy(model)
    assert weights_digest(moved) == weights_digest(model)
    with torch.no_grad():
        moved.model.layers[0].mlp.down_proj.weight.view(torch.int32)[0, 0] += 1
    assert moved.model.layers[0].mlp.down_proj.weight[0, 0].item() != 1e-30
    assert weights_digest(moved) != weights_digest(model)


@pytest.mark.parametrize(
    ("key", "depends"),
    [
        (encoding_key("p" * 64, (), 0, 0), False),  # after no turn: a context-free encoding
        (encoding_key("p" * 64, (), 0, 0, "int8"), False),  # in 8 bits too
        (encoding_key(None, (), 0, 0), False),  # without the system prefix
        (encoding_key("p" * 64, ["a turn"], 5, 0), True),  # after its turns
        (encoding_key("p" * 64, (), 5, 0), True),  # w=5: the key names a window, even with no turn in it
        (encoding_key("p" * 64, ["a", "b"], 0, 0, chain=(3, 1)), True),  # on a chain
        (encoding_key("p" * 64, (), 0, 0, chain=(3, 0)), True),
    ],
)
def test_only_an_encoding_after_no_turn_and_on_no_chain_is_independent_of_the_context(key: str, depends: bool) -> None:
    assert depends_on_context(key) is depends
