"""A three-turn conversation with KV-injected memory, streamed token by token, on the embedded SmolLM2.

Alice's memories are stored once. Each turn sends the whole conversation so far (the earlier turns and the new user
message; a system message would go first, as in OpenAI's API); ``chat`` retrieves with the last user message,
injects those memories' K/V after the fixed system prefix, prefills only the conversation, and streams the answer.

Run with ``.venv/bin/python examples/chat_conversation.py`` after ``make install``.
"""

from __future__ import annotations

import sys
import tempfile
from typing import Any

from inferscale import MemoryClient

MEMORIES = ["My dog is a beagle named Biscuit.", "I live in Porto.", "My sister Clara is a teacher in Madrid."]
USER_TURNS = ["What is my dog's name?", "Which city do I live in?", "What does my sister Clara do?"]


def converse(client: MemoryClient, user_id: str, max_new_tokens: int = 48) -> list[dict[str, Any]]:
    """Run the three user turns as one conversation, streaming each answer to stdout.

    Returns:
        one dict per turn: the user message, the answer, the injected memories, TTFT and total time (ms).
    """
    messages: list[dict[str, str]] = []
    turns = []
    for question in USER_TURNS:
        messages.append({"role": "user", "content": question})
        print(f"user:      {question}\nassistant: ", end="", flush=True)
        answer, result = "", None
        for chunk in client.chat(
            messages=messages, user_id=user_id, limit=2, max_new_tokens=max_new_tokens, stream=True
        ):
            print(chunk.delta, end="", flush=True)
            answer += chunk.delta
            result = chunk.result or result
        assert result is not None  # the last chunk carries the report
        print(f"\n           [memories: {result.memories}; TTFT {result.timings.ttft_ms:.0f} ms]\n")
        messages.append({"role": "assistant", "content": answer})
        turns.append(
            {
                "user": question,
                "answer": answer,
                "memories": result.memories,
                "ttft_ms": result.timings.ttft_ms,
                "total_ms": result.timings.total_ms,
            }
        )
    return turns


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="inferscale-chat-") as data_dir,
        MemoryClient({"data_dir": data_dir}) as client,
    ):
        for memory in MEMORIES:
            client.add(memory, user_id="alice", infer=False)
        converse(client, "alice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
