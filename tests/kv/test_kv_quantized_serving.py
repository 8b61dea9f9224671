"""8-bit K/V from encoding to the cache: quantised once when stored, dequantised when assembled (placed and rotated
exactly as the dequantised K/V of a fresh encoding), formats mixed or switched cleanly. vLLM's workers reading stored
files: tests/engines/test_vllm_segment_files.py."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from tiny_models import tiny_model

from inferscale.config import KVConfig
from inferscale.fact_kv import FactKVManager
from inferscale.kv import EncodeRequest, FactEncoder, FactKV, PrefixKV, RopeTable, TieredKVStore, assemble
from inferscale.kv.rope import rotate_half
from inferscale.storage import MemoryRecord

PREFIX = [5, 9, 2, 77, 31]


@functools.cache
def _model() -> Any:
    return tiny_model("llama")


def _prefix(model: Any) -> PrefixKV:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([PREFIX]), position_ids=torch.arange(len(PREFIX))[None], use_cache=True)
    layers = out.cache.layers
    return PrefixKV(
        torch.stack([x.keys[0] for x in layers]), torch.stack([x.values[0] for x in layers]), torch.tensor(PREFIX)
    )


def _fresh(model: Any) -> list[FactKV]:
    g = torch.Generator().manual_seed(3)
    facts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (6, 4, 9)]
    return FactEncoder(model).encode([EncodeRequest(f, context_ids=PREFIX) for f in facts])


def _rotated_by_the_model(model: Any, keys: torch.Tensor, start: int) -> torch.Tensor:
    """Reference placement: keys ``[L, H, S, D]`` rotated to positions ``start ..`` with the model's own rotary
    module (transformers' ``k * cos + rotate_half(k) * sin``), independent of :class:`RopeTable`."""
    positions = torch.arange(start, start + keys.shape[2])[None]
    cos, sin = model.model.rotary_emb(keys, positions)
    return keys * cos[0] + rotate_half(keys) * sin[0]


@pytest.mark.parametrize("fmt", ["float8_e4m3", "int8"])
def test_an_injected_8bit_segment_is_the_dequantised_fresh_encoding_placed_and_rotated(fmt: str) -> None:
    model = _model()
    prefix, fresh = _prefix(model), _fresh(model)
    stored = [f.quantized(fmt) for f in fresh]
    assembled = assemble(prefix, stored, RopeTable.from_model(model, torch.device("cpu")))
    p = len(PREFIX)
    expected_values = torch.cat([f.dequantized().values for f in stored], dim=2)
    expected_keys = _rotated_by_the_model(model, torch.cat([f.dequantized().keys for f in stored], dim=2), p)
    assert torch.equal(assembled.keys[:, :, :p], prefix.keys) and torch.equal(assembled.values[:, :, :p], prefix.values)
    assert torch.equal(assembled.values[:, :, p:], expected_values)
    torch.testing.assert_close(assembled.keys[:, :, p:], expected_keys, rtol=0, atol=1e-6)
    assert torch.equal(assembled.token_ids, torch.cat([prefix.token_ids, *[f.token_ids for f in fresh]]))
    # and it is not the unquantised segment: the 8-bit rounding is really there, within the format's bound
    plain = assemble(prefix, fresh, RopeTable.from_model(model, torch.device("cpu")))
    difference = (assembled.values[:, :, p:] - plain.values[:, :, p:]).abs().amax()
    assert 0 < float(difference) <= 2.0**-4 * float(plain.values[:, :, p:].abs().amax())


def test_facts_of_mixed_formats_are_each_dequantised_in_one_segment() -> None:
    model = _model()
    prefix, fresh = _prefix(model), _fresh(model)
    table = RopeTable.from_model(model, torch.device("cpu"))
    mixed = [fresh[0], fresh[1].quantized("int8"), fresh[2].quantized("float8_e4m3")]
    got = assemble(prefix, mixed, table)
    want = assemble(prefix, [f.dequantized(torch.float32) for f in mixed], table)
    assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)


def test_an_8bit_fact_is_dequantised_to_the_cache_dtype() -> None:
    model = _model()
    prefix, fresh = _prefix(model), _fresh(model)
    half = PrefixKV(prefix.keys.bfloat16(), prefix.values.bfloat16(), prefix.token_ids)
    got = assemble(half, [f.quantized("int8") for f in fresh], RopeTable.from_model(model, torch.device("cpu")))
    assert got.keys.dtype == torch.bfloat16
    p = len(PREFIX)
    assert torch.equal(
        got.values[:, :, p:], torch.cat([f.quantized("int8").dequantized(torch.bfloat16).values for f in fresh], 2)
    )
    with pytest.raises(ValueError, match="float32"):
        assemble(half, fresh, RopeTable.from_model(model, torch.device("cpu")))  # unquantised: must match already


