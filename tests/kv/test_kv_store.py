"""The tiered KV store: one interface per tier, LRU eviction, write-through, promotion, restart, refusal."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inferscale.errors import ConfigError, InvalidInputError, KVFingerprintMismatchError
from inferscale.kv import FactKV, KVKey, KVStore, TieredKVStore
from inferscale.kv.tiers import DeviceTier, DiskTier, HostTier, KVFormatError, KVTier, LRUPolicy
from inferscale.kv.tiers.serialization import KVChecksumError, fact_from_payload, fact_to_payload, tensors_checksum

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA (device tier, pinned host memory); this machine has none")
cpu_only = pytest.mark.skipif(CUDA, reason="checks the error raised on machines without CUDA")

LAYERS, HEADS, HEAD_DIM = 3, 2, 8


def fact(seed: int, n_tokens: int = 4, dtype: torch.dtype = torch.float32, encoded_at: int = 0) -> FactKV:
    """A random fact of ``[3, 2, n_tokens, 8]`` K/V (``2 * 48 * n_tokens * itemsize`` bytes)."""
    g = torch.Generator().manual_seed(seed)
    shape = (LAYERS, HEADS, n_tokens, HEAD_DIM)
    return FactKV(
        torch.randn(shape, generator=g).to(dtype),
        torch.randn(shape, generator=g).to(dtype),
        torch.randint(0, 1000, (n_tokens,), generator=g),
        encoded_at,
    )


def key(memory_id: str = "m1", fingerprint: str = "fp-a", text_hash: str = "h1") -> KVKey:
    return KVKey(memory_id, text_hash, fingerprint, "w=0;prefix=system;v1")


def same(a: FactKV | None, b: FactKV) -> bool:
    """Bit-exact equality of K, V, token ids and ``encoded_at`` (dtype included)."""
    assert a is not None
    return (
        a.keys.dtype == b.keys.dtype
        and torch.equal(a.keys.cpu(), b.keys.cpu())
        and torch.equal(a.values.cpu(), b.values.cpu())
        and torch.equal(a.token_ids, b.token_ids)
        and a.encoded_at == b.encoded_at
    )


FACT_BYTES = fact(0).nbytes  # 768 bytes at fp32, 4 tokens


# ---------------------------------------------------------------- keys, policy, serialisation
@pytest.mark.parametrize("memory_id", ["", "../etc", "a/b", ".hidden", "x" * 129])
def test_key_rejects_ids_that_are_not_plain_path_components(memory_id: str) -> None:
    with pytest.raises(InvalidInputError, match=r"memory.id"):
        key(memory_id)


def test_key_digest_covers_every_field() -> None:
    base = key()
    others = [key(fingerprint="fp-b"), key(text_hash="h2"), key("m2"), KVKey("m1", "h1", "fp-a", "w=1")]
    assert len({base.digest(), *(k.digest() for k in others)}) == 5


def test_lru_policy_evicts_least_recently_used_first() -> None:
    policy = LRUPolicy(budget_bytes=300)
    assert policy.admit(key("a"), 100) == []
    assert policy.admit(key("b"), 100) == []
    assert policy.admit(key("c"), 100) == []
    policy.touch(key("a"))
    assert policy.admit(key("d"), 150) == [key("b"), key("c")]
    assert policy.nbytes == 250 and len(policy) == 2
    assert policy.admit(key("a"), 120) == []  # re-sizing an admitted key does not count it twice
    assert policy.nbytes == 270


def test_lru_policy_refuses_an_entry_larger_than_the_budget() -> None:
    policy = LRUPolicy(budget_bytes=100)
    policy.admit(key("a"), 60)
    assert policy.admit(key("big"), 101) == [key("big")]
    assert key("a") in policy and key("big") not in policy and policy.nbytes == 60
    with pytest.raises(InvalidInputError):
        LRUPolicy(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_serialisation_round_trip_is_bit_exact_and_records_the_key(dtype: torch.dtype) -> None:
    original = fact(1, dtype=dtype, encoded_at=17)
    tensors, metadata = fact_to_payload(key(), original)
    assert {m: metadata[m] for m in ("memory_id", "text_hash", "fingerprint", "encoding_key")} == {
        "memory_id": "m1",
        "text_hash": "h1",
        "fingerprint": "fp-a",
        "encoding_key": "w=0;prefix=system;v1",
    }
    assert same(fact_from_payload(tensors, metadata, "mem"), original)
    with pytest.raises(KVFormatError):
        fact_from_payload({"keys": tensors["keys"]}, metadata, "mem")


# ---------------------------------------------------------------- host tier
def test_every_tier_implements_the_tier_interface(tmp_path: Path) -> None:
    assert isinstance(HostTier(1 << 20), KVTier)
    assert isinstance(DiskTier(tmp_path), KVTier)


def test_host_tier_keeps_its_byte_budget_and_returns_what_it_evicts() -> None:
    host = HostTier(budget_bytes=2 * FACT_BYTES, pin_memory=False)
    a, b, c = fact(1), fact(2), fact(3)
    assert host.put(key("a"), a) == [] and host.put(key("b"), b) == []
    assert same(host.get(key("a")), a)  # a is now the most recently used
    evicted = host.put(key("c"), c)
    assert [k for k, _ in evicted] == [key("b")] and same(evicted[0][1], b)
    held = host.keys()
    assert host.nbytes == 2 * FACT_BYTES and sorted(k.memory_id for k in held) == ["a", "c"]
    assert host.get(key("b")) is None


def test_host_tier_hands_back_an_entry_larger_than_its_budget() -> None:
    host = HostTier(budget_bytes=FACT_BYTES - 1, pin_memory=False)
    big = fact(1)
    assert host.put(key(), big) == [(key(), big)]
    assert host.nbytes == 0 and host.get(key()) is None


def test_host_tier_does_not_keep_a_larger_buffer_alive_through_a_view() -> None:
    batch = torch.randn(LAYERS, 4, HEADS, 6, HEAD_DIM)  # like an encoded batch: a fact is a slice of it
    view = FactKV(batch[:, 1], batch[:, 2], torch.arange(6), 0)
    host = HostTier(1 << 20, pin_memory=False)
    host.put(key(), view)
    stored = host.get(key())
    assert stored is not None
    assert stored.keys.untyped_storage().nbytes() == stored.keys.numel() * stored.keys.element_size()
    assert host.nbytes == view.nbytes


def test_host_tier_delete_memory_and_clear() -> None:
    host = HostTier(1 << 20, pin_memory=False)
    host.put(key("a"), fact(1))
    host.put(key("a", fingerprint="fp-b"), fact(2))
    host.put(key("b"), fact(3))
    assert host.delete_memory("a") == 2
    assert host.keys() == [key("b")] and host.nbytes == FACT_BYTES
    host.clear()
    assert host.keys() == [] and host.nbytes == 0


@cpu_only
def test_pinned_host_memory_needs_cuda() -> None:
    with pytest.raises(ConfigError, match="pin_memory"):
        HostTier(1 << 20, pin_memory=True)
    assert not HostTier(1 << 20).pinned


@needs_cuda
def test_host_tier_pins_memory_with_cuda() -> None:
    host = HostTier(1 << 20)
    host.put(key(), fact(1).to("cuda"))
    stored = host.get(key())
    assert host.pinned and stored is not None and stored.keys.is_pinned() and stored.keys.device.type == "cpu"


# ---------------------------------------------------------------- device tier
@cpu_only
def test_device_tier_cannot_be_built_without_cuda() -> None:
    with pytest.raises(ConfigError, match="CUDA"):
        DeviceTier("cuda", 1 << 20)
    with pytest.raises(ConfigError, match="CUDA"):
        TieredKVStore(None, device="cpu", device_budget_bytes=1 << 20)
    with pytest.raises(ConfigError, match="CUDA"):
        TieredKVStore(None, device="cuda")


def test_device_tier_refuses_a_cpu_device() -> None:
    with pytest.raises(ConfigError, match="CUDA tensors"):
        DeviceTier("cpu", 1 << 20)


@needs_cuda
def test_device_tier_keeps_tensors_on_the_gpu_under_its_budget() -> None:
    tier = DeviceTier("cuda", 2 * FACT_BYTES)
    assert tier.put(key("a"), fact(1)) == [] and tier.put(key("b"), fact(2)) == []
    evicted = tier.put(key("c"), fact(3))
    assert [k for k, _ in evicted] == [key("a")]
    stored = tier.get(key("c"))
    assert stored is not None and stored.keys.device.type == "cuda" and same(stored, fact(3))
    assert tier.nbytes == 2 * FACT_BYTES


# ---------------------------------------------------------------- disk tier
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_disk_tier_writes_one_safetensors_file_recording_the_full_key(tmp_path: Path, dtype: torch.dtype) -> None:
    disk = DiskTier(tmp_path / "kv")
    original = fact(5, n_tokens=7, dtype=dtype, encoded_at=12)
    disk.put(key(), original)
    path = disk.path(key())
    assert path.parent == tmp_path / "kv" / "m1" and path.suffix == ".safetensors"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left behind
    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
    assert (meta["memory_id"], meta["text_hash"], meta["fingerprint"]) == ("m1", "h1", "fp-a")
    assert meta["encoding_key"] == "w=0;prefix=system;v1" and meta["encoded_at"] == "12"
    assert same(disk.get(key()), original)
    assert disk.keys() == [key()] and disk.nbytes == path.stat().st_size
    assert disk.get(key(text_hash="other")) is None


@pytest.mark.parametrize("field", ["fingerprint", "text_hash"])
def test_disk_tier_refuses_a_file_recorded_under_another_key(tmp_path: Path, field: str) -> None:
    disk = DiskTier(tmp_path)
    written, requested = key(), key(**{field: "other"})
    disk.put(written, fact(1))
    shutil.copy(disk.path(written), disk.path(requested))  # e.g. a store copied from another model
    with pytest.raises(KVFingerprintMismatchError, match=field):
        disk.get(requested)


def test_an_unreadable_file_is_removed_and_is_a_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A file cut short (a full disk, an interrupted copy) raised safetensors' own error on every read: a chat that
    retrieved its memory failed, and nothing repaired it. It is a miss now, so the memory is encoded again."""
    disk = DiskTier(tmp_path)
    disk.put(key(), fact(1))
    path = disk.path(key())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert disk.get(key()) is None and not path.exists()
    assert f"the K/V file {path} is damaged: it is unreadable" in caplog.text
    disk.put(key(), fact(1))  # stored anew
    assert same(disk.get(key()), fact(1))


