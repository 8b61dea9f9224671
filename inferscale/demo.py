"""``inferscale demo``: add a conversation, then answer questions with KV-injected memory and with the prompt baseline.

Runs on the embedded defaults, offline. The bundled conversation (``inferscale/data/demo_conversation.json``) is
original; ``--locomo PATH`` runs on one LoCoMo conversation instead (the file is read from PATH, never shipped).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from inferscale.cli_options import cli
from inferscale.client import MemoryClient
from inferscale.config import KVConfig, MemoryConfig, MemoryLayout
from inferscale.errors import ConfigError
from inferscale.terminal_text import json_for_terminal

if TYPE_CHECKING:
    from rich.console import Console


@dataclass(frozen=True)
class DemoOptions:
    """What ``inferscale demo`` runs; each field is its command-line option (flag and help in its metadata).

    Attributes:
        as_json: print one JSON object per question on stdout instead of tables.
        k: memories retrieved per question.
        infer: extract facts with the LLM instead of storing each message verbatim.
        context_window: w, preceding turns each fact is encoded after.
        chain_block: B, bounded chained contexts for the verbatim messages (``kv.chain_block``; 0: none).
        memory_layout: the order each chat lays its memories out in (``MemoryConfig.memory_layout``).
        locomo: a LoCoMo file to run on instead of the bundled conversation; ``conversation``: its sample id;
            ``questions``: how many of its questions to ask.
        data_dir: where the demo's database, index and K/V go (``None``: ``<home>/demo``).
    """

    as_json: bool = field(
        default=False, metadata=cli("--json", action="store_true", help="print one JSON object per question on stdout")
    )
    k: int = field(default=5, metadata=cli("-k", help="memories retrieved per question (default 5)"))
    infer: bool = field(
        default=False,
        metadata=cli(
            "--infer",
            action=argparse.BooleanOptionalAction,
            help=(
                "extract facts with the LLM (--infer) or store each message as it is (default: the embedded 135M "
                "model extracts facts poorly, so the demo stores messages verbatim unless asked)"
            ),
        ),
    )
    context_window: int = field(
        default=KVConfig.model_fields["context_window"].default,
        metadata=cli(
            "--context-window", help="w: preceding turns each fact is encoded after (default: KVConfig's, %(default)s)"
        ),
    )
    chain_block: int = field(
        default=KVConfig.model_fields["chain_block"].default,
        metadata=cli(
            "--chain-block",
            help="B: every B-th message anchors a block, the others are encoded on the stored K/V of the block's "
            "memories before them (default: KVConfig's, %(default)s: no chains)",
        ),
    )
    memory_layout: MemoryLayout = field(
        default=MemoryConfig.model_fields["memory_layout"].default,
        metadata=cli(
            "--memory-layout",
            help="order of each chat's memories, in both modes: by retrieval score, best first, or in the order they "
            "were added, oldest first (default: MemoryConfig's, %(default)s)",
        ),
    )
    locomo: str | None = field(
        default=None,
        metadata=cli("--locomo", metavar="PATH", help="run on a LoCoMo file instead of the bundled conversation"),
    )
    conversation: str = field(
        default="conv-26", metadata=cli("--conversation", help="LoCoMo sample_id (default conv-26)")
    )
    questions: int = field(default=5, metadata=cli("--questions", help="LoCoMo questions to ask (default 5)"))
    data_dir: str | None = field(
        default=None,
        metadata=cli("--data-dir", help="where the demo's database, index and K/V go (default <home>/demo)"),
    )


@dataclass(frozen=True)
class DemoQuestion:
    """A question with its expected short answer."""

    question: str
    expected: str


@dataclass(frozen=True)
class DemoScript:
    """What the demo adds and asks: sessions of messages (with a date each) for one user, then questions."""

    user_id: str
    sessions: list[tuple[str, list[dict[str, str]]]]
    questions: list[DemoQuestion]


def bundled_script() -> DemoScript:
    """The conversation shipped with the package."""
    raw = json.loads(resources.files("inferscale.data").joinpath("demo_conversation.json").read_text("utf-8"))
    return DemoScript(
        user_id=raw["user_id"],
        sessions=[(s["date"], s["messages"]) for s in raw["sessions"]],
        questions=[DemoQuestion(q["question"], q["expected"]) for q in raw["questions"]],
    )


def locomo_script(path: str, conversation: str, n_questions: int) -> DemoScript:
    """One LoCoMo conversation: every turn as a message (``"Speaker: text"``), questions of categories 1-4."""
    from inferscale.eval.locomo import get_conversation, load_locomo, turn_text

    conv = get_conversation(load_locomo(path), conversation)
    sessions = [
        (s.date_time.date().isoformat(), [{"role": "user", "content": turn_text(t)} for t in s.turns])
        for s in conv.sessions
    ]
    qa = [q for q in conv.qa if q.category in (1, 2, 3, 4)][:n_questions]
    return DemoScript(conv.sample_id, sessions, [DemoQuestion(q.question, q.answer) for q in qa])


def run_demo(
    script: DemoScript,
    client: MemoryClient,
    k: int,
    infer: bool,
    as_json: bool,
    console: Console,
) -> list[dict[str, Any]]:
    """Add the script's sessions, print what was stored, ask each question in both modes. Returns the rows."""
    from inferscale.commands.output import plain

    user = script.user_id
    t0 = time.perf_counter()
    n_added = 0
    for day, messages in script.sessions:
        n_added += len(client.add(messages, user_id=user, metadata={"session_date": day}, infer=infer)["results"])
    add_s = time.perf_counter() - t0
    client.wait_for_encoding()  # the K/V encoded behind the adds; the chats' TTFTs below are timed without it
    encode_s = time.perf_counter() - t0 - add_s
    stored = client.get_all(user_id=user, limit=10_000)["results"]
    if not as_json:
        console.print(
            f"[bold]Stored {len(stored)} memories for {user!r}[/] ({n_added} new, {add_s:.1f} s; "
            f"their K/V encoded in the background {encode_s:.1f} s more)"
        )
        for m in stored[:40]:  # as the memory commands print them: never markup, terminal controls escaped
            console.print(plain(f"  • {m['memory']}"))
        if len(stored) > 40:
            console.print(f"  … and {len(stored) - 40} more")
    rows: list[dict[str, Any]] = []
    for q in script.questions:
        kv = client.chat(q.question, user_id=user, limit=k, mode="kv")
        prompt = client.chat(q.question, user_id=user, limit=k, mode="prompt")
        row = {
            "question": q.question,
            "expected": q.expected,
            "k": k,
            "memory_ids_same": kv.memory_ids == prompt.memory_ids,
            "kv": {"answer": kv.answer, **_timing(kv.timings)},
            "prompt": {"answer": prompt.answer, **_timing(prompt.timings)},
            "memory_tokens": kv.memory_tokens,
        }
        rows.append(row)
        if as_json:
            print(json_for_terminal(row))
    if not as_json:
        from inferscale.apps_extra import table as make_table

        table = make_table(title=f"Answers with k={k} memories (TTFT in ms)", show_lines=True)
        for col in ("question", "expected", "kv answer", "kv TTFT", "prompt answer", "prompt TTFT"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(
                plain(r["question"]),
                plain(r["expected"]),
                plain(r["kv"]["answer"]),
                f"{r['kv']['ttft_ms']:.0f}",
                plain(r["prompt"]["answer"]),
                f"{r['prompt']['ttft_ms']:.0f}",
            )
        console.print(table)
    return rows


def _timing(t: Any) -> dict[str, float]:
    return {
        "ttft_ms": round(t.ttft_ms, 1),
        "retrieval_ms": round(t.retrieval_ms, 1),
        "kv_assembly_ms": round(t.kv_assembly_ms, 1),
        "prefill_ms": round(t.prefill_ms, 1),
        "total_ms": round(t.total_ms, 1),
    }


def demo_client(
    data_dir: Path, context_window: int, chain_block: int = 0, memory_layout: MemoryLayout = "score"
) -> MemoryClient:
    """A client whose database, index and K/V live in ``data_dir``, reset so the demo starts clean.

    Raises:
        ConfigError: for a ``context_window`` or ``chain_block`` that ``KVConfig`` refuses, or a
            ``memory_layout`` that ``MemoryConfig`` refuses.
    """
    try:
        kv = KVConfig(context_window=context_window, chain_block=chain_block)
        config = MemoryConfig.model_validate({"data_dir": str(data_dir), "kv": kv, "memory_layout": memory_layout})
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'kv'}: {e['msg']}" for e in error.errors())
        raise ConfigError(f"the demo's settings: {problems}") from error
    client = MemoryClient(config)
    client.reset()
    return client
