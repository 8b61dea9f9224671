"""A reference for the K/V a chat serves: memories encoded afresh, outside the K/V store, as a chat lays them out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.storage import MemoryRecord


def context_free_request(engine: Any, text: str) -> EncodeRequest:
    """What a memory of ``text`` is encoded as for its context-free encoding: its fact tokens after the system
    prefix alone (the reference, built by hand, for ``kv.first_memory_context_free``)."""
    return EncodeRequest(engine.fact_token_ids(text), engine.system_prefix_ids())


def fresh_as_served(engine: Any, fact_kv: Any, records: Sequence[MemoryRecord]) -> list[FactKV]:
    """``records``' K/V encoded afresh in one batch, as a chat serves them in this order under the default
    ``kv.first_memory_context_free``: the first after the system prefix alone, every other after its context turns
    (``fact_kv.encode_request``)."""
    if not records:
        return []
    first = context_free_request(engine, records[0].text)
    return engine.encode_facts([first, *(fact_kv.encode_request(r) for r in records[1:])])
