"""LlamaIndex integration for InferScale (KV-injected memory)."""
