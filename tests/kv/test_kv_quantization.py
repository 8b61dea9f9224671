"""8-bit K/V at rest (inferscale.kv.quantization): error bounds of each format, size on disk, formats in the key and
the file header, refusal of unknown or mismatched formats, and tier budgets counting the 8-bit bytes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import get_args

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import inferscale.config
import inferscale.kv.quantization
from inferscale.config import KVConfig
from inferscale.errors import ConfigError, InvalidInputError, KVFingerprintMismatchError
from inferscale.formats import StorageFormat
from inferscale.kv import FactKV, KVKey, TieredKVStore
from inferscale.kv.fingerprint import encoding_key, is_current_encoding
from inferscale.kv.quantization import FORMATS, STORAGE_FORMATS, quant_format, storage_tag
from inferscale.kv.tiers import DiskTier, HostTier, KVFormatError
from inferscale.kv.tiers.serialization import KVChecksumError, fact_from_payload, fact_to_payload, header_checksum
from inferscale.mem0_config import config_from_dict

# SmolLM2-135M's K/V layout: 30 layers, 3 KV heads, head_dim 64 (23,040 bytes per token in bfloat16).
SMOL = (30, 3, 64)


def kv_like(
    n_tokens: int, seed: int = 0, shape: tuple[int, int, int] = SMOL, dtype: torch.dtype = torch.float32
) -> FactKV:
    """Random K/V with the features real ones have: a few outlier key channels (x20) and token-to-token spread of
    the values' magnitude (x0.1 to x3), so per-channel and per-token scales matter."""
    layers, heads, head_dim = shape
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(layers, heads, n_tokens, head_dim, generator=g)
    keys[..., :: head_dim // 4] *= 20
    values = torch.randn(layers, heads, n_tokens, head_dim, generator=g)
    values *= torch.empty(layers, heads, n_tokens, 1).uniform_(0.1, 3, generator=g)
    return FactKV(keys.to(dtype), values.to(dtype), torch.arange(n_tokens), 7)


def key_for(fmt: str, memory_id: str = "m1") -> KVKey:
    return KVKey(memory_id, "h" * 64, "f" * 32, encoding_key("d" * 64, ["a turn"], 5, 0, fmt))


# ---------------------------------------------------------------- error bounds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float8_round_trip_is_within_half_an_e4m3_ulp(dtype: torch.dtype) -> None:
    original = kv_like(24, dtype=dtype)
    stored = original.quantized("float8_e4m3")
    assert stored.keys.dtype == torch.float8_e4m3fn and stored.scales is not None
    assert stored.scales.keys.shape == (30, 3, 1, 1) and stored.scales.values.shape == (30, 3, 1, 1)
    codes = stored.keys.float().abs().amax(dim=(2, 3))
    assert bool((codes == 448).all())  # each (layer, head)'s amax maps to e4m3's largest code
    back = stored.dequantized(torch.float32)
    for x, x_hat, scale in (
        (original.keys, back.keys, stored.scales.keys),
        (original.values, back.values, stored.scales.values),
    ):
        x = x.float()
        s = scale.expand_as(x)
        error = (x_hat - x).abs()
        # 3 mantissa bits: half an ulp is 2^-4 of |x| for normals; below 2^-6 (subnormals) the step is 2^-9 of s.
        bound = 2.0**-4 * x.abs() + 2.0**-10 * s
        assert bool((error <= bound * (1 + 1e-6)).all())
        assert float((error / x.abs().clamp_min(1e-30)).amax()) > 2.0**-6  # the bound is not vacuous


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_round_trip_is_within_half_a_step_in_the_kivi_layout(dtype: torch.dtype) -> None:
    original = kv_like(24, dtype=dtype)
    stored = original.quantized("int8")
    scales = stored.scales
    assert stored.keys.dtype == torch.uint8 and scales is not None
    assert scales.key_offsets is not None and scales.value_offsets is not None
    assert scales.keys.shape == scales.key_offsets.shape == (30, 3, 1, 64)  # keys: per channel, over the tokens
    assert scales.values.shape == scales.value_offsets.shape == (30, 3, 24, 1)  # values: per token, over head_dim
    assert scales.keys.dtype == scales.values.dtype == scales.key_offsets.dtype == torch.bfloat16
    # every group's codes span most of 0..255: the offset is rounded down and the scale up to bfloat16, which here
    # leaves at most a few codes unused at either end
    for codes, reduced in ((stored.keys, 2), (stored.values, 3)):
        assert bool((codes.amin(dim=reduced) <= 3).all()) and bool((codes.amax(dim=reduced) >= 250).all())
    back = stored.dequantized(torch.float32)
    for x, x_hat, scale, offset in (
        (original.keys, back.keys, scales.keys, scales.key_offsets),
        (original.values, back.values, scales.values, scales.value_offsets),
    ):
        x = x.float()
        error = (x_hat - x).abs()
        s = scale.float().expand_as(error)
        # the offset rounded down and the scale up: the group's range stays covered, so no code is clamped
        assert bool((offset.float().expand_as(x) <= x).all()) and bool((x <= (offset.float() + 255 * s)).all())
        assert bool((error <= s / 2 + 1e-6 * x.abs()).all())
        assert float((error / s).amax()) > 0.45  # rounding really uses the whole half step
        assert float((s / ((x.amax() - x.amin()) / 255)).amax()) < 1  # each group's own range, not the tensor's


def test_affine_codes_halve_the_error_of_symmetric_ones_on_offset_channels() -> None:
    """A key channel whose values sit away from zero (pre-RoPE keys have them) keeps all 256 steps for its own
    range: symmetric codes spent half of them on the sign, and most on the distance from zero."""
    keys = torch.linspace(5.0, 6.0, 2 * 1 * 16 * 8).reshape(2, 1, 16, 8)
    fact = FactKV(keys, keys.clone(), torch.arange(16), 0)
    error = (fact.quantized("int8").dequantized(torch.float32).keys - keys).abs().amax()
    symmetric_step = float(keys.abs().amax()) / 127  # what int8 codes of amax/127 would round to
    assert float(error) <= symmetric_step / 8


def test_per_channel_key_scales_keep_small_channels_exact_despite_outliers() -> None:
    original = kv_like(24)
    stored = original.quantized("int8")
    assert stored.scales is not None
    scale = stored.scales.keys.float()
    # channel 0 holds outliers (x20), channel 1 none: each has its own scale, so channel 1's steps stay small
    assert bool((scale[..., 1] < scale[..., 0] / 8).all())
    error = (stored.dequantized(torch.float32).keys[..., 1] - original.keys[..., 1]).abs()
    assert bool((error <= scale[..., 1] / 2 * (1 + 1e-5)).all())


def test_a_group_of_zeros_is_stored_as_zeros() -> None:
    zeros = FactKV(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4), torch.arange(3), 0)
    for fmt in FORMATS:
        back = zeros.quantized(fmt).dequantized()
        assert torch.equal(back.keys, zeros.keys) and torch.equal(back.values, zeros.values)


