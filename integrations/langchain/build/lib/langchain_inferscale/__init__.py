"""LangChain integration for InferScale: memory injected as K/V, through LangChain's own interfaces."""

from langchain_inferscale.chat_models import ChatInferScale
from langchain_inferscale.messages import MEMORY_BLOCK_ID, MEMORY_IDS_KEY, memory_system_message
from langchain_inferscale.middleware import InferScaleMemoryMiddleware
from langchain_inferscale.retrievers import InferScaleRetriever
from langchain_inferscale.tools import memory_tools

__all__ = [
    "MEMORY_BLOCK_ID",
    "MEMORY_IDS_KEY",
    "ChatInferScale",
    "InferScaleMemoryMiddleware",
    "InferScaleRetriever",
    "memory_system_message",
    "memory_tools",
]
