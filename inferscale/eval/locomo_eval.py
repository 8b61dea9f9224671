"""``inferscale eval locomo``: LoCoMo question answering with KV injection and with prompt injection (the run).

Protocol (close to Mem0's, see ``../shared/data/locomo/FORMAT.md``; the data is read from ``--data`` at run time and
never copied):

- **Ingest** each conversation into one scope (``user_id = sample_id``), session by session, with
  ``infer=False``: each turn becomes one memory, ``"[<session date>] <Speaker>: <text>"`` (the date prefix and the
  photo caption ``[shares …]`` can be turned off). Its encoding context (context window w) is what ``add``
  records: the scope's last memories (the earlier sessions' last turns), then the turns before it in its session.
  Each memory's metadata records its ``dia_id``, speaker, session number and session date, so retrieval recall can
  be checked against the evidence ids. ``infer=True`` (LLM fact extraction) is also
  supported; its memories carry no dia_id, so recall is not reported then.
- **Answer** the questions of categories 1-4 (category 5, adversarial, is excluded as in Mem0's protocol) with
  ``mode="kv"`` and ``mode="prompt"`` from the same top-k memories (the answer is greedy; temporal questions,
  code 2, get LoCoMo's hint to answer with a date).
- **Score** by numeric category code: token F1 and BLEU-1 (:mod:`inferscale.eval.metrics`), an LLM judge J
  (0/1 from an OpenAI-compatible endpoint, when configured), recall@k of the evidence dia_ids, and fidelity of
  KV injection to prompt injection: exact-match agreement of the two answers and the mean KL(prompt ‖ kv) of the
  first generated token's distribution (nats).

Runs are resumable: one JSON line per answered question is appended to ``OUT/results.jsonl`` (flushed at once);
a restart with the same ``--out`` skips the questions already there, and refuses to mix in results made with
other settings (``OUT/run.json``). The memory database lives in ``OUT/store``; a conversation is ingested once
(``OUT/ingested.json``). At the end ``summary.json``, ``summary.md`` and ``summary.png`` are written.

This module ingests and answers; the settings are in :mod:`inferscale.eval.locomo_settings`, the judge in
:mod:`inferscale.eval.judge` and the summary in :mod:`inferscale.eval.locomo_report`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale.errors import ConfigError, UnsupportedModelError
from inferscale.eval.judge import LLMJudge
from inferscale.eval.locomo import (
    LocomoConversation,
    LocomoQA,
    LocomoTurn,
    date_label,
    get_conversation,
    load_locomo,
    turn_text,
)
from inferscale.eval.locomo_files import RESULTS_FILE, check_run_file, ingested, load_results, mark_ingested
from inferscale.eval.locomo_report import print_summary, summarize, write_summary
from inferscale.eval.locomo_settings import ANSWERED_CATEGORIES, TEMPORAL_HINT, LocomoEvalSettings
from inferscale.eval.metrics import bleu1, exact_match, first_token_kl, locomo_f1

if TYPE_CHECKING:
    from rich.console import Console

    from inferscale.client import MemoryClient
    from inferscale.engines.base import Engine
    from inferscale.retrieval import Embedder

__all__ = [
    "ANSWERED_CATEGORIES",
    "EvalOutcome",
    "LLMJudge",
    "LocomoEvalSettings",
    "answer_question",
    "build_client",
    "ingest_conversation",
    "load_results",
    "memory_text",
    "print_summary",
    "question_key",
    "run_locomo_eval",
    "selected_questions",
    "summarize",
]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------- client


def build_client(
    settings: LocomoEvalSettings, *, engine: Engine | None = None, embedder: Embedder | None = None
) -> MemoryClient:
    """The memory client of a run: its store in ``OUT/store``, KV settings from ``settings``.

    Raises:
        ConfigError: when ``engine`` is given and serves other request-time remedies than ``settings`` ask for.
    """
    from inferscale.client import MemoryClient
    from inferscale.config import EngineConfig, MemoryConfig

    config = MemoryConfig(
        data_dir=str(settings.out_dir / "store"),
        engine=EngineConfig(
            model=settings.model,
            dtype=settings.dtype,
            device=settings.device,
            max_new_tokens=settings.max_new_tokens,
            num_threads=settings.num_threads,
        ),
        kv=settings.kv_config(),
    )
    if engine is not None and engine.serving != config.kv.serving():
        raise ConfigError(
            f"the engine passed in serves {engine.serving.label()}, but the run asks for "
            f"{config.kv.serving().label()}; build the engine with serving=KVConfig(...).serving()"
        )
    return MemoryClient(config, engine=engine, embedder=embedder)


# ---------------------------------------------------------------------------------------------------- ingestion


def memory_text(turn: LocomoTurn, date_label: str | None, captions: bool = True) -> str:
    """The memory stored for one turn: ``"[8 May 2023] Caroline: text [shares caption]"``.

    Args:
        turn: the turn.
        date_label: the session date shown in brackets, or ``None`` for no date prefix.
        captions: keep the photo caption (LoCoMo's RAG rendering, :func:`inferscale.eval.locomo.turn_text`).
    """
    line = turn_text(turn) if captions else f"{turn.speaker}: {turn.text}"
    return f"[{date_label}] {line}" if date_label else line


def ingest_conversation(client: MemoryClient, conv: LocomoConversation, settings: LocomoEvalSettings) -> int:
    """Store every turn of ``conv`` in scope ``user_id=conv.sample_id`` (emptied first), session by session.

    With ``infer=False`` each stored memory's metadata gets ``dia_id`` (its turn), ``dia_ids`` (every turn with
    the same text; normally one), ``speaker``, ``session`` and ``session_date``.

    Returns:
        The number of memories stored.
    """
    user = conv.sample_id
    client.delete_all(user_id=user)
    scope_ids: dict[str, list[str]] = {}
    speakers: dict[str, str] = {}
    stored: dict[str, str] = {}  # text -> memory id: the scope was emptied above, so every memory is from here
    for session in conv.sessions:
        label = date_label(session.date_time) if settings.date_in_text else None
        texts = [memory_text(t, label, settings.captions) for t in session.turns]
        meta = {"session": session.index, "session_date": session.date_time.isoformat(timespec="minutes")}
        messages = [{"role": "user", "content": text} for text in texts]
        result = client.add(messages, user_id=user, metadata=meta, infer=settings.infer)
        if settings.infer:
            continue
        stored.update((str(r["memory"]), str(r["id"])) for r in result["results"] if r.get("event") == "ADD")
        for turn, text in zip(session.turns, texts, strict=True):
            memory_id = stored.get(text)  # a repeated turn is credited to the memory stored first
            if memory_id is None:
                log.warning("turn %s of %s was not stored", turn.dia_id, user)
                continue
            scope_ids.setdefault(memory_id, []).append(turn.dia_id)
            speakers.setdefault(memory_id, turn.speaker)
    for memory_id, dia_ids in scope_ids.items():
        memory = client.get(memory_id, user_id=user)
        if memory is None:
            continue
        metadata = {**memory["metadata"], "dia_id": dia_ids[0], "dia_ids": dia_ids, "speaker": speakers[memory_id]}
        client.update(memory_id, metadata=metadata, user_id=user)  # metadata only: vector and K/V stay
    client.wait_for_encoding()  # answering is timed: no background K/V encoding beside it
    return len(client.get_all(user_id=user, limit=1_000_000)["results"])


# ---------------------------------------------------------------------------------------------------- answering


def question_key(conv: LocomoConversation, index: int) -> str:
    """The id of a question in ``results.jsonl``: ``"<sample_id>#<index in conv.qa>"``."""
    return f"{conv.sample_id}#{index}"


def _query(qa: LocomoQA) -> str:
    return qa.question + (TEMPORAL_HINT if qa.category == 2 else "")


def _recall(evidence: Sequence[str], retrieved: Iterable[str]) -> float | None:
    if not evidence:
        return None
    got = set(retrieved)
    wanted = set(evidence)
    return len(wanted & got) / len(wanted)


def answer_question(
    client: MemoryClient,
    conv: LocomoConversation,
    index: int,
    settings: LocomoEvalSettings,
    judge: LLMJudge | None,
) -> dict[str, Any]:
    """Answer one question in both modes from the same memories and score it; returns its JSON row."""
    qa = conv.qa[index]
    user = conv.sample_id
    query = _query(qa)
    hits = client.search(query, user_id=user, limit=settings.k)["results"]
    retrieved = [d for h in hits for d in (h["metadata"].get("dia_ids") or [])]
    kv = client.chat(query, user_id=user, limit=settings.k, mode="kv")
    prompt = client.chat(query, user_id=user, limit=settings.k, mode="prompt")
    row: dict[str, Any] = {
        "key": question_key(conv, index),
        "conversation": conv.sample_id,
        "qa_index": index,
        "category": qa.category,
        "question": qa.question,
        "gold": qa.answer,
        "evidence": list(qa.evidence),
        "retrieved_dia_ids": retrieved,
        "recall": None if settings.infer else _recall(qa.evidence, retrieved),
        "memory_ids_same": list(kv.memory_ids) == list(prompt.memory_ids),  # chat's, which may skip a search hit
        "memory_tokens": kv.memory_tokens,
    }
    for name, result in (("kv", kv), ("prompt", prompt)):
        t = result.timings
        row[name] = {
            "answer": result.answer,
            "f1": locomo_f1(result.answer, qa.answer, qa.category),
            "bleu1": bleu1(result.answer, qa.answer),
            "judge": judge.score(qa.question, qa.answer, result.answer) if judge is not None else None,
            "ttft_ms": round(t.ttft_ms, 2),
            "assembly_ms": round(t.kv_assembly_ms, 2),
            "prefill_ms": round(t.prefill_ms, 2),
        }
    row["exact_match"] = exact_match(kv.answer, prompt.answer)
    row["kl"] = _first_token_kl(client, query, kv.memory_ids, kv.memories) if settings.fidelity else None
    return row


def _first_token_kl(client: MemoryClient, query: str, memory_ids: Sequence[str], texts: Sequence[str]) -> float | None:
    """KL(prompt ‖ kv) of the first token on the given memories (ids and their texts, in chat's order), or
    ``None`` when the engine cannot give full-vocabulary logits."""
    engine = client.engine
    try:
        kv_logits = engine.first_token_logits(query, client.memory_kv(memory_ids))
        prompt_logits = engine.first_token_logits(query, None, [engine.fact_token_ids(t) for t in texts])
    except UnsupportedModelError:
        return None
    return round(first_token_kl(prompt_logits, kv_logits), 6)


# ---------------------------------------------------------------------------------------------------- the run


@dataclass
class EvalOutcome:
    """What :func:`run_locomo_eval` did.

    Attributes:
        summary: see :func:`summarize`.
        answered: questions answered in this call (the rest were already in ``results.jsonl``).
        skipped: questions skipped because they were already done.
        paths: the files written, by name.
    """

    summary: dict[str, Any]
    answered: int
    skipped: int
    paths: dict[str, Path] = field(default_factory=dict)


def selected_questions(
    convs: Sequence[LocomoConversation], settings: LocomoEvalSettings
) -> list[tuple[LocomoConversation, int]]:
    """``(conversation, qa index)`` of every question to answer: categories 1-4, at most ``limit`` per
    conversation, in file order."""
    chosen = [get_conversation(convs, sid) for sid in settings.conversations] if settings.conversations else convs
    out: list[tuple[LocomoConversation, int]] = []
    for conv in chosen:
        indices = [i for i, qa in enumerate(conv.qa) if qa.category in ANSWERED_CATEGORIES]
        out += [(conv, i) for i in indices[: settings.limit]]
    return out


def run_locomo_eval(
    settings: LocomoEvalSettings,
    *,
    client: MemoryClient | None = None,
    engine: Engine | None = None,
    embedder: Embedder | None = None,
    console: Console | None = None,
    progress: bool = True,
) -> EvalOutcome:
    """Ingest, answer (skipping questions already in ``results.jsonl``), then summarise.

    Args:
        settings: see :class:`LocomoEvalSettings`.
        client: a ready client (tests); default :func:`build_client`.
        engine, embedder: loaded models for :func:`build_client`.
        console: where messages go (default: stderr).
        progress: show a progress bar (rich) on ``console``.

    Raises:
        InvalidInputError: for a missing or malformed data file or an unknown conversation id.
        ConfigError: when ``--out`` holds results made with other settings, the judge's URL or model is invalid,
            or rich or matplotlib is missing (the ``apps`` extra).
    """
    from inferscale.apps_extra import console as make_console

    console = console or make_console(stderr=True)
    out_dir = Path(settings.out_dir)
    convs = load_locomo(settings.data)
    questions = selected_questions(convs, settings)
    out_dir.mkdir(parents=True, exist_ok=True)  # after the input's checks: a refused run leaves no folder behind
    check_run_file(out_dir, settings)
    results_path = out_dir / RESULTS_FILE
    done = load_results(results_path)
    todo = [(c, i) for c, i in questions if question_key(c, i) not in done]
    answered = 0
    if todo:
        own_client = client is None
        client = client or build_client(settings, engine=engine, embedder=embedder)
        judge = _make_judge(settings)
        try:
            answered = _answer_all(client, todo, len(questions), settings, judge, results_path, console, progress)
        finally:
            if judge is not None:
                judge.close()
            if own_client:
                client.close()
    rows = load_results(results_path)
    selected = [rows[question_key(c, i)] for c, i in questions if question_key(c, i) in rows]
    summary = summarize(selected, settings)
    paths = write_summary(summary, out_dir)
    return EvalOutcome(summary=summary, answered=answered, skipped=len(questions) - len(todo), paths=paths)


def _make_judge(settings: LocomoEvalSettings) -> LLMJudge | None:
    if settings.judge_base_url and settings.judge_model:
        return LLMJudge(settings.judge_base_url, settings.judge_model, settings.judge_api_key)
    return None


def _answer_all(
    client: MemoryClient,
    todo: list[tuple[LocomoConversation, int]],
    total: int,
    settings: LocomoEvalSettings,
    judge: LLMJudge | None,
    results_path: Path,
    console: Console,
    progress: bool,
) -> int:
    from inferscale.apps_extra import progress_bar

    out_dir = results_path.parent
    answered = 0
    with (
        progress_bar(console, disable=not progress) as bar,
        results_path.open("a", encoding="utf-8") as sink,
    ):
        task = bar.add_task("LoCoMo", total=total, completed=total - len(todo), status="")
        for conv, index in todo:
            if conv.sample_id not in ingested(out_dir):
                t0 = time.perf_counter()
                bar.update(task, status=f"ingesting {conv.sample_id}")
                n = ingest_conversation(client, conv, settings)
                mark_ingested(out_dir, conv.sample_id, n)
                console.print(
                    f"ingested {conv.sample_id}: {n} memories in {time.perf_counter() - t0:.1f} s", style="dim"
                )
            bar.update(task, status=conv.sample_id)
            row = answer_question(client, conv, index, settings, judge)
            sink.write(json.dumps(row, ensure_ascii=False) + "\n")
            sink.flush()
            os.fsync(sink.fileno())
            answered += 1
            bar.advance(task)
    return answered
