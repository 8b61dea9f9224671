"""Fakes for the Mem0-parity tests: a deterministic embedder and a scripted JSON generator (no model loads)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferscale import MemoryConfig
from inferscale.config import KVConfig

_WORD = re.compile(r"[a-z0-9]+|[\u4e00-\u9fff]")


class HashEmbedder:
    """Bag of words (and single CJK characters) hashed into ``dim`` buckets, L2-normalised: texts sharing words
    are similar. Thread-safe and fast."""

    def __init__(self, dim: int = 128) -> None:
        self._dim = dim
        self.calls = 0
        self.max_chars_seen = 0

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            self.max_chars_seen = max(self.max_chars_seen, len(text))
            for word in _WORD.findall(text.lower()):
                bucket = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
                out[row, bucket % self._dim] += 1.0
            norm = float(np.linalg.norm(out[row]))
            out[row] = out[row] / norm if norm else np.eye(1, self._dim, dtype=np.float32)[0]
        return out


Answer = str | Callable[[list[dict[str, str]]], str]


class ScriptedGenerator:
    """Answers by schema title: ``facts`` for extraction (``ExtractedFacts``), ``decisions`` for reconcile
    (``MemoryDecisions``). Each is a string, a callable of the messages, or a list consumed in order."""

    def __init__(self, facts: Answer | list[Answer] = '{"facts": []}', decisions: Answer | list[Answer] = "") -> None:
        self.answers: dict[str, list[Answer]] = {
            "ExtractedFacts": facts if isinstance(facts, list) else [facts],
            "MemoryDecisions": decisions if isinstance(decisions, list) else [decisions],
        }
        self.calls: list[tuple[str, list[dict[str, str]]]] = []
        self._lock = threading.Lock()

    def generate_json(self, messages: list[dict[str, str]], schema: dict[str, Any], max_new_tokens: int) -> str:
        title = str(schema.get("title"))
        with self._lock:
            self.calls.append((title, messages))
            queue = self.answers[title]
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
        return answer(messages) if callable(answer) else answer

    def titles(self) -> list[str]:
        return [title for title, _ in self.calls]


def facts(*items: str) -> str:
    """An extraction answer holding ``items``."""
    return json.dumps({"facts": list(items)}, ensure_ascii=False)


def shown_memories(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The ``[{"id", "text"}]`` memories a reconcile prompt showed the LLM."""
    return list(json.loads(messages[-1]["content"])["memories"])


def fake_config(tmp_path: Path, db_url: str | None = None, **fields: Any) -> MemoryConfig:
    """A config whose data lives under ``tmp_path`` and that never encodes K/V on add (no engine needed)."""
    return MemoryConfig(data_dir=str(tmp_path), db_url=db_url, kv=KVConfig(encode_on_add=False), **fields)
