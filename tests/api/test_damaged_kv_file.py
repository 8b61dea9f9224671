"""K/V files the disk lets down. A damaged one (cut short by a full disk or an interrupted copy) made every chat that
retrieved its memory raise safetensors' own error, which is no InferScaleError, and nothing repaired it: the chat now
encodes the memory again, stores it anew and answers as on an undamaged store. One that cannot be removed (a
read-only K/V folder) made ``delete``, ``update`` and ``delete_all`` raise ``PermissionError`` after their change was
committed, so a caller retried a delete that had happened: the change stands and the call returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from mem0_fakes import HashEmbedder
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_models import tiny_engine

from inferscale import MemoryClient, MemoryConfig
from inferscale.config import KVConfig


@pytest.fixture(scope="module")
def engine() -> Any:
    return tiny_engine("llama")


def test_a_chat_re_encodes_a_memory_whose_k_v_file_is_cut_short(engine: Any, tmp_path: Path) -> None:
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager", host_budget_bytes=0))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]]
        answer = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        (path,) = (tmp_path / "kv" / memory_id).glob("*.safetensors")
        intact = path.read_bytes()
        path.write_bytes(intact[: len(intact) // 2])
        again = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        assert (again.memory_ids, again.answer) == (answer.memory_ids, answer.answer)
        before = tmp_path / "intact.safetensors"
        before.write_bytes(intact)
        assert load_file(path).keys() == load_file(before).keys()
        for name, tensor in load_file(path).items():  # encoded again, bit for bit as before
            assert torch.equal(tensor, load_file(before)[name]), name


def test_a_k_v_file_whose_tensors_were_changed_in_place_is_encoded_again(
    engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file rewritten with other tensors under its own header (a failing disk, a tool that edited it) read as valid
    K/V and was injected as it was; its checksum no longer matches, so it is refused and encoded again."""
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager", host_budget_bytes=0))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]]
        (path,) = (tmp_path / "kv" / memory_id).glob("*.safetensors")
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        assert metadata["checksum"].startswith("sha256:")
        intact = {name: tensor.clone() for name, tensor in tensors.items()}
        tensors["keys"][0, 0, 0, 0] += 1.0  # one element of one key
        save_file(tensors, str(path), metadata=metadata)
        (served,) = client.memory_kv([memory_id])
        assert torch.equal(served.keys.cpu(), intact["keys"]) and torch.equal(served.values.cpu(), intact["values"])
        assert "do not match the checksum" in caplog.text
        for name, tensor in load_file(path).items():  # stored anew, bit for bit as first encoded
            assert torch.equal(tensor, intact[name]), name


@pytest.mark.parametrize(
    ("field", "damage"),
    [
        ("fingerprint", lambda value: chr(ord(value[0]) ^ 1) + value[1:]),  # one flipped bit, as a failing disk
        ("encoded_at", lambda value: "x" + value[1:]),
        ("checksum", lambda value: value[:-1] + ("0" if value[-1] != "0" else "1")),
    ],
)
def test_a_k_v_file_whose_header_was_changed_in_place_is_encoded_again(
    engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str, damage: Any
) -> None:
    """A tester's find: one flipped byte in a file's recorded fingerprint made every chat retrieving its memory
    raise KVFingerprintMismatchError (a garbled encoded_at, KVFormatError), and neither reconcile nor prepare_kv
    repaired it. The header has a checksum of its own now: a header that does not match it is damage, removed and
    encoded again; a whole file written under another key is still refused (tests/kv/test_kv_store.py)."""
    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager", host_budget_bytes=0))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]]
        answer = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        (path,) = (tmp_path / "kv" / memory_id).glob("*.safetensors")
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata()
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        assert metadata["header_checksum"].startswith("sha256:")
        save_file(tensors, str(path), metadata={**metadata, field: damage(metadata[field])})
        again = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        assert (again.memory_ids, again.answer) == (answer.memory_ids, answer.answer)
        assert "its header does not match the checksum written with it" in caplog.text
        with safe_open(str(path), framework="pt") as handle:  # stored anew, bit for bit as first encoded
            assert handle.metadata()[field] == metadata[field]
            assert all(torch.equal(handle.get_tensor(name), tensors[name]) for name in tensors)