def test_dequantized_gives_back_the_dtype_quantised_from() -> None:
    original = kv_like(5, dtype=torch.bfloat16)
    stored = original.quantized("int8")
    assert stored.dtype == torch.bfloat16 and stored.dequantized().keys.dtype == torch.bfloat16
    assert stored.storage_format == "int8" and original.storage_format == "model"
    assert original.quantized("model") is original and stored.quantized("int8") is stored


# ---------------------------------------------------------------- size
def file_bytes(tmp_path: Path, fact: FactKV, fmt: str) -> int:
    disk = DiskTier(tmp_path / fmt, fsync=False)
    key = key_for(fmt)
    disk.put(key, fact.quantized(fmt))
    return disk.path(key).stat().st_size


def test_8bit_files_are_about_half_a_bfloat16_file(tmp_path: Path) -> None:
    # 21 tokens: the demo's mean memory (9.8 MB for 20 memories at 23 KB per token).
    fact = kv_like(21, dtype=torch.bfloat16)
    bf16 = file_bytes(tmp_path, fact, "model")
    assert bf16 > 21 * 23_040
    assert bf16 / file_bytes(tmp_path, fact, "float8_e4m3") >= 1.9
    # int8's per-channel key scales and offsets cost one bf16 token per fact (2 x bfloat16, 30 x 3 x 64): ~1.8x at
    # 21 tokens, >= 1.9x from about 100 tokens.
    assert bf16 / file_bytes(tmp_path, fact, "int8") >= 1.75
    long = kv_like(128, dtype=torch.bfloat16)
    assert file_bytes(tmp_path / "long", long, "model") / file_bytes(tmp_path / "long", long, "int8") >= 1.9


