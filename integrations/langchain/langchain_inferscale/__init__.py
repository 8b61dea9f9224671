"""LangChain integration for InferScale (KV-injected memory)."""