def _rewrite(path: Path, change: Callable[[dict[str, torch.Tensor], dict[str, str]], None]) -> None:
    """Rewrite the safetensors file ``path`` after ``change`` edits its tensors and header in place."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name).clone() for name in handle.keys()}  # noqa: SIM118
    change(tensors, metadata)
    save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize(
    ("storage", "tensor"),
    [
        ("model", "keys"),
        ("model", "values"),
        ("model", "token_ids"),
        ("int8", "keys"),
        ("int8", "key_scale"),
        ("int8", "value_scale"),
        ("int8", "key_offset"),
        ("int8", "value_offset"),
    ],
)
def test_a_file_whose_tensors_changed_in_place_is_removed_and_is_a_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, storage: str, tensor: str
) -> None:
    """Tensors changed under their own header (a failing disk, a tool that rewrote the file) read as valid K/V and
    were injected; the checksum written with them no longer matches, so the file is a damaged one."""
    stored = fact(1) if storage == "model" else fact(1).quantized(storage)
    disk = DiskTier(tmp_path)
    disk.put(key(), stored)
    path = disk.path(key())

    def bump_first_element(tensors: dict[str, torch.Tensor], _: dict[str, str]) -> None:
        tensors[tensor].view(-1)[0] += 1

    _rewrite(path, bump_first_element)
    assert disk.get(key()) is None and not path.exists()
    assert "do not match the checksum written with them" in caplog.text


def test_checksums_cover_dtype_and_shape_and_files_without_one_are_read(tmp_path: Path) -> None:
    tensors, _ = fact_to_payload(key(), fact(2))
    base = tensors_checksum(tensors)
    assert base == tensors_checksum({name: t.clone() for name, t in reversed(tensors.items())})
    assert base != tensors_checksum({**tensors, "keys": tensors["keys"].reshape(HEADS, LAYERS, -1, HEAD_DIM)})
    assert base != tensors_checksum({**tensors, "token_ids": tensors["token_ids"].view(torch.float64)})
    disk = DiskTier(tmp_path)
    disk.put(key(), fact(2))

    def written_before_checksums(_: object, metadata: dict[str, str]) -> None:
        del metadata["checksum"], metadata["header_checksum"]

    _rewrite(disk.path(key()), written_before_checksums)
    assert same(disk.get(key()), fact(2))
    with pytest.raises(KVChecksumError, match="refusing to inject it"):
        fact_from_payload({**tensors, "values": -tensors["values"]}, fact_to_payload(key(), fact(2))[1], "m1/x")


def test_disk_tier_clear_removes_only_its_own_files(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path)
    disk.put(key("a"), fact(1))
    disk.put(key("b"), fact(2))
    (tmp_path / "README.txt").write_text("not ours")
    (tmp_path / "b" / "notes.txt").write_text("not ours either")
    assert disk.delete_memory("a") == 1 and not (tmp_path / "a").exists()
    disk.clear()
    assert disk.keys() == []
    assert (tmp_path / "README.txt").exists() and (tmp_path / "b" / "notes.txt").exists()


def test_a_k_v_folder_gets_one_id_whoever_asks_first(tmp_path: Path) -> None:
    """The id is made once, by the first of many racing clients, and read back by the others and by later clients;
    asking whether there is one makes none, and clear() keeps it (rows of this folder still record it)."""
    root = tmp_path / "kv"
    assert DiskTier(root).existing_store_id() is None and not root.exists()
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: DiskTier(root).store_id(), range(32)))
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", next(iter(ids)))
    assert sorted(p.name for p in root.iterdir()) == ["store-id"]  # no temporary file left
    disk = DiskTier(root)
    disk.put(key("a"), fact(1))
    disk.clear()
    assert {DiskTier(root).existing_store_id(), DiskTier(root).store_id()} == ids
    assert DiskTier(tmp_path / "other").store_id() not in ids


def test_a_k_v_folder_id_is_made_on_a_file_system_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The id is linked into place from a complete temporary file; where links fail (some FUSE or FAT file
    systems), K/V would never have been stored: the file is created exclusively instead, still once."""

    def no_links(src: object, dst: object) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(os, "link", no_links)
    root = tmp_path / "kv"
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: DiskTier(root).store_id(), range(16)))
    assert len(ids) == 1 and (root / "store-id").read_text() == next(iter(ids))
    assert sorted(p.name for p in root.iterdir()) == ["store-id"]


