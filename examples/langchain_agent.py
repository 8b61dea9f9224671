"""A LangChain agent with long-term memory injected as K/V: ``create_agent`` + ``InferScaleMemoryMiddleware``.

The middleware recalls the user's memories before each model call and hands their ids to ``ChatInferScale``, which
injects their K/V: the memory text never enters the agent's prompt. After the run it stores the turn. Asked the same
question in a second conversation, it recalls the fact again, not the question it stored the first time (a memory
whose text is a message being sent is left out).

Run after ``make install-integrations`` (it installs ``langchain-inferscale`` from ``integrations/langchain`` into
``.venv``)::

    .venv/bin/python examples/langchain_agent.py
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
    for conversation in (1, 2):
        state = agent.invoke({"messages": [{"role": "user", "content": question}]})
        answer = state["messages"][-1]
        injected = answer.response_metadata["memory_ids"]
        print(f"conversation {conversation}")
        print("  user:", question)
        print("  agent:", answer.text)
        print("  memories injected as K/V:", [client.get(memory_id)["memory"] for memory_id in injected])
        print("  usage:", answer.usage_metadata)
    # the first run stored its question and answer (infer=False; the second run's are the same text, not stored
    # twice), and the second run did not recall that question
    print("stored after the runs:", len(client.get_all(user_id="maya")["results"]), "memories")
    client.close()


if __name__ == "__main__":
    main()
