"""Quickstart: remember a short conversation, then answer with KV-injected memory and with the prompt baseline.

Run with ``.venv/bin/python examples/quickstart.py`` after ``make install``.
"""

from __future__ import annotations

import tempfile

from inferscale import MemoryClient


def main() -> None:
    client = MemoryClient({"data_dir": tempfile.mkdtemp(prefix="inferscale-quickstart-")})
    conversation = [
        {"role": "user", "content": "I moved from Lisbon to Porto in April."},
        {"role": "assistant", "content": "Congratulations on the move!"},
        {"role": "user", "content": "My beagle Biscuit loves the beach there."},
    ]
    added = client.add(conversation, user_id="maya", infer=False)
    print("stored:", [r["memory"] for r in added["results"]])
    for mode in ("kv", "prompt"):
        reply = client.chat("What is my dog called?", user_id="maya", limit=3, mode=mode)
        print(f"{mode:6s} TTFT {reply.timings.ttft_ms:7.1f} ms  answer: {reply.answer}")
    client.close()


if __name__ == "__main__":
    main()
