"""``inferscale eval locomo``: LoCoMo question answering with KV injection and with prompt injection.

Protocol (close to Mem0's, see ``../shared/data/locomo/FORMAT.md``; the data is read from ``--data`` at run time and
never copied):

- **Ingest** each conversation into one scope (``user_id = sample_id``), session by session, with
  ``infer=False``: each turn becomes one memory, ``"[<session date>] <Speaker>: <text>"`` (the date prefix and the
  photo caption ``[shares …]`` can be turned off). The turns before it in its session are its encoding context
  (context window w). Each memory's metadata records its ``dia_id``, speaker, session number and session date,
  so retrieval recall can be checked against the evidence ids. ``infer=True`` (LLM fact extraction) is also
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
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from inferscale.config import KVConfig
from inferscale.errors import ConfigError
from inferscale.eval.locomo import LocomoConversation, LocomoQA, LocomoTurn, get_conversation, load_locomo, turn_text
from inferscale.eval.metrics import STEMMER, bleu1, exact_match, first_token_kl, locomo_f1

if TYPE_CHECKING:
    from inferscale.client import MemoryClient
    from inferscale.engines.base import Engine
    from inferscale.retrieval import Embedder

__all__ = [
    "ANSWERED_CATEGORIES",
    "LLMJudge",
    "LocomoEvalSettings",
    "build_client",
    "ingest_conversation",
    "load_results",
    "memory_text",
    "print_summary",
    "run_locomo_eval",
    "summarize",
]

log = logging.getLogger(__name__)

ANSWERED_CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)
"""Numeric category codes that are answered and scored (5, adversarial, is excluded as in Mem0's protocol)."""

TEMPORAL_HINT = " Use the dates of the memories to answer with an approximate date."
"""Appended to category-2 (temporal) questions, as LoCoMo's own prediction code does."""

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
INGESTED_FILE = "ingested.json"

_RUN_KEYS = (
    "k",
    "context_window",
    "recompute",
    "memory_attention_scale",
    "position_buckets",
    "encode_after_system_prefix",
    "model",
    "dtype",
    "max_new_tokens",
    "captions",
    "date_in_text",
    "infer",
    "judge_model",
)
"""Settings that change the answers: a resumed run must use the same values."""


@dataclass(frozen=True)
class LocomoEvalSettings:
    """What ``inferscale eval locomo`` runs.

    Attributes:
        data: path of ``locomo10.json``.
        conversations: sample ids to run (``None``: all ten).
        limit: at most this many questions (categories 1-4, file order) per conversation; ``None``: all.
        k: memories retrieved per question.
        context_window: w, preceding turns each memory is encoded after (``KVConfig.context_window``).
        recompute: ``KVConfig.recompute`` (``none``, ``head:m``, ``structure``, ``selective:r``).
        memory_attention_scale: ``KVConfig.memory_attention_scale`` s (1 = off).
        position_buckets: ``KVConfig.position_buckets`` (position-aware encoding distances, tokens).
        encode_after_system_prefix: encode facts after the system prefix (``KVConfig``; sink remedy).
        out_dir: results folder (``results.jsonl``, ``summary.*``, the memory store).
        judge_base_url, judge_model, judge_api_key: OpenAI-compatible LLM judge; J is skipped unless both URL and
            model are set.
        model: chat model folder or name (``None``: the embedded SmolLM2-135M-Instruct).
        dtype, device: engine dtype and device.
        max_new_tokens: answer budget (tokens).
        captions: render a shared photo's BLIP caption after the turn text (``[shares …]``).
        date_in_text: prefix each memory with its session date, so that both modes can answer temporal questions.
        infer: extract facts with the LLM instead of storing turns verbatim (no dia_ids, so no recall).
        fidelity: compute the first-token KL (two extra forward passes per question).
        num_threads: torch CPU threads (``None``: torch's default).
    """

    data: Path
    conversations: tuple[str, ...] | None = None
    limit: int | None = None
    k: int = 10
    context_window: int = KVConfig.model_fields["context_window"].default
    recompute: str = KVConfig.model_fields["recompute"].default
    memory_attention_scale: float = KVConfig.model_fields["memory_attention_scale"].default
    position_buckets: tuple[int, ...] = KVConfig.model_fields["position_buckets"].default
    encode_after_system_prefix: bool = True
    out_dir: Path = Path("out/eval/locomo")
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key: str | None = None
    model: str | None = None
    dtype: str = "bfloat16"
    device: str = "auto"
    max_new_tokens: int = 32
    captions: bool = True
    date_in_text: bool = True
    infer: bool = False
    fidelity: bool = True
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1, got {self.limit}")
        if self.context_window < 0:
            raise ConfigError(f"context window must be >= 0, got {self.context_window}")
        self.kv_config()  # the KV settings validate as KVConfig does
        if bool(self.judge_base_url) != bool(self.judge_model):
            raise ConfigError("the LLM judge needs both --judge-base-url and --judge-model")

    def kv_config(self) -> KVConfig:
        """The run's :class:`KVConfig`.

        Raises:
            ConfigError: when a KV setting is invalid.
        """
        try:
            return KVConfig(
                context_window=self.context_window,
                encode_after_system_prefix=self.encode_after_system_prefix,
                recompute=self.recompute,
                memory_attention_scale=self.memory_attention_scale,
                position_buckets=self.position_buckets,
            )
        except ValidationError as exc:
            raise ConfigError(f"invalid KV settings: {exc}") from exc

    @property
    def judged(self) -> bool:
        """Whether an LLM judge is configured."""
        return bool(self.judge_base_url and self.judge_model)

    def run_dict(self) -> dict[str, Any]:
        """The settings that change answers (recorded in ``run.json``)."""
        return {key: getattr(self, key) for key in _RUN_KEYS}


# ---------------------------------------------------------------------------------------------------- LLM judge


_JUDGE_SYSTEM = (
    "You grade answers to questions about a long conversation. You are given the question, the gold answer and "
    "a generated answer. Be generous: the generated answer is CORRECT when it refers to the same thing as the "
    "gold answer, even if it is longer, worded differently or gives a date in another format; it is WRONG when "
    "it misses the gold answer, contradicts it or says the information is not available. Reply with JSON only: "
    '{"label": "CORRECT"} or {"label": "WRONG"}.'
)


class LLMJudge:
    """A 0/1 LLM judge over an OpenAI-compatible ``/chat/completions`` endpoint (httpx, temperature 0).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the judge model name.
        api_key: sent as a bearer token when given.
        timeout_s: per-request timeout (s).
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    def score(self, question: str, gold: str, answer: str) -> int | None:
        """1 (correct), 0 (wrong), or ``None`` when the endpoint fails or the reply cannot be read (logged)."""
        user = f"Question: {question}\nGold answer: {gold}\nGenerated answer: {answer}"
        body = {
            "model": self._model,
            "messages": [{"role": "system", "content": _JUDGE_SYSTEM}, {"role": "user", "content": user}],
            "temperature": 0,
            "max_tokens": 32,
        }
        try:
            response = self._http.post(self._url, json=body)
            response.raise_for_status()
            text = str(response.json()["choices"][0]["message"]["content"])
        except Exception as exc:  # network, HTTP status, or an unexpected body: J is missing for this answer
            log.warning("LLM judge failed: %s", exc)
            return None
        upper = text.upper()
        if "CORRECT" in upper and "WRONG" not in upper:
            return 1
        if "WRONG" in upper:
            return 0
        log.warning("LLM judge reply has no label: %r", text[:200])
        return None

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()


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
            dtype=settings.dtype,  # type: ignore[arg-type]
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


def _date_label(session_date: Any) -> str:
    return f"{session_date.day} {session_date:%B %Y}"


def ingest_conversation(client: MemoryClient, conv: LocomoConversation, settings: LocomoEvalSettings) -> int:
    """Store every turn of ``conv`` in scope ``user_id=conv.sample_id`` (emptied first), session by session.

    With ``infer=False`` each stored memory's metadata gets ``dia_id`` (its turn), ``dia_ids`` (every turn with
    the same text; normally one), ``speaker``, ``session`` and ``session_date``.

    Returns:
        The number of memories stored.
    """
    from inferscale.storage import hash_text

    user = conv.sample_id
    client.delete_all(user_id=user)
    scope_ids: dict[str, list[str]] = {}
    speakers: dict[str, str] = {}
    for session in conv.sessions:
        label = _date_label(session.date_time) if settings.date_in_text else None
        texts = [memory_text(t, label, settings.captions) for t in session.turns]
        meta = {"session": session.index, "session_date": session.date_time.isoformat(timespec="minutes")}
        messages = [{"role": "user", "content": text} for text in texts]
        result = client.add(messages, user_id=user, metadata=meta, infer=settings.infer)
        if settings.infer:
            continue
        added = [r for r in result["results"] if r.get("event") == "ADD"]
        position = 0
        for turn, text in zip(session.turns, texts, strict=True):
            if position < len(added) and added[position]["memory"] == text:
                memory_id = str(added[position]["id"])
                position += 1
            else:  # a text already stored in the scope (a repeated turn): credit the stored memory
                record = client.db.find_by_hash(hash_text(text), _scope(user))
                if record is None:
                    log.warning("turn %s of %s was not stored", turn.dia_id, user)
                    continue
                memory_id = record.id
            scope_ids.setdefault(memory_id, []).append(turn.dia_id)
            speakers.setdefault(memory_id, turn.speaker)
    for memory_id, dia_ids in scope_ids.items():
        record = client.db.get(memory_id)
        if record is None:
            continue
        metadata = {**record.metadata, "dia_id": dia_ids[0], "dia_ids": dia_ids, "speaker": speakers[memory_id]}
        client.db.update(memory_id, None, metadata)  # metadata only: text, vector and K/V stay valid
    return len(client.get_all(user_id=user, limit=1_000_000)["results"])


def _scope(user: str) -> Any:
    from inferscale.scope import Scope

    return Scope(user, None, None)


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
        "memory_ids_same": list(kv.memory_ids) == list(prompt.memory_ids) == [h["id"] for h in hits],
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
    row["kl"] = _first_token_kl(client, query, kv.memory_ids) if settings.fidelity else None
    return row


def _first_token_kl(client: MemoryClient, query: str, memory_ids: Sequence[str]) -> float | None:
    """KL(prompt ‖ kv) of the first token on the given memories, or ``None`` when the engine cannot say."""
    engine = client.engine
    logits = getattr(engine, "first_token_logits", None)
    if logits is None:
        return None
    records = [client.db.get(memory_id) for memory_id in memory_ids]
    if any(r is None for r in records):
        return None
    facts = client.fact_kv.ensure(records)  # type: ignore[arg-type]
    kv_logits = logits(query, facts)
    prompt_logits = logits(query, None, [engine.fact_token_ids(r.text) for r in records])  # type: ignore[union-attr]
    return round(first_token_kl(prompt_logits, kv_logits), 6)


# ---------------------------------------------------------------------------------------------------- resumability


def load_results(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of a ``results.jsonl`` by key (a torn last line, from a killed run, is ignored)."""
    rows: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            log.warning("ignoring a torn line in %s", path)
            continue
        rows[str(row["key"])] = row
    return rows


