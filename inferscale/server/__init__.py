"""Serving InferScale over HTTP.

- ``inferscale serve --engine transformers`` (the default): this package's FastAPI server
  (:func:`inferscale.server.app.create_app`, started by :func:`inferscale.server.run.serve_transformers`): Mem0's
  memory REST API, OpenAI's chat completions with KV-injected memory, API keys bound to scopes
  (:class:`inferscale.server.keys.KeyStore`), Prometheus metrics and an OpenAPI schema. See docs/server.md.
- ``inferscale serve --engine vllm``: vLLM's OpenAI-compatible server with the memory middleware
  (:mod:`inferscale.server.vllm_memory`).

Nothing is imported here, so :mod:`inferscale.server.keys` works without FastAPI installed.
"""
