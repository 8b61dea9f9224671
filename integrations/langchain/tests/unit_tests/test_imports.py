from langchain_inferscale import __all__

EXPECTED_ALL = [
    "MEMORY_BLOCK_ID",
    "MEMORY_IDS_KEY",
    "ChatInferScale",
    "InferScaleMemoryMiddleware",
    "InferScaleRetriever",
    "memory_system_message",
    "memory_tools",
]


def test_all_imports() -> None:
    assert sorted(EXPECTED_ALL) == sorted(__all__)