# ---------------------------------------------------------------- the K/V manager
class _Engine:
    """The engine surface FactKVManager uses, over a tiny model; counts the facts it encodes."""

    fingerprint = "e" * 32

    def __init__(self) -> None:
        model = _model()
        self.max_context_tokens = int(model.config.max_position_embeddings)
        self._encoder = FactEncoder(model)
        self.encoded = 0

    def system_prefix_ids(self) -> list[int]:
        return list(PREFIX)

    def fact_token_ids(self, text: str) -> list[int]:
        return [3 + b % 250 for b in text.encode()]

    def context_token_ids(self, turns: list[str]) -> list[int]:
        return [t for turn in turns for t in self.fact_token_ids(turn)]

    def control_token_texts(self) -> frozenset[str]:
        return frozenset()  # byte ids: no text is read as a control token

    def encode_facts(self, requests: list[EncodeRequest]) -> list[FactKV]:
        self.encoded += len(requests)
        return self._encoder.encode(requests)


class _Rows:
    """The ``kv_entries`` surface of the SQL store: the rows written, by (memory, encoding key)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}

    def put_kv_entry(self, **row: Any) -> None:
        self.rows[(row["memory_id"], row["encoding_key"])] = row

    def delete_kv_entries(self, memory_id: str) -> None:
        self.rows = {k: v for k, v in self.rows.items() if k[0] != memory_id}

    def run_read(self, query: Any, *args: Any) -> list[Any]:
        """The rows of older key formats a prune reads (``kv_entries_of``): none, every row here is the manager's."""
        return []


def _record(memory_id: str, text: str) -> MemoryRecord:
    from datetime import UTC, datetime
    from hashlib import sha256

    now = datetime.now(UTC)
    return MemoryRecord(memory_id, 1, text, sha256(text.encode()).hexdigest(), "u", None, None, {}, [], now, now)


def _manager(tmp_path: Path, engine: _Engine, rows: _Rows, fmt: str) -> FactKVManager:
    store = TieredKVStore(tmp_path / "kv", fsync=False)
    config = KVConfig(context_window=0, storage_format=cast(Any, fmt))
    return FactKVManager(cast(Any, engine), store, cast(Any, rows), config)


def test_facts_are_quantised_once_when_stored_and_served_as_stored(tmp_path: Path) -> None:
    engine, rows = _Engine(), _Rows()
    manager = _manager(tmp_path, engine, rows, "int8")
    records = [_record("m1", "I live in Lisbon."), _record("m2", "My sister is a nurse.")]
    first = manager.ensure(records)
    fresh = engine.encode_facts([manager.encode_request(r) for r in records])
    assert engine.encoded == 4
    for got, want in zip(first, fresh, strict=True):
        assert got.storage_format == "int8" and got.source is not None
        assert torch.equal(got.keys, want.quantized("int8").keys)  # quantised from the pre-RoPE encoding
    again = _manager(tmp_path, engine, rows, "int8").ensure(records)  # a new store: read from disk
    assert engine.encoded == 4  # hits, nothing encoded again
    assert all(torch.equal(a.values, b.values) and a.scales is not None for a, b in zip(again, first, strict=True))
    assert "kv=int8:k=channel,v=token" in manager.key(records[0]).encoding_key
    assert [row["nbytes"] for row in rows.rows.values()] == [f.nbytes for f in first]  # the 8-bit size


def test_switching_the_format_re_encodes_and_keeps_the_other_formats_entries(tmp_path: Path) -> None:
    engine, rows = _Engine(), _Rows()
    records = [_record("m1", "I live in Lisbon.")]
    first = _manager(tmp_path, engine, rows, "model").ensure(records)
    served = _manager(tmp_path, engine, rows, "float8_e4m3").ensure(records)
    assert engine.encoded == 2 and served[0].storage_format == "float8_e4m3"  # a miss: encoded again, quantised
    assert len(list((tmp_path / "kv" / "m1").glob("*.safetensors"))) == 2  # each format's entry under its own key
    back = _manager(tmp_path, engine, rows, "model").ensure(records)  # another client may still use the first
    assert engine.encoded == 2 and back[0].scales is None and torch.equal(back[0].keys, first[0].keys)
