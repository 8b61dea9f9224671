"""Requests for the vLLM engine: token ids plus the connector payload that names each segment's K/V file.

A :class:`RequestBuilder` lays out ``[system prefix][facts][conversation]`` from a :class:`PromptLayout` (the
conversation is the caller's query, or its messages rendered with the model's chat template) and turns fact
K/V into :class:`~inferscale.engines.vllm.metadata.SegmentRef` entries: K/V handed in as tensors are staged once
per object into a private folder (:class:`_Stager`; the engine core runs in another process), and K/V already in
the KV store's files are named by path. The result, a :class:`PreparedRequest`, is what
:meth:`inferscale.engines.vllm.VLLMEngine.run` submits.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from inferscale.conversation import ChatMessage
from inferscale.engines.hf import PromptLayout
from inferscale.engines.vllm.metadata import MemoryPayload, SegmentRef, cache_salt, prompt_cache_salt
from inferscale.engines.vllm.segments import read_header
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.kv.fact import FactKV
from inferscale.kv.serving import ServingSettings
from inferscale.kv.tiers.serialization import header_checksum, tensors_checksum


def vllm_recompute_tail(serving: ServingSettings) -> int:
    """The ``recompute_tail`` vLLM serves ``serving`` with: n of a ``tail:n`` recompute policy, 0 for pure injection
    (tokens). vLLM applies only these two (the connector injects up to ``P + S - n`` and vLLM prefills the rest), with
    no memory attention scale and no temperature. :class:`~inferscale.engines.vllm.VLLMEngine` and
    ``inferscale serve --engine vllm`` both check their settings here and pass the result to
    :meth:`RequestBuilder.prepare_kv`.

    Raises:
        ConfigError: when ``serving`` asks for a memory attention scale, a temperature or a recompute policy other
            than ``none`` / ``tail:n``, naming each such setting and why vLLM cannot apply it.
    """
    reasons = []
    if serving.attention_scale != 1.0:
        reasons.append("vLLM's attention kernels take no per-column logit bias (kv.memory_attention_scale)")
    if serving.temperature != 1.0:
        reasons.append("the memory temperature is not wired to the connector (kv.memory_temperature)")
    if serving.recompute.kind not in ("none", "tail"):
        reasons.append(
            f"a KV connector may only claim one contiguous span of prompt tokens from position 0, so memory tokens "
            f"inside the segment cannot be left to vLLM's prefill (kv.recompute='{serving.recompute}'; only "
            "'none' and 'tail:N', the segment's last N tokens, can be)"
        )
    if reasons:
        raise ConfigError(
            f"the vLLM engine cannot apply {serving.label()}: {'; '.join(reasons)}. Set "
            "kv.memory_attention_scale=1, kv.memory_temperature=1 and kv.recompute='none' or 'tail:N' for provider "
            "'vllm'; the encoding-time remedies (kv.context_window, kv.first_memory_context_free, kv.position_buckets) "
            "apply unchanged. "
            "See docs/vllm.md."
        )
    return int(serving.recompute.amount) if serving.recompute.kind == "tail" else 0


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One prompt ready for vLLM.

    Attributes:
        prompt_ids: ``[system prefix][memory segment][conversation]`` token ids.
        memory_tokens: S, the memory segment's length (tokens).
        payload: the segments to inject, or ``None`` to let vLLM prefill everything.
        salt: the request's ``cache_salt`` (``None`` without a payload).
    """

    prompt_ids: list[int]
    memory_tokens: int
    payload: MemoryPayload | None
    salt: str | None

    @property
    def recomputed_tokens(self) -> int:
        """The memory segment's last tokens vLLM prefills instead of the connector injecting them (``tail:n``:
        ``min(n, S)``); 0 without a payload or for pure injection."""
        if self.payload is None:
            return 0
        return min(self.payload.recompute_tail, self.memory_tokens)

    def vllm_inputs(self, sampling: Any) -> tuple[dict[str, Any], Any]:
        """``(prompt, sampling_params)`` for ``LLM.generate``: the token prompt with its salt, and ``sampling``
        with this request's ``kv_transfer_params`` added to its ``extra_args``."""
        prompt: dict[str, Any] = {"prompt_token_ids": list(self.prompt_ids)}
        if self.salt is not None:
            prompt["cache_salt"] = self.salt
        if self.payload is not None:
            sampling = sampling.clone()
            sampling.extra_args = {**(sampling.extra_args or {}), "kv_transfer_params": self.payload.to_params()}
        return prompt, sampling