def test_host_tier_budget_counts_codes_and_scales() -> None:
    model = kv_like(8, shape=(4, 2, 16), dtype=torch.bfloat16)
    stored = model.quantized("int8")
    assert stored.scales is not None
    expected = 2 * 4 * 2 * 8 * 16 + 2 * 2 * (4 * 2 * 16 + 4 * 2 * 8)  # codes + bfloat16 scales and offsets
    assert stored.nbytes == expected < model.nbytes
    host = HostTier(budget_bytes=4 * expected, pin_memory=False)
    for i in range(5):
        host.put(key_for("int8", f"m{i}"), stored)
    assert len(host) == 4 and host.nbytes == 4 * expected  # four 8-bit entries fit where two bf16 ones would
    placed = host.get(key_for("int8", "m4"))
    assert placed is not None and placed.scales is not None and placed.keys.dtype == torch.uint8
    store = TieredKVStore(None, host_budget_bytes=4 * expected)
    store.put(key_for("int8"), stored)
    assert store.host_bytes == expected and store.stats().nbytes["host"] == expected


# ---------------------------------------------------------------- formats in the key and in the file
def test_keys_of_different_formats_never_collide() -> None:
    keys = {fmt: key_for(fmt) for fmt in STORAGE_FORMATS}
    assert len({k.encoding_key for k in keys.values()}) == len({k.digest() for k in keys.values()}) == 3
    assert "kv=" not in keys["model"].encoding_key  # model-dtype keys are the ones written before 8-bit storage
    assert keys["int8"].storage_tag == "int8:k=channel,v=token,offset" == storage_tag("int8")
    assert keys["float8_e4m3"].storage_tag == "float8_e4m3:k=head,v=head"
    assert keys["model"].storage_tag == "model"