def test_a_k_v_folder_id_file_removed_by_hand_is_written_again_with_the_same_id(tmp_path: Path) -> None:
    """A tester removed the K/V folder while a client ran: it kept writing files and rows under its cached id with no
    id file, so after a restart every row counted as another host's and reconciliation never repaired them."""
    root = tmp_path / "kv"
    disk = DiskTier(root)
    first = disk.store_id()
    shutil.rmtree(root)
    assert disk.store_id() == first and (root / "store-id").read_text() == first
    assert DiskTier(root).existing_store_id() == first  # a later process reads the same id


def test_a_k_v_folder_id_another_process_made_again_is_taken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A review's find: after the id file was removed, another process could make a new id first, and this one kept
    writing rows under its old id, which the folder no longer had."""
    root = tmp_path / "kv"
    disk = DiskTier(root)
    first = disk.store_id()
    shutil.rmtree(root)
    assert disk.existing_store_id() is None  # read from the folder, not remembered
    second = DiskTier(root).store_id()  # another process, first to make the folder again
    assert second != first and disk.existing_store_id() == second
    with caplog.at_level("WARNING", logger="inferscale.kv.tiers.disk"):
        assert disk.store_id() == second
    assert f"now has the id {second}, not {first}" in caplog.text


@pytest.mark.parametrize("content", [b"", b"not an id", b"A" * 32, b"0" * 33])
def test_a_k_v_folder_id_file_holding_no_id_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "store-id").write_bytes(content)
    for ask in (DiskTier.store_id, DiskTier.existing_store_id):
        with pytest.raises(KVFormatError, match="store-id should hold this K/V folder's id"):
            ask(DiskTier(tmp_path))
    assert (tmp_path / "store-id").read_bytes() == content


# ---------------------------------------------------------------- the composite store
def test_put_writes_through_to_disk_and_caches_in_host(tmp_path: Path) -> None:
    store = KVStore(tmp_path)
    original = fact(1)
    location = store.put(key(), original)
    assert Path(location).is_file() and location == store.location(key())
    assert store.host_bytes == FACT_BYTES
    assert same(store.get(key()), original)
    assert store.stats().hits == {"host": 1, "disk": 0}


def test_lookup_goes_host_then_disk_and_promotes_a_disk_hit(tmp_path: Path) -> None:
    KVStore(tmp_path).put(key(), fact(1))
    store = KVStore(tmp_path)  # empty memory tiers, same folder
    assert store.get(key("absent")) is None
    assert same(store.get(key()), fact(1))
    assert same(store.get(key()), fact(1))
    stats = store.stats()
    assert stats.hits == {"host": 1, "disk": 1} and stats.misses == 1 and stats.promotions == 1
    assert stats.entries == {"host": 1}


def test_an_entry_no_memory_tier_can_hold_is_neither_promoted_nor_dropped(tmp_path: Path) -> None:
    """A tester's find: with a host budget below one entry, every disk hit counted a promotion and a drop (5 gets:
    5 and 6), though nothing moved or was evicted. The counters follow what the tiers hold."""
    store = KVStore(tmp_path, host_budget_bytes=FACT_BYTES - 1)
    store.put(key(), fact(1))
    for _ in range(5):
        assert same(store.get(key()), fact(1))
    stats = store.stats()
    assert (stats.hits, stats.promotions, stats.demotions, stats.drops) == ({"host": 0, "disk": 5}, 0, 0, 0)
    assert stats.entries == {"host": 0}
    fits = KVStore(tmp_path, host_budget_bytes=FACT_BYTES)  # one entry: b evicts a, a's disk hit evicts b
    fits.put(key("a"), fact(1))
    fits.put(key("b"), fact(2))
    assert same(fits.get(key("a")), fact(1))
    stats = fits.stats()
    assert (stats.promotions, stats.drops, stats.entries) == (1, 2, {"host": 1})


def test_disk_sizes_and_keys_leave_out_files_removed_while_they_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tester's find: stats() raised a bare FileNotFoundError (53 of 3,000 calls) while another store on the same
    folder deleted memories: a memory's folder was listed, then gone before it was read. Here the other store removes
    folder ``a`` right as it is about to be read."""
    disk = DiskTier(tmp_path)
    disk.put(key("a"), fact(1))
    disk.put(key("b"), fact(2))
    size_of_b = disk.path(key("b")).stat().st_size
    real_scandir = os.scandir

    def removed_first(path: object = ".") -> object:
        if str(path).endswith(f"{os.sep}a"):
            shutil.rmtree(str(path), ignore_errors=True)
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", removed_first)
    assert disk.nbytes == size_of_b
    disk.put(key("a"), fact(1))
    assert disk.keys() == [key("b")]
    disk.put(key("a"), fact(1))
    assert KVStore(tmp_path, host_budget_bytes=0).stats().nbytes["disk"] == size_of_b


