"""LangChain's standard unit suite for ChatInferScale (no generation: construction, parameters, tracing)."""

from __future__ import annotations

import tempfile
from typing import Any

from langchain_inferscale import ChatInferScale
from langchain_tests.unit_tests import ChatModelUnitTests

_DATA_DIR = tempfile.mkdtemp(prefix="langchain-inferscale-unit-")


class TestChatInferScaleUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatInferScale]:
        return ChatInferScale

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # a config dict: the client it builds does no I/O until the first call
        return {"config": {"data_dir": _DATA_DIR, "engine": {"dtype": "float32"}}, "user_id": "unit"}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        # The unit suite adds api_key="test" for hosted providers. The model is embedded, has no key, and refuses
        # unknown fields (extra="forbid"), so the key is left out; every other standard parameter is kept.
        params = super().standard_chat_model_params
        params.pop("api_key")
        return params