def test_a_lookup_under_one_format_never_returns_another(tmp_path: Path) -> None:
    store = TieredKVStore(tmp_path, fsync=False)
    fact = kv_like(4, shape=(2, 1, 8))
    store.put(key_for("int8"), fact.quantized("int8"))
    assert store.get(key_for("float8_e4m3")) is None and store.get(key_for("model")) is None
    fresh = TieredKVStore(tmp_path, fsync=False)  # from disk
    got = fresh.get(key_for("int8"))
    assert got is not None and got.storage_format == "int8" and got.source is not None
    assert torch.equal(got.keys, fact.quantized("int8").keys)
    with pytest.raises(InvalidInputError, match="cannot be written under a key"):
        store.put(key_for("float8_e4m3"), fact.quantized("int8"))
    with pytest.raises(InvalidInputError):
        store.put(key_for("model"), fact.quantized("float8_e4m3"))
    # a file copied under another format's key is refused, never read as that format
    disk = DiskTier(tmp_path, fsync=False)
    disk.path(key_for("float8_e4m3")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(disk.path(key_for("int8")), disk.path(key_for("float8_e4m3")))
    with pytest.raises(KVFingerprintMismatchError, match="encoding_key"):
        TieredKVStore(tmp_path, fsync=False).get(key_for("float8_e4m3"))


def test_the_file_header_records_the_format_and_scale_layout() -> None:
    tensors, metadata = fact_to_payload(key_for("int8"), kv_like(3, shape=(2, 1, 8)).quantized("int8"))
    assert metadata["format"] == "inferscale.kv/2"  # a reader of inferscale.kv/1 only refuses it
    assert (metadata["storage_format"], metadata["key_scale"], metadata["value_scale"]) == ("int8", "channel", "token")
    assert metadata["kv_dtype"] == "float32" and metadata["storage_tag"] == "int8:k=channel,v=token,offset"
    assert set(tensors) == {"keys", "values", "key_scale", "value_scale", "key_offset", "value_offset", "token_ids"}
    _, float8 = fact_to_payload(key_for("float8_e4m3"), kv_like(3, shape=(2, 1, 8)).quantized("float8_e4m3"))
    assert float8["storage_tag"] == "float8_e4m3:k=head,v=head"
    _, plain = fact_to_payload(key_for("model"), kv_like(3, shape=(2, 1, 8)))
    assert plain["format"] == "inferscale.kv/1" and plain["storage_format"] == "model"


def rewrite(path: Path, **changes: str) -> None:
    """Write ``path`` again with ``changes`` to its header, as a writer of that layout would (the header checksum
    recomputed: a header changed in place is damage, tests/api/test_damaged_kv_file.py)."""
    tensors = load_file(str(path))
    with safe_open(str(path), framework="pt") as handle:
        metadata = {**(handle.metadata() or {}), **changes}
    save_file(tensors, str(path), metadata={**metadata, "header_checksum": header_checksum(metadata)})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"storage_format": "int4"}, "stored as 'int4'"),
        ({"storage_tag": "int8:k=head,v=token,offset"}, "stored as 'int8:k=head"),
        ({"kv_dtype": "float64"}, "kv_dtype"),
        ({"format": "inferscale.kv/1"}, "format"),
        ({"format": "inferscale.kv/9"}, "format"),
        (
            {
                "storage_format": "float8_e4m3",
                "storage_tag": "float8_e4m3:k=head,v=head",
                "key_scale": "head",
                "value_scale": "head",
            },
            "must be",
        ),
    ],
)
def test_a_file_of_an_unknown_or_inconsistent_format_is_refused(
    tmp_path: Path, changes: dict[str, str], message: str
) -> None:
    disk = DiskTier(tmp_path, fsync=False)
    disk.put(key_for("int8"), kv_like(3, shape=(2, 1, 8)).quantized("int8"))
    rewrite(disk.path(key_for("int8")), **changes)
    with pytest.raises(KVFormatError, match=message):
        disk.get(key_for("int8"))


def test_a_file_whose_header_format_differs_from_its_key_is_refused(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, fsync=False)
    disk.put(key_for("model"), kv_like(3, shape=(2, 1, 8)))
    int8 = kv_like(3, shape=(2, 1, 8)).quantized("int8")
    tensors, metadata = fact_to_payload(key_for("model"), int8)  # an int8 file under a model-dtype key
    save_file(tensors, str(disk.path(key_for("model"))), metadata=metadata)
    with pytest.raises(KVFormatError, match="under a key for 'model'"):
        disk.get(key_for("model"))


def test_scales_that_do_not_fit_the_format_are_refused() -> None:
    tensors, metadata = fact_to_payload(key_for("int8"), kv_like(3, shape=(2, 1, 8)).quantized("int8"))
    with pytest.raises(KVChecksumError):  # tensors other than those written: refused before they are read
        fact_from_payload({**tensors, "key_scale": tensors["key_scale"][..., :4]}, metadata, "mem")
    del metadata["checksum"], metadata["header_checksum"]  # a file written before checksums: its layout is checked
    with pytest.raises(KVFormatError, match=r"scales must be torch\.bfloat16"):
        fact_from_payload({**tensors, "key_scale": tensors["key_scale"][..., :4]}, metadata, "mem")
    with pytest.raises(KVFormatError, match=r"offsets must be torch\.bfloat16"):
        fact_from_payload({**tensors, "value_offset": tensors["value_offset"].float()}, metadata, "mem")
    for name in ("value_scale", "key_offset"):
        with pytest.raises(KVFormatError, match="lacks"):
            fact_from_payload({k: v for k, v in tensors.items() if k != name}, metadata, "mem")