def test_a_file_another_store_removes_during_a_delete_or_clear_stops_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's find: delete_memory gave up at the first file another store had removed (the rest stayed), and
    clear() raised a bare FileNotFoundError for a folder removed after it was listed."""
    disk = DiskTier(tmp_path)
    for text_hash in ("h1", "h2", "h3"):
        disk.put(key("a", text_hash=text_hash), fact(1))
    real_unlink = os.unlink
    raced: list[str] = []

    def removed_first(path: object, *args: object, **kwargs: object) -> None:
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]
        if not raced:  # the other store got to the first file
            raced.append(str(path))
            raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(os, "unlink", removed_first)
    assert disk.delete_memory("a") == 3
    assert raced and not (tmp_path / "a").exists()
    monkeypatch.undo()
    disk.put(key("b"), fact(2))
    real_iterdir = Path.iterdir

    def folder_gone(self: Path) -> object:
        if self.name == "b":
            shutil.rmtree(self)
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", folder_gone)
    disk.clear()
    monkeypatch.undo()
    assert disk.keys() == []


def test_eviction_from_host_only_demotes_the_entry_to_disk(tmp_path: Path) -> None:
    store = KVStore(tmp_path, host_budget_bytes=2 * FACT_BYTES)
    for i in range(4):
        store.put(key(f"m{i}"), fact(i))
    assert store.host_bytes == 2 * FACT_BYTES and store.stats().drops == 2
    for i in range(4):  # every entry is still there, the evicted ones come back from disk
        assert same(store.get(key(f"m{i}")), fact(i))
    assert store.stats().hits["disk"] == 4  # m0, m1 evicted by m2, m3; then m2, m3 evicted by m0, m1


def test_entries_survive_a_restart_bit_exactly(tmp_path: Path) -> None:
    originals = {f"m{i}": fact(i, n_tokens=3 + i, dtype=torch.bfloat16, encoded_at=i) for i in range(3)}
    first = KVStore(tmp_path)
    for memory_id, f in originals.items():
        first.put(key(memory_id), f)
    del first
    second = KVStore(tmp_path)
    for memory_id, f in originals.items():
        assert same(second.get(key(memory_id)), f)
    assert second.stats().hits["disk"] == 3


def test_delete_memory_removes_it_from_every_tier(tmp_path: Path) -> None:
    store = KVStore(tmp_path)
    store.put(key("a"), fact(1))
    store.put(key("a", fingerprint="fp-b"), fact(2))
    store.put(key("b"), fact(3))
    assert store.delete_memory("a") == 4  # two entries, each in host and on disk
    assert store.get(key("a")) is None and store.get(key("a", fingerprint="fp-b")) is None
    assert KVStore(tmp_path).get(key("a")) is None  # gone from disk too
    assert same(store.get(key("b")), fact(3)) and store.host_bytes == FACT_BYTES


def test_a_file_written_under_another_fingerprint_is_refused_and_never_cached(tmp_path: Path) -> None:
    writer = KVStore(tmp_path)
    writer.put(key(fingerprint="fp-a"), fact(1))
    disk = DiskTier(tmp_path)
    shutil.copy(disk.path(key(fingerprint="fp-a")), disk.path(key(fingerprint="fp-b")))
    reader = KVStore(tmp_path)
    with pytest.raises(KVFingerprintMismatchError, match="fingerprint='fp-a'"):
        reader.get(key(fingerprint="fp-b"))
    assert reader.host_bytes == 0 and reader.stats().hits == {"host": 0, "disk": 0}
    assert same(reader.get(key(fingerprint="fp-a")), fact(1))  # the genuine entry is still served


def test_put_replaces_an_entry_and_clear_empties_every_tier(tmp_path: Path) -> None:
    store = KVStore(tmp_path)
    store.put(key(), fact(1))
    store.put(key(), fact(2))
    assert same(store.get(key()), fact(2)) and store.host_bytes == FACT_BYTES
    assert same(KVStore(tmp_path).get(key()), fact(2))
    store.clear()
    assert store.host_bytes == 0 and store.get(key()) is None and DiskTier(tmp_path).keys() == []


def test_entries_name_the_file_that_holds_them(tmp_path: Path) -> None:
    # Engines in another process (vLLM's workers) read the store's own file instead of a staged copy: every entry a
    # store with a disk tier hands back names its file, and that file holds exactly the entry's K/V.
    store = KVStore(tmp_path)
    original = fact(1, dtype=torch.bfloat16)
    location = store.put(key(), original)
    assert original.source is None  # the caller's object is not changed
    hit = store.get(key())
    assert hit is not None and hit.source == location
    with safe_open(location, framework="pt") as handle:
        assert torch.equal(handle.get_tensor("keys"), hit.keys) and torch.equal(handle.get_tensor("values"), hit.values)
    from_disk = KVStore(tmp_path).get(key())  # a restart: read from the file, promoted to host
    assert from_disk is not None and from_disk.source == location and same(from_disk, original)
    assert hit.to("cpu").source == location and hit.to("cpu", dtype=torch.float32).source is None
    memory_only = KVStore(None)
    memory_only.put(key(), original)
    assert memory_only.get(key()).source is None  # type: ignore[union-attr]


def test_a_store_without_a_directory_lives_in_host_memory() -> None:
    store = KVStore(None, host_budget_bytes=FACT_BYTES)
    assert [t.name for t in store.tiers] == ["host"]
    assert store.put(key("a"), fact(1)) == "host"
    store.put(key("b"), fact(2))
    assert store.get(key("a")) is None and same(store.get(key("b")), fact(2))


def test_get_returns_tensors_on_the_store_device(tmp_path: Path) -> None:
    store = TieredKVStore(tmp_path, device="cpu")
    store.put(key(), fact(1))
    got = KVStore(tmp_path).get(key())
    assert got is not None and got.keys.device.type == "cpu" and got.token_ids.device.type == "cpu"


@needs_cuda
def test_device_host_disk_chain_promotes_and_demotes(tmp_path: Path) -> None:
    store = TieredKVStore(tmp_path, host_budget_bytes=2 * FACT_BYTES, device="cuda", device_budget_bytes=FACT_BYTES)
    assert [t.name for t in store.tiers] == ["device", "host", "disk"]
    for i in range(3):
        store.put(key(f"m{i}"), fact(i))  # m0 is demoted device -> host, then m1 too
    assert store.device_bytes == FACT_BYTES and store.host_bytes == 2 * FACT_BYTES
    got = store.get(key("m0"))  # host hit, promoted to device; m2 demoted to host
    assert got is not None and got.keys.device.type == "cuda" and same(got, fact(0))
    assert store.stats().hits["host"] == 1 and store.stats().demotions == 3
    assert store.delete_memory("m0") == 2  # device + disk
    assert store.get(key("m0")) is None and KVStore(tmp_path).get(key("m0")) is None
    store.clear()
    assert store.device_bytes == 0 and store.host_bytes == 0