def _check_run_file(out_dir: Path, settings: LocomoEvalSettings) -> None:
    path = out_dir / RUN_FILE
    # Compared as they read back from JSON (a tuple setting comes back as a list), so a resumed run matches itself.
    current = json.loads(json.dumps(settings.run_dict()))
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        changed = {k: (previous.get(k), v) for k, v in current.items() if previous.get(k) != v}
        if changed:
            detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ConfigError(
                f"{out_dir} holds results made with other settings ({detail}); pass another --out to start a new run"
            )
        return
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")


def _ingested(out_dir: Path) -> dict[str, int]:
    path = out_dir / INGESTED_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _mark_ingested(out_dir: Path, sample_id: str, n: int) -> None:
    done = _ingested(out_dir)
    done[sample_id] = n
    (out_dir / INGESTED_FILE).write_text(json.dumps(done, indent=2) + "\n", encoding="utf-8")


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
        progress: show a tqdm progress bar.

    Raises:
        InvalidInputError: for a missing or malformed data file or an unknown conversation id.
        ConfigError: when ``--out`` holds results made with other settings.
    """
    console = console or Console(stderr=True)
    out_dir = Path(settings.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    convs = load_locomo(settings.data)
    questions = selected_questions(convs, settings)
    _check_run_file(out_dir, settings)
    results_path = out_dir / RESULTS_FILE
    done = load_results(results_path)
    todo = [(c, i) for c, i in questions if question_key(c, i) not in done]
    answered = 0
    if todo:
        own_client = client is None
        client = client or build_client(settings, engine=engine, embedder=embedder)
        judge = (
            LLMJudge(settings.judge_base_url, settings.judge_model, settings.judge_api_key)  # type: ignore[arg-type]
            if settings.judged
            else None
        )
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
    from tqdm import tqdm

    out_dir = results_path.parent
    answered = 0
    bar = tqdm(total=total, initial=total - len(todo), desc="LoCoMo", unit="q", disable=not progress)
    try:
        with results_path.open("a", encoding="utf-8") as sink:
            for conv, index in todo:
                if conv.sample_id not in _ingested(out_dir):
                    t0 = time.perf_counter()
                    bar.set_postfix_str(f"ingesting {conv.sample_id}")
                    n = ingest_conversation(client, conv, settings)
                    _mark_ingested(out_dir, conv.sample_id, n)
                    console.print(
                        f"ingested {conv.sample_id}: {n} memories in {time.perf_counter() - t0:.1f} s", style="dim"
                    )
                bar.set_postfix_str(conv.sample_id)
                row = answer_question(client, conv, index, settings, judge)
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                sink.flush()
                os.fsync(sink.fileno())
                answered += 1
                bar.update(1)
    finally:
        bar.close()
    return answered


# ---------------------------------------------------------------------------------------------------- summary


def _mean(values: Iterable[float | int | bool | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return round(statistics.fmean(kept), 4) if kept else None


def _median(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return round(statistics.median(kept), 2) if kept else None


def _group(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "n": len(rows),
        "f1_kv": _mean(r["kv"]["f1"] for r in rows),
        "f1_prompt": _mean(r["prompt"]["f1"] for r in rows),
        "bleu1_kv": _mean(r["kv"]["bleu1"] for r in rows),
        "bleu1_prompt": _mean(r["prompt"]["bleu1"] for r in rows),
        "j_kv": _mean(r["kv"]["judge"] for r in rows),
        "j_prompt": _mean(r["prompt"]["judge"] for r in rows),
        "recall_at_k": _mean(r["recall"] for r in rows),
        "exact_match_agreement": _mean(r["exact_match"] for r in rows),
        "kl_mean": _mean(r["kl"] for r in rows),
        "ttft_kv_p50_ms": _median(r["kv"]["ttft_ms"] for r in rows),
        "ttft_prompt_p50_ms": _median(r["prompt"]["ttft_ms"] for r in rows),
        "same_memories": all(r["memory_ids_same"] for r in rows),
    }


def summarize(rows: Sequence[Mapping[str, Any]], settings: LocomoEvalSettings) -> dict[str, Any]:
    """Metrics per numeric category code and overall (means over questions; J and recall over the questions that
    have them; KL in nats, TTFT medians in ms)."""
    by_category = {str(c): _group([r for r in rows if r["category"] == c]) for c in ANSWERED_CATEGORIES}
    settings_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    settings_dict.pop("judge_api_key", None)
    return {
        "benchmark": "locomo",
        "settings": settings_dict,
        "stemmer": STEMMER,
        "conversations": sorted({str(r["conversation"]) for r in rows}),
        "categories": {k: v for k, v in by_category.items() if v["n"]},
        "overall": _group(rows) if rows else {"n": 0},
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


_COLUMNS = (
    ("n", "n"),
    ("F1 kv", "f1_kv"),
    ("F1 prompt", "f1_prompt"),
    ("BLEU-1 kv", "bleu1_kv"),
    ("BLEU-1 prompt", "bleu1_prompt"),
    ("J kv", "j_kv"),
    ("J prompt", "j_prompt"),
    ("recall@k", "recall_at_k"),
    ("EM agree", "exact_match_agreement"),
    ("KL mean", "kl_mean"),
    ("TTFT kv p50", "ttft_kv_p50_ms"),
    ("TTFT prompt p50", "ttft_prompt_p50_ms"),
)


def _rows_for_table(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    rows = [(f"cat {c}", g) for c, g in summary["categories"].items()]
    return [*rows, ("all", summary["overall"])]


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a markdown table (per category code, then overall) with the run's settings."""
    s = summary["settings"]
    lines = [
        "# LoCoMo: KV injection vs prompt injection",
        "",
        f"Conversations: {', '.join(summary['conversations']) or 'none'}; k={s['k']}, w={s['context_window']}, "
        f"recompute={s['recompute']}, s={s['memory_attention_scale']}, buckets={s['position_buckets']}, "
        f"encode after system prefix: {s['encode_after_system_prefix']}; "
        f"model {s['model'] or 'SmolLM2-135M-Instruct (embedded)'} ({s['dtype']}); stemmer: {summary['stemmer']}.",
        "Category codes: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop (LoCoMo's mapping). "
        "KL(prompt ‖ kv) of the first token in nats; TTFT in ms.",
        "",
        "| " + " | ".join(["category", *(name for name, _ in _COLUMNS)]) + " |",
        "|" + "---|" * (len(_COLUMNS) + 1),
    ]
    for label, group in _rows_for_table(summary):
        cells = [_fmt(group.get(key), 1 if key.startswith("ttft") else 3) for _, key in _COLUMNS]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def write_summary(summary: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``summary.json``, ``summary.md`` and ``summary.png``; returns their paths."""
    paths = {
        "results": out_dir / RESULTS_FILE,
        "json": out_dir / "summary.json",
        "markdown": out_dir / "summary.md",
        "plot": out_dir / "summary.png",
    }
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    paths["markdown"].write_text(summary_markdown(summary), encoding="utf-8")
    plot_summary(summary, paths["plot"])
    return paths


def plot_summary(summary: Mapping[str, Any], path: Path) -> None:
    """Bars per category code: F1 and BLEU-1 of both modes (left); recall@k and exact-match agreement (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _rows_for_table(summary)
    labels = [label for label, _ in groups]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.2), dpi=120)
    series = (
        ("F1 kv", "f1_kv"),
        ("F1 prompt", "f1_prompt"),
        ("BLEU-1 kv", "bleu1_kv"),
        ("BLEU-1 prompt", "bleu1_prompt"),
    )
    _bars(left, labels, groups, series)
    left.set_title("Answer quality by category code")
    _bars(right, labels, groups, (("recall@k", "recall_at_k"), ("EM agreement kv/prompt", "exact_match_agreement")))
    right.set_title("Retrieval recall and KV/prompt agreement")
    for ax in (left, right):
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _bars(
    ax: Any, labels: list[str], groups: list[tuple[str, Mapping[str, Any]]], series: Sequence[tuple[str, str]]
) -> None:
    width = 0.8 / len(series)
    for j, (name, key) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [g.get(key) or 0.0 for _, g in groups], width, label=name)
    ax.set_xticks(range(len(labels)), labels)


def print_summary(summary: Mapping[str, Any], console: Console | None = None) -> None:
    """Print the summary table (per category code and overall)."""
    console = console or Console()
    s = summary["settings"]
    table = Table(
        title=(
            f"LoCoMo {', '.join(summary['conversations'])}: k={s['k']}, w={s['context_window']}, "
            f"recompute={s['recompute']}, s={s['memory_attention_scale']}, buckets={s['position_buckets']}, "
            f"prefix={s['encode_after_system_prefix']} (TTFT ms, KL nats)"
        )
    )
    table.add_column("category")
    for name, _ in _COLUMNS:
        table.add_column(name, justify="right")
    for label, group in _rows_for_table(summary):
        table.add_row(label, *(_fmt(group.get(key), 1 if key.startswith("ttft") else 3) for _, key in _COLUMNS))
    console.print(table)