def test_a_change_whose_k_v_files_cannot_be_removed_is_committed_and_returns(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from inferscale.kv.tiers.disk import DiskTier

    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager"))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        texts = ["My dog is called Biscuit.", "I live in Porto.", "I like tea."]
        ids = [
            r["id"]
            for r in client.add([{"role": "user", "content": t} for t in texts], user_id="u", infer=False)["results"]
        ]

        def read_only(self: DiskTier, memory_id: str) -> int:
            raise PermissionError(13, "Permission denied", str(tmp_path / "kv" / memory_id))

        monkeypatch.setattr(DiskTier, "delete_memory", read_only)
        client.delete(ids[0])
        client.update(ids[1], "I live in Lisbon.")
        assert client.get(ids[0]) is None and client.get(ids[1])["memory"] == "I live in Lisbon."
        assert [h["event"] for h in client.history(ids[0])] == ["ADD", "DELETE"]
        client.delete_all(user_id="u")
        assert client.get_all(user_id="u")["results"] == []
        assert f"could not remove the K/V files of memory {ids[0]}" in caplog.text
        monkeypatch.undo()
        report = client.reconcile()  # once writable, reconciliation removes what was left behind
        assert report.kv_memories_removed + report.kv_files_removed >= 3, report


@pytest.mark.parametrize("failing", ["put", "store_id", "store_id_file"])
def test_an_add_and_a_chat_whose_k_v_cannot_be_written_still_succeed(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failing: str
) -> None:
    """A full or read-only K/V folder made ``add(encode_kv=True)`` raise OSError after the memory was committed, so
    the caller retried, the retry was skipped as a duplicate and the id was never returned; ``chat`` failed too. K/V
    are derived from SQL: the add returns, the chat serves the K/V it encoded (a fresh encoding's, to the bit), and
    the memory is stored once the folder is writable again."""
    from inferscale.kv.tiers.disk import DiskTier

    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device")

    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager", host_budget_bytes=0))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        if failing == "store_id_file":  # a folder id file holding no id (a tool or a person wrote it)
            (tmp_path / "kv").mkdir()
            (tmp_path / "kv" / "store-id").write_text("garbage")
        else:
            monkeypatch.setattr(DiskTier, failing, full_disk)
        added = client.add("My dog is called Biscuit.", user_id="u", infer=False)["results"]
        assert [r["memory"] for r in added] == ["My dog is called Biscuit."]
        reason = "should hold this K/V folder's id" if failing == "store_id_file" else "[Errno 28] No space left"
        assert "could not be stored" in caplog.text and reason in caplog.text
        answer = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        assert answer.memory_ids == [added[0]["id"]]
        (served,) = client.memory_kv([added[0]["id"]])
        assert not (tmp_path / "kv" / added[0]["id"]).exists()
        monkeypatch.undo()
        (tmp_path / "kv" / "store-id").unlink(missing_ok=True)
        (stored,) = client.memory_kv([added[0]["id"]])
        assert len(list((tmp_path / "kv" / added[0]["id"]).glob("*.safetensors"))) >= 1
        assert torch.equal(served.keys, stored.keys) and torch.equal(served.values, stored.values)
        again = client.chat("What is my dog called?", user_id="u", max_new_tokens=4)
        assert (again.memory_ids, again.answer) == (answer.memory_ids, answer.answer)


def test_a_search_whose_reconciliation_cannot_remove_a_file_still_answers(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A K/V folder made read-only after an update left its memory's old files behind: the next client's first
    search reconciled, could not remove them, and raised PermissionError on every search and chat. Those files are
    never read; they are logged and removed by a later reconciliation once the folder is writable."""
    from inferscale.kv.tiers.disk import DiskTier

    def read_only(self: DiskTier, *_: object) -> int:
        raise PermissionError(13, "Permission denied")

    config = MemoryConfig(data_dir=str(tmp_path), kv=KVConfig(encode_on_add="eager"))
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        (memory_id,) = [r["id"] for r in client.add("I live in Porto.", user_id="u", infer=False)["results"]]
        old_files = sorted((tmp_path / "kv" / memory_id).glob("*.safetensors"))
        monkeypatch.setattr(DiskTier, "delete_memory", read_only)
        client.update(memory_id, "I live in Lisbon.")
    monkeypatch.setattr(DiskTier, "remove_file", read_only)
    with MemoryClient(config, engine=engine, embedder=HashEmbedder()) as client:
        assert [r["memory"] for r in client.search("where do I live", user_id="u")["results"]] == ["I live in Lisbon."]
        assert client.chat("Where do I live?", user_id="u", max_new_tokens=2).memory_ids == [memory_id]
        assert "could not remove 1 K/V files no memory accounts for" in caplog.text
        assert all(path.exists() for path in old_files)
        monkeypatch.undo()
        assert client.reconcile().kv_files_removed == len(old_files)
    assert not any(path.exists() for path in old_files)
