"""First-token latency of ChatInferScale with k memories: K/V injection against the same memories as prompt text.

Three ways to give the model the same k memories, timed side by side in one process, interleaved:

- ``kv``: ``ChatInferScale`` (mode ``"kv"``) with the ids: the memories' stored K/V are injected, only the
  conversation is prefilled;
- ``prompt``: ``ChatInferScale(mode="prompt")`` with the ids: the same memory tokens prefilled as prompt text;
- ``text``: the memories pasted into the system message by the framework (what the middleware does for a
  non-InferScale model, the Mem0 way), with ``memory_ids=[]``: no K/V, the text is prefilled.

First-token latency is wall-clock from ``model.stream(...)`` to the first chunk with text, as a LangChain user sees
it (the ids are fixed beforehand, so retrieval is not timed). Run::

    HF_HUB_OFFLINE=1 .venv/bin/python integrations/langchain/benchmarks/ttft.py --k 10 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_inferscale import ChatInferScale

from inferscale import MemoryClient

FACTS = [
    "My beagle is called Biscuit.",
    "I moved from Lisbon to Porto in April.",
    "I work night shifts as a nurse at Santo António hospital.",
    "My sister Ana lives in Berlin and works as an architect.",
    "I am allergic to peanuts and cashews.",
    "I drink green tea every morning, never coffee.",
    "I am training for the Porto half marathon in November.",
    "My favourite author is José Saramago.",
    "I play the cello in a community orchestra on Thursdays.",
    "My car is a blue 2015 Renault Clio.",
    "I am learning German on weekends.",
    "My birthday is on the 3rd of March.",
]
QUESTION = "What is my dog called, and where do I live now?"


def first_token_ms(model: ChatInferScale, messages: list, **kwargs: object) -> float:
    t0 = time.perf_counter()
    stream = model.stream(messages, **kwargs)
    try:
        for chunk in stream:
            if chunk.text:
                return (time.perf_counter() - t0) * 1000.0
    finally:
        stream.close()  # ends the request
    raise RuntimeError("the model produced no text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    client = MemoryClient({"data_dir": tempfile.mkdtemp(prefix="inferscale-ttft-"), "engine": {"dtype": "float32"}})
    added = client.add([{"role": "user", "content": f} for f in FACTS[: args.k]], user_id="bench", infer=False)
    memories = [(r["id"], r["memory"]) for r in added["results"]]
    ids = [memory_id for memory_id, _ in memories]
    text = "Memories about the user:\n" + "\n".join(f"- {m}" for _, m in memories)

    kv = ChatInferScale(client=client, user_id="bench", mode="kv", max_tokens=8)
    prompt = ChatInferScale(client=client, user_id="bench", mode="prompt", max_tokens=8)
    question = [HumanMessage(QUESTION)]
    runs = {
        "kv": lambda: first_token_ms(kv, question, memory_ids=ids),
        "prompt": lambda: first_token_ms(prompt, question, memory_ids=ids),
        "text": lambda: first_token_ms(kv, [SystemMessage(text), *question], memory_ids=[]),
    }
    for run in runs.values():  # warm-up: model load, K/V cache tiers, allocator
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(run())

    usage = {
        name: model.invoke(msgs, **kw).usage_metadata
        for name, model, msgs, kw in (
            ("kv", kv, question, {"memory_ids": ids}),
            ("prompt", prompt, question, {"memory_ids": ids}),
            ("text", kv, [SystemMessage(text), *question], {"memory_ids": []}),
        )
    }
    print(f"model {client.model_name}, k={args.k}, median of {args.repeats} (ms, first chunk with text)")
    for name, values in times.items():
        tokens = usage[name]
        print(
            f"{name:7s} first-token {statistics.median(values):8.1f} ms   "
            f"(runs {', '.join(f'{v:.0f}' for v in values)})   input tokens {tokens['input_tokens']}"
            f", read as K/V {tokens.get('input_token_details', {}).get('cache_read', 0)}"
        )
    client.close()


if __name__ == "__main__":
    main()
