"""A three-turn LlamaIndex chat whose memories reach the model as K/V (embedded SmolLM2 + MiniLM, offline).

Run: python examples/llamaindex_chat.py [DATA_DIR]   (needs llama-index-memory-inferscale installed)
"""

from __future__ import annotations

import sys
import tempfile

from llama_index.memory.inferscale import simple_chat_engine

from inferscale import MemoryClient


def main(data_dir: str) -> None:
    client = MemoryClient({"data_dir": data_dir, "engine": {"dtype": "float32"}})
    client.add("My dog is a beagle named Biscuit.", user_id="maya", infer=False)
    client.add("I live in Porto.", user_id="maya", infer=False)
    engine = simple_chat_engine(client, user_id="maya", system_prompt="Answer briefly.", max_new_tokens=16)
    for question in ("What is my dog called?", "Where do I live?", "What breed is my dog?"):
        print(f"user: {question}")
        print(f"assistant: {engine.chat(question)}")
    client.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