def write_segment(path: Path, fact: FactKV, fingerprint: str) -> None:
    """Write ``fact`` as a segment file (the KV store's layout, in a float dtype) atomically.

    Args:
        path: target file.
        fact: pre-RoPE K/V ``[n_layers, n_kv_heads, n_tokens, head_dim]`` and token ids; 8-bit K/V are dequantised
            to the dtype they were quantised from (a KV store entry's own file, linked instead, stays 8-bit).
        fingerprint: the model fingerprint it was encoded under (the connector injects it only under that model).
    """
    fact = fact.dequantized()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tensors = {
        "keys": fact.keys.detach().cpu().contiguous(),
        "values": fact.values.detach().cpu().contiguous(),
        "token_ids": fact.token_ids.to(torch.int64).cpu().contiguous(),
    }
    metadata = {
        "format": "inferscale.kv/1",
        "fingerprint": fingerprint,
        "encoded_at": str(fact.encoded_at),
        "checksum": tensors_checksum(tensors),
    }
    metadata["header_checksum"] = header_checksum(metadata)  # checked by the workers, as the KV store's files
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)


class _Stager:
    """The segment files vLLM's workers read for K/V handed in as tensors, in a private folder, LRU by count.

    - A fact whose :attr:`FactKV.source` file exists (every entry of a KV store with a disk tier) is hard-linked
      into the folder, with no copy. The link pins the file's content: deleting the memory or rewriting its entry
      (an atomic rename onto the path) cannot change or remove what a request already names. The uid hashes the
      file's identity (device, inode, size, mtime), so every fact object backed by the same file shares one
      segment, and a rewritten file is a new segment.
    - Any other fact (or one whose file cannot be linked, e.g. across file systems) is written to the folder once
      per object: the same object (the KV store hands back the same object on a host-tier hit) reuses its file and
      uid, so repeated requests share prefix-cache blocks; a new object gets a new uid, so it never aliases
      another's blocks.

    Evicted entries are unlinked. Until then the folder holds the K/V of memories deleted since; :meth:`close` of
    the engine removes a temporary folder.
    """

    def __init__(self, directory: Path, fingerprint: str, max_entries: int = 4096) -> None:
        self._dir = directory
        self._fingerprint = fingerprint
        self._max = max_entries
        self._entries: OrderedDict[tuple[Any, ...], tuple[FactKV | None, SegmentRef]] = OrderedDict()
        self._lock = threading.Lock()

    def ref(self, fact: FactKV) -> SegmentRef:
        """The segment of ``fact``: a link to its source file when it has one, else a staged copy (first use)."""
        with self._lock:
            if fact.source is not None:
                linked = self._linked(fact.source)
                if linked is not None:
                    return linked
            hit = self._entries.get(("object", id(fact)))
            if hit is not None and hit[0] is fact:
                self._entries.move_to_end(("object", id(fact)))
                return hit[1]
            uid = f"staged-{uuid.uuid4().hex}"
            path = self._dir / f"{uid}.safetensors"
            write_segment(path, fact, self._fingerprint)
            return self._remember(("object", id(fact)), fact, SegmentRef(str(path), uid))

    def _linked(self, source: str) -> SegmentRef | None:
        """A hard link to ``source`` in the folder, or ``None`` when it cannot be made (then stage a copy)."""
        try:
            st = os.stat(source)
        except OSError:
            return None  # the file went away (memory deleted, store cleared)
        identity = ("file", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        hit = self._entries.get(identity)
        if hit is not None and os.path.exists(hit[1].path):
            self._entries.move_to_end(identity)
            return hit[1]
        uid = "file-" + hashlib.sha256(repr(identity).encode()).hexdigest()[:24]
        path = self._dir / f"{uid}.safetensors"
        try:
            if not path.exists():
                os.link(source, path)
            linked = os.stat(path)
        except OSError:
            return None  # another file system, no hard links, or the file vanished in between
        if (linked.st_dev, linked.st_ino, linked.st_size, linked.st_mtime_ns) != identity[1:]:
            path.unlink(missing_ok=True)  # the source was replaced between stat and link
            return None
        return self._remember(identity, None, SegmentRef(str(path), uid))

    def _remember(self, key: tuple[Any, ...], fact: FactKV | None, ref: SegmentRef) -> SegmentRef:
        self._entries[key] = (fact, ref)
        while len(self._entries) > self._max:
            _, (_, old) = self._entries.popitem(last=False)
            Path(old.path).unlink(missing_ok=True)
        return ref


class RequestBuilder:
    """Builds :class:`PreparedRequest` objects: prompt ids in our layout, the memory payload and the cache salt.

    Shared by :class:`VLLMEngine` and the OpenAI server's middleware (which encodes with a transformers engine).

    Args:
        layout: the prompt layout (chat template split around the memory segment).
        fingerprint: the served model's fingerprint.
        prefix: the system prefix's pre-RoPE K/V (encoded from position 0).
        staging_dir: where segment files are written (must be readable by vLLM's workers).
    """

    def __init__(self, layout: PromptLayout, fingerprint: str, prefix: FactKV, staging_dir: Path) -> None:
        staging_dir.mkdir(parents=True, exist_ok=True)
        self._layout = layout
        self._fingerprint = fingerprint
        self._stager = _Stager(staging_dir, fingerprint)
        digest = hashlib.sha256(repr(list(layout.prefix_ids)).encode()).hexdigest()[:16]
        path = staging_dir / f"prefix-{fingerprint[:16]}-{digest}.safetensors"
        write_segment(path, prefix, fingerprint)
        self.prefix_ref = SegmentRef(str(path), f"prefix-{digest}")

    @property
    def layout(self) -> PromptLayout:
        """The prompt layout."""
        return self._layout

    def stage(self, facts: Sequence[FactKV]) -> list[SegmentRef]:
        """The segment files of ``facts`` (linked or written now, see :class:`_Stager`), without building a
        request: a benchmark stages its pool before timing anything."""
        return [self._stager.ref(f) for f in facts]

    def _prepared(
        self,
        conversation: str | Sequence[ChatMessage],
        refs: Sequence[SegmentRef],
        lengths: Sequence[int],
        fact_ids: list[int],
        cache_scope: str,
        recompute_tail: int,
    ) -> PreparedRequest:
        if recompute_tail < 0:
            raise InvalidInputError(f"recompute_tail must be >= 0 tokens, got {recompute_tail}")
        prefix = self._layout.prefix_ids
        # A tail longer than the segment recomputes all of it (as tail_slots does); clamped, so that every such
        # request names the same content and shares its blocks.
        tail = min(recompute_tail, len(fact_ids))
        payload = MemoryPayload(self._fingerprint, (self.prefix_ref, *refs), len(prefix), tail)
        salt = cache_salt(cache_scope, payload.content_digest([len(prefix), *lengths]))
        ids = list(prefix) + fact_ids + self._layout.conversation_ids(conversation)
        return PreparedRequest(ids, len(fact_ids), payload, salt)

    def prepare_kv(
        self,
        conversation: str | Sequence[ChatMessage],
        facts: Sequence[FactKV],
        cache_scope: str = "",
        *,
        recompute_tail: int = 0,
    ) -> PreparedRequest:
        """A KV-mode request: the facts' K/V (staged to files once per object) injected after the prefix, the
        conversation prefilled after them.

        Args:
            conversation: the user's question, or the caller's messages (checked by
                :func:`inferscale.conversation.check_messages`), laid out by
                :meth:`PromptLayout.conversation_ids`.
            facts: pre-RoPE fact K/V in layout order (from an encoder or the KV store).
            cache_scope: the tenant (:meth:`inferscale.scope.Scope.key`); it salts the prefix cache.
            recompute_tail: n, the ``tail:n`` recompute policy: the memory segment's last ``n`` tokens are
                prefilled by vLLM (attending to the injected K/V before them) instead of injected; ``n`` beyond the
                segment's length recomputes all of it. 0 is pure injection. Part of the cache salt.

        Raises:
            InvalidInputError: for an empty query, a conversation the chat template refuses, or
                ``recompute_tail`` < 0.
        """
        refs = self.stage(facts)
        ids = [int(t) for f in facts for t in f.token_ids.tolist()]
        return self._prepared(conversation, refs, [f.n_tokens for f in facts], ids, cache_scope, recompute_tail)

    def prepare_files(
        self,
        conversation: str | Sequence[ChatMessage],
        refs: Sequence[SegmentRef],
        cache_scope: str = "",
        *,
        recompute_tail: int = 0,
    ) -> PreparedRequest:
        """A KV-mode request whose fact K/V are already in files (the KV store's disk tier); ``conversation``,
        ``cache_scope`` and ``recompute_tail`` as in :meth:`prepare_kv`.

        Raises:
            inferscale.engines.vllm.segments.SegmentError: when a file is missing or malformed.
            InvalidInputError: see :meth:`prepare_kv`.
        """
        headers = [read_header(r.path) for r in refs]
        ids = [t for h in headers for t in h.token_ids]
        return self._prepared(conversation, refs, [h.n_tokens for h in headers], ids, cache_scope, recompute_tail)

    def prepare_prompt(
        self, conversation: str | Sequence[ChatMessage], fact_ids: Sequence[Sequence[int]], cache_scope: str = ""
    ) -> PreparedRequest:
        """A prompt-mode request: the same tokens, all prefilled by vLLM (no payload), salted with the tenant
        (:func:`~inferscale.engines.vllm.metadata.prompt_cache_salt`) so tenants never share prefix-cache blocks.

        Raises:
            InvalidInputError: see :meth:`prepare_kv`.
        """
        memory = [t for ids in fact_ids for t in ids]
        ids = list(self._layout.prefix_ids) + memory + self._layout.conversation_ids(conversation)
        return PreparedRequest(ids, len(memory), None, prompt_cache_salt(cache_scope))
