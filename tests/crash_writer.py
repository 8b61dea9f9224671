"""The writer of the crash test (tests/reliability/test_crash_recovery.py), and the zygote that forks it.

``python tests/crash_writer.py`` starts a zygote: it imports the client, torch and transformers once, then reads
commands from stdin, one per line, and answers each on stdout:

- ``fork <json>``: forks a writer (:func:`write` with the JSON object's fields as arguments); answers its pid;
- ``reap <pid>``: waits for that writer to end; answers ``killed <signal>`` or ``exited <code>``.

A fresh Python process per writer would spend seconds importing; a fork of the zygote starts at once. The zygote
itself runs no model code before it forks (a fork of a process whose thread pools have run is not safe).

A writer builds its client the way the API suite does (:func:`tests.tiny_models.tiny_engine`, a
:class:`mem0_fakes.HashEmbedder`, :func:`mem0_fakes.fake_config`), then makes random adds (``infer=False``, half of
them with ``encode_kv``), updates, deletes and K/V encodings (``memory_kv``) until it is killed. Before each call
it appends an ``intent`` line to its log, and after the call returns an ``ack`` line, fsynced: an acknowledged
write is one whose ``ack`` line is in the log.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import traceback
from pathlib import Path
from typing import IO, Any

import torch
from mem0_fakes import HashEmbedder, fake_config
from tiny_models import tiny_engine

from inferscale import MemoryClient

USERS = ("u0", "u1", "u2")
WORDS = ("tea", "dog", "chess", "rain", "piano", "lisbon", "bike", "soup", "maple", "river", "train", "violet")


def fact_text(rng: random.Random, tag: str) -> str:
    """A fact of a few common words and one word of its own (``tag``), so that its text is unique."""
    return f"{tag} likes {' and '.join(rng.sample(WORDS, 3))}"


def _log(log: IO[str], phase: str, entry: dict[str, Any], sync: bool) -> None:
    log.write(json.dumps({"phase": phase, **entry}) + "\n")
    log.flush()
    if sync:
        os.fsync(log.fileno())


def write(data_dir: str, db_url: str, log_path: str, seed: int, n_ops: int) -> None:
    """Make ``n_ops`` random writes on the store of ``data_dir`` / ``db_url``, logging each to ``log_path``.

    Entries: ``{"phase": "intent" | "ack", "op": "add" | "update" | "delete" | "kv", "id", "user", "text"}`` (an
    add's intent has no id; a kv entry names the memory and the text hash its K/V were encoded from).
    """
    torch.set_num_threads(1)
    rng = random.Random(seed)
    client = MemoryClient(fake_config(Path(data_dir), db_url), engine=tiny_engine("llama"), embedder=HashEmbedder())
    live: dict[str, str] = {}
    for user in USERS:
        live.update((m["id"], user) for m in client.get_all(user_id=user)["results"])
    with open(log_path, "a", encoding="utf-8") as log:
        for n in range(n_ops):
            roll = rng.random()
            if not live or roll < 0.45:
                user, text, kv = rng.choice(USERS), fact_text(rng, f"s{seed}n{n}"), rng.random() < 0.5
                _log(log, "intent", {"op": "add", "user": user, "text": text, "kv": kv}, sync=False)
                memory_id = client.add(text, user_id=user, infer=False, encode_kv=kv)["results"][0]["id"]
                live[memory_id] = user
                _log(log, "ack", {"op": "add", "id": memory_id, "user": user, "text": text, "kv": kv}, sync=True)
                continue
            memory_id = rng.choice(sorted(live))
            if roll < 0.75:
                text = fact_text(rng, f"s{seed}n{n}")
                _log(log, "intent", {"op": "update", "id": memory_id, "text": text}, sync=False)
                client.update(memory_id, text=text)
                _log(log, "ack", {"op": "update", "id": memory_id, "text": text}, sync=True)
            elif roll < 0.9:
                _log(log, "intent", {"op": "delete", "id": memory_id}, sync=False)
                client.delete(memory_id)
                del live[memory_id]
                _log(log, "ack", {"op": "delete", "id": memory_id}, sync=True)
            else:
                _log(log, "intent", {"op": "kv", "id": memory_id}, sync=False)
                record = client.db.get(memory_id)
                if record is None:
                    raise AssertionError(f"memory {memory_id} vanished under its only writer")
                client.memory_kv([record])
                _log(log, "ack", {"op": "kv", "id": memory_id, "hash": record.hash}, sync=True)
    # Wait for the kill: a kill aimed after the last write (at most 10 ms late) must not find the writer exited.
    while True:
        signal.pause()


def preload() -> None:
    """Import what a writer's :func:`tiny_engine` imports lazily (transformers' Llama, the engine), without running
    any model code: most of a writer's start."""
    import transformers.models.llama.modeling_llama  # noqa: F401
    from tiny_models import tiny_config
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: F401

    import inferscale.engines.transformers  # noqa: F401

    tiny_config("llama")


def zygote() -> None:
    """Fork writers on request (see the module docstring) until stdin closes."""
    preload()
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "fork":
            pid = os.fork()
            if pid == 0:  # the writer: its stdout is the zygote's answer pipe, so it writes to stderr only
                os.dup2(2, 1)
                code = 0
                try:
                    write(**json.loads(argument))
                except BaseException:
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
            print(pid, flush=True)
        elif command == "reap":
            _, status = os.waitpid(int(argument), 0)
            if os.WIFSIGNALED(status):
                print(f"killed {os.WTERMSIG(status)}", flush=True)
            else:
                print(f"exited {os.WEXITSTATUS(status)}", flush=True)


if __name__ == "__main__":
    zygote()
