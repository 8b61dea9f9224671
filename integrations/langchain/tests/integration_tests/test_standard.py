"""LangChain's standard integration suites, unmodified, on the embedded model.

ChatInferScale answers with the memories of :data:`STANDARD_USER` injected as K/V (it retrieves for every
message); tool calling, structured output and multimodal tests are skipped by their capability switches.
"""

from __future__ import annotations

from typing import Any

from langchain_inferscale import ChatInferScale, InferScaleRetriever
from langchain_tests.integration_tests import ChatModelIntegrationTests, RetrieversIntegrationTests

from tests.integration_tests.shared import MAX_TOKENS, STANDARD_USER, shared_async_client, shared_client


class TestChatInferScaleStandard(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatInferScale]:
        return ChatInferScale

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            "client": shared_client(),
            "async_client": shared_async_client(),
            "user_id": STANDARD_USER,
            "max_tokens": MAX_TOKENS,
        }


class TestInferScaleRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[InferScaleRetriever]:
        return InferScaleRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"client": shared_client(), "async_client": shared_async_client(), "user_id": STANDARD_USER, "k": 3}

    @property
    def retriever_query_example(self) -> str:
        return "What is my dog called?"
