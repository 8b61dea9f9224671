"""A reference for the K/V a chat serves: memories encoded afresh, outside the K/V store, as a chat lays them out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.storage import MemoryRecord


def fresh_as_served(engine: Any, fact_kv: Any, records: Sequence[MemoryRecord]) -> list[FactKV]:
    """``records``' K/V encoded afresh in one batch, as a chat serves them in this order under the default
    ``kv.first_memory_context_free``: the first after the system prefix alone, every other after its context turns
    (``fact_kv.encode_request``)."""
    if not records:
        return []
    first = EncodeRequest(engine.fact_token_ids(records[0].text), engine.system_prefix_ids())
    return engine.encode_facts([first, *(fact_kv.encode_request(r) for r in records[1:])])
