"""vLLM's workers read the K/V store's files (:class:`inferscale.engines.vllm.segments.SegmentCache`): 8-bit entries
are dequantised on the worker's device, and a file whose tensors changed after it was written is refused, never
injected (vLLM stage: needs vllm)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inferscale.kv import FactKV, KVKey
from inferscale.kv.tiers import DiskTier

pytest.importorskip("vllm", reason="the vLLM engine package needs vllm (make install-vllm)")

from inferscale.engines.vllm.metadata import SegmentRef
from inferscale.engines.vllm.segments import SegmentCache, SegmentError

KEY = KVKey("m1", "h1", "fp-a", "w=0;prefix=system;v1")


def _stored(tmp_path: Path, storage_format: str) -> tuple[FactKV, str]:
    """A random fact ``[2, 2, 5, 8]`` float32 stored by the disk tier in ``storage_format``, and its file."""
    g = torch.Generator().manual_seed(7)
    fact = FactKV(torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g), torch.arange(5), 3)
    stored = fact if storage_format == "model" else fact.quantized(storage_format)
    disk = DiskTier(tmp_path)
    disk.put(KEY, stored)
    return stored, str(disk.path(KEY))


def test_segment_cache_dequantises_a_stored_8bit_file_on_its_device(tmp_path: Path) -> None:
    stored, path = _stored(tmp_path, "int8")
    keys, values = SegmentCache(torch.device("cpu")).get(SegmentRef(path, "u1"))
    want = stored.dequantized()
    assert keys.dtype == torch.float32 and torch.equal(keys, want.keys) and torch.equal(values, want.values)


@pytest.mark.parametrize("storage_format", ["model", "int8"])
def test_segment_cache_refuses_a_file_whose_tensors_changed_after_it_was_written(
    tmp_path: Path, storage_format: str
) -> None:
    _, path = _stored(tmp_path, storage_format)
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name).clone() for name in handle.keys()}  # noqa: SIM118
    tensors["values"].view(-1)[0] += 1
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(SegmentError, match="was changed after it was written"):
        SegmentCache(torch.device("cpu")).get(SegmentRef(path, "u1"))


@pytest.mark.parametrize("staged", [False, True], ids=["store-file", "staged-segment"])
def test_segment_cache_refuses_a_file_whose_header_changed_after_it_was_written(tmp_path: Path, staged: bool) -> None:
    """The header has a checksum of its own (a review's find: staged segment files were written without one)."""
    from inferscale.engines.vllm import write_segment

    stored, path = _stored(tmp_path, "model")
    if staged:
        path = str(tmp_path / "staged.safetensors")
        write_segment(Path(path), stored, KEY.fingerprint)
    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    assert metadata["header_checksum"].startswith("sha256:")
    save_file(tensors, path, metadata={**metadata, "fingerprint": "fp-b", "encoded_at": "4"})
    with pytest.raises(SegmentError, match="header that does not match the checksum"):
        SegmentCache(torch.device("cpu")).get(SegmentRef(path, "u1"))