def test_an_int8_entry_written_before_offsets_is_refused_by_name_and_pruned() -> None:
    """int8 was symmetric: ``int8`` codes, float32 scales, no offsets, no ``storage_tag`` in the header, and
    ``kv=int8:k=channel,v=token`` in its key. Its key never matches this version's (a miss: encoded again), the
    store prunes it as an older key format (:func:`is_current_encoding`), and its file, read directly, is refused
    by name, never read as affine codes."""
    old_key = KVKey("m1", "h" * 64, "f" * 32, key_for("int8").encoding_key.replace(",offset", ""))
    assert old_key.storage_tag == "int8:k=channel,v=token" and old_key.digest() != key_for("int8").digest()
    assert not is_current_encoding(old_key.encoding_key)
    assert all(is_current_encoding(key_for(fmt).encoding_key) for fmt in STORAGE_FORMATS)
    codes = torch.zeros(2, 1, 3, 8, dtype=torch.int8)
    tensors = {
        "keys": codes,
        "values": codes.clone(),
        "key_scale": torch.ones(2, 1, 1, 8),
        "value_scale": torch.ones(2, 1, 3, 1),
        "token_ids": torch.arange(3),
    }
    metadata = {
        "format": "inferscale.kv/2",
        "storage_format": "int8",
        "key_scale": "channel",
        "value_scale": "token",
        "kv_dtype": "bfloat16",
        "memory_id": "m1",
        "text_hash": "h" * 64,
        "fingerprint": "f" * 32,
        "encoding_key": old_key.encoding_key,
        "encoded_at": "0",
    }
    with pytest.raises(KVFormatError, match="stored as 'int8:k=channel,v=token'; this version reads"):
        fact_from_payload(tensors, metadata, "old.safetensors")


def test_a_float8_file_written_before_storage_tag_still_reads() -> None:
    """float8's layout did not change: its files without ``storage_tag`` read as they did."""
    fact = kv_like(3, shape=(2, 1, 8)).quantized("float8_e4m3")
    tensors, metadata = fact_to_payload(key_for("float8_e4m3"), fact)
    del metadata["storage_tag"], metadata["header_checksum"]
    back = fact_from_payload(tensors, metadata, "old.safetensors")
    assert back.storage_format == "float8_e4m3" and torch.equal(back.keys.float(), fact.keys.float())


def test_a_header_whose_scale_layout_contradicts_its_tag_is_refused() -> None:
    tensors, metadata = fact_to_payload(key_for("int8"), kv_like(3, shape=(2, 1, 8)).quantized("int8"))
    del metadata["checksum"], metadata["header_checksum"]
    with pytest.raises(KVFormatError, match="scales per"):
        fact_from_payload(tensors, {**metadata, "value_scale": "head"}, "mem")


# ---------------------------------------------------------------- mixing formats, bad names
def test_quantising_8bit_kv_again_to_another_format_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="round them twice"):
        kv_like(3, shape=(2, 1, 8)).quantized("float8_e4m3").quantized("int8")


@pytest.mark.parametrize("bad", ["int4", "fp8", "bfloat16", ""])
def test_an_unknown_format_name_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="storage_format"):
        config_from_dict({"kv": {"storage_format": bad}})
    with pytest.raises(ConfigError, match="unknown K/V storage format"):
        quant_format(bad)
    with pytest.raises(ConfigError):
        encoding_key(None, [], 0, 0, bad)
    with pytest.raises(ConfigError):
        kv_like(3, shape=(2, 1, 8)).quantized(bad)


def test_the_config_offers_exactly_the_formats_the_kv_core_implements() -> None:
    """One definition of the format names (inferscale.formats, layer 0), used by the settings and the KV core; it
    was written out in both."""
    assert inferscale.config.StorageFormat is StorageFormat
    assert inferscale.kv.quantization.StorageFormat is StorageFormat  # re-exported: in its __all__
    assert get_args(StorageFormat) == STORAGE_FORMATS == ("model", "float8_e4m3", "int8")
    assert get_args(KVConfig.model_fields["storage_format"].annotation) == STORAGE_FORMATS
    assert KVConfig().storage_format == "model"
    assert set(STORAGE_FORMATS) == {"model", *FORMATS}
