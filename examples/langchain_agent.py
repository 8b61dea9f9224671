"""A LangChain agent with long-term memory injected as K/V: ``create_agent`` + ``InferScaleMemoryMiddleware``.

The middleware recalls the user's memories before each model call and hands their ids to ``ChatInferScale``, which
injects their K/V: the memory text never enters the agent's prompt. After the run it stores the turn.

Run with the integrations environment (``make`` builds it; ``langchain-inferscale`` installed from
``integrations/langchain``)::

    .venv-integrations/bin/python examples/langchain_agent.py
"""

from __future__ import annotations

import tempfile

from langchain.agents import create_agent
from langchain_inferscale import ChatInferScale, InferScaleMemoryMiddleware

from inferscale import MemoryClient


def main() -> None:
    client = MemoryClient({"data_dir": tempfile.mkdtemp(prefix="inferscale-langchain-")})
    client.add(
        [
            {"role": "user", "content": "My beagle is called Biscuit."},
            {"role": "user", "content": "I moved to Porto in April."},
        ],
        user_id="maya",
        infer=False,
    )
    agent = create_agent(
        model=ChatInferScale(client=client, max_tokens=32),
        middleware=[InferScaleMemoryMiddleware(client, user_id="maya", limit=2)],
    )
    question = "What is my dog called?"
    state = agent.invoke({"messages": [{"role": "user", "content": question}]})
    answer = state["messages"][-1]
    print("user:", question)
    print("agent:", answer.text)
    print("memories injected as K/V:", answer.response_metadata["memory_ids"])
    print("usage:", answer.usage_metadata)
    print("stored after the run:", len(client.get_all(user_id="maya")["results"]), "memories")
    client.close()


if __name__ == "__main__":
    main()
