"""Serving InferScale over HTTP. Today: ``inferscale serve --engine vllm``, vLLM's OpenAI-compatible server with
the memory middleware (:mod:`inferscale.server.vllm_memory`)."""
