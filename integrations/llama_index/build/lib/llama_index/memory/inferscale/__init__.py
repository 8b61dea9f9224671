"""LlamaIndex integration for InferScale: memory that reaches the model as K/V, by id, never as prompt text.

- :class:`InferScaleMemory`: Mem0Memory's shape; tags the memory message it adds with the memory ids.
- :class:`InferScaleLLM`: injects tagged memories as K/V and strips their text.
- :class:`InferScaleMemoryBlock`, :class:`InferScaleKVMemoryBlock`: blocks for ``llama_index.core.memory.Memory``.
- :class:`InferScaleRetriever`: memories as nodes whose id is the memory id.
- :func:`simple_chat_engine`: a ``SimpleChatEngine`` wired for K/V.
"""

from llama_index.memory.inferscale._messages import MEMORY_IDS_KEY, split_memory
from llama_index.memory.inferscale._scope import InferScaleContext
from llama_index.memory.inferscale.base import InferScaleMemory
from llama_index.memory.inferscale.chat_engine import simple_chat_engine
from llama_index.memory.inferscale.llm import InferScaleLLM
from llama_index.memory.inferscale.memory_block import InferScaleKVMemoryBlock, InferScaleMemoryBlock
from llama_index.memory.inferscale.retriever import InferScaleRetriever

__all__ = [
    "MEMORY_IDS_KEY",
    "InferScaleContext",
    "InferScaleKVMemoryBlock",
    "InferScaleLLM",
    "InferScaleMemory",
    "InferScaleMemoryBlock",
    "InferScaleRetriever",
    "simple_chat_engine",
    "split_memory",
]
