from llama_index.memory import inferscale

EXPECTED_ALL = [
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


def test_all_imports() -> None:
    assert sorted(inferscale.__all__) == sorted(EXPECTED_ALL)
    for name in EXPECTED_ALL:
        assert hasattr(inferscale, name)


def test_namespace_packages_have_no_init() -> None:
    from pathlib import Path

    package = Path(inferscale.__file__).parent
    assert not (package.parent / "__init__.py").exists()
    assert not (package.parent.parent / "__init__.py").exists()
