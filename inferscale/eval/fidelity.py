"""``inferscale eval fidelity``: how far KV-injected answers are from pasted ones, per serving setting.

For every slice (:mod:`inferscale.eval.fidelity_cases`), every system prompt and every setting, each case is
answered twice from the same memories in the same order: once with the memory tokens prefilled as text (prompt
mode, the reference) and once with their K/V injected under the setting (KV mode). Per setting it reports:

- KL(prompt ‖ kv) of the first generated token's distribution (nats): mean and median; first-token agreement
  (the two argmaxes equal);
- token F1 between the KV and the prompt answer, and of each against the gold answer (when the case has one);
- how often each mode's answer hits the token budget, and how often it repeats itself (:func:`repeats`);
- the extra tokens the setting prefills (as a fraction of the memory tokens) and the engine-side TTFT (ms).

A setting (:class:`FidelitySetting`) combines the request-time remedies (:class:`inferscale.kv.serving.ServingSettings`)
with position-aware encoding: ``position_buckets`` are the distances from the system prefix a fact is encoded at
(:attr:`inferscale.kv.encode.EncodeRequest.position_gap`); at serve time each fact uses the bucket nearest to its
real offset in the memory segment (:func:`inferscale.kv.serving.nearest_bucket`). Its ``storage_format`` stores the
facts' K/V as ``kv.storage_format`` does (:mod:`inferscale.kv.quantization`): quantised once after encoding, then
dequantised by the engine's assembly.

A setting may also serve the memories as text (``serve_as="prompt"``) in another order (``memory_order``): a
control, not a remedy. Prompt mode against itself with the memories reversed measures how much the model's answer
moves when nothing but an arbitrary choice changes (retrieval order against date order), a floor under the figures
any KV setting can be asked for.

With a ``reference`` setting instead of prompt mode, the same figures compare two K/V settings: e.g. 8-bit K/V
against the model dtype's (``benchmarks/kv_quantization.py``); the ``prompt_*`` fields then hold the reference's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferscale.config import KVConfig, PositionBuckets, RecomputeSpec
from inferscale.eval.fidelity_cases import MAX_CONTEXT_TURNS, FidelityCase, FidelitySlice
from inferscale.eval.metrics import first_token_kl, token_f1
from inferscale.eval.system_prompts import SYSTEM_PROMPTS
from inferscale.formats import StorageFormat
from inferscale.kv.encode import EncodeRequest
from inferscale.kv.fact import FactKV
from inferscale.kv.recompute import RecomputePolicy
from inferscale.kv.serving import ServingSettings, bucket_per_fact, gap_for_bucket

__all__ = [
    "SCALE_GRID",
    "SYSTEM_PROMPTS",
    "Calibration",
    "FactCache",
    "FidelitySetting",
    "SettingSummary",
    "calibrate_scale",
    "first_token_row",
    "kv_answer_fields",
    "prompt_reference",
    "repeats",
    "run_fidelity",
    "summarize_rows",
]


def _product_default(field: str) -> Any:
    """The default of a :class:`~inferscale.config.KVConfig` field."""
    return KVConfig.model_fields[field].default


class FidelitySetting(BaseModel):
    """One serving setting to measure. A field left out takes :class:`~inferscale.config.KVConfig`'s default, so
    ``FidelitySetting()`` serves as the product does out of the box and a setting names only what it changes
    (``{"recompute": "tail:16"}`` is the default plus a recomputed tail; pure injection is
    ``{"context_window": 0}``).

    Attributes:
        name: its label in the report (defaults to a description of the fields).
        attention_scale: s, the memory block's attention scale (1 = off).
        temperature: T, the memory logits' temperature (1 = off).
        recompute: ``"none"``, ``"head:m"``, ``"tail:n"``, ``"structure"`` or ``"selective:r"``
            (:mod:`inferscale.kv.recompute`).
        position_buckets: distances from the system prefix (tokens) the facts are encoded at; ``[0]`` encodes
            each fact right after the prefix.
        context_window: w, the conversation turns before each memory it is encoded after (laid out as memory
            lines; the case's ``contexts``), as ``KVConfig.context_window``.
        storage_format: how the facts' K/V are stored, as ``KVConfig.storage_format``.
        first_memory_context_free: serve the first memory of the layout from its context-free encoding (right after
            the system prefix, no turns), as ``KVConfig.first_memory_context_free``.
        encode_alone: encode each fact in a forward pass of its own, not batched with the case's other facts: the
            same K/V up to the kernels' rounding, which the batch shape changes (in bfloat16, by about 0.6% of
            their norm). Against a batched reference it measures the noise the product already accepts: a control
            for the rounding another setting adds (8-bit storage).
        serve_as: ``"kv"`` injects the memories' K/V; ``"prompt"`` pastes them as text (a control: every other
            K/V field must keep its default, and every memory token counts as prefilled).
        memory_order: ``"as_given"`` lays the memories out in the case's order; ``"reversed"`` in the opposite
            one (the reference keeps the case's order).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    attention_scale: float = Field(default=_product_default("memory_attention_scale"), gt=0)
    temperature: float = Field(default=_product_default("memory_temperature"), gt=0)
    recompute: RecomputeSpec = _product_default("recompute")
    position_buckets: PositionBuckets = _product_default("position_buckets")
    context_window: int = Field(default=_product_default("context_window"), ge=0, le=MAX_CONTEXT_TURNS)
    storage_format: StorageFormat = _product_default("storage_format")
    first_memory_context_free: bool = _product_default("first_memory_context_free")
    encode_alone: bool = False
    serve_as: Literal["kv", "prompt"] = "kv"
    memory_order: Literal["as_given", "reversed"] = "as_given"

    @model_validator(mode="after")
    def _prompt_control_has_no_kv_fields(self) -> FidelitySetting:
        if self.serve_as == "prompt":
            changed = sorted(f for f, default in _KV_DEFAULTS.items() if getattr(self, f) != default)
            if changed:
                raise ValueError(f"serve_as='prompt' pastes the memories as text; {changed} apply to K/V only")
        return self

    @classmethod
    def from_kv(cls, kv: KVConfig, name: str = "") -> FidelitySetting:
        """The setting a :class:`inferscale.config.KVConfig` serves (its remedies and encoding)."""
        return cls(
            name=name,
            attention_scale=kv.memory_attention_scale,
            temperature=kv.memory_temperature,
            recompute=kv.recompute,
            position_buckets=kv.position_buckets,
            context_window=kv.context_window,
            storage_format=kv.storage_format,
            first_memory_context_free=kv.first_memory_context_free,
        )

    @property
    def serving(self) -> ServingSettings:
        """The request-time part of the setting."""
        return ServingSettings(self.attention_scale, self.temperature, RecomputePolicy.parse(self.recompute))

    @property
    def label(self) -> str:
        """``name`` if set, else the fields, e.g. ``"s=0.35 T=1 recompute=none buckets=0"``."""
        if self.name:
            return self.name
        buckets = "/".join(map(str, self.position_buckets))
        stored = "" if self.storage_format == "model" else f" kv={self.storage_format}"
        alone = " encoded alone" if self.encode_alone else ""
        first = " first context-free" if self.first_memory_context_free else ""
        order = " reversed" if self.memory_order == "reversed" else ""
        if self.serve_as == "prompt":
            return f"prompt{order}"
        return f"{self.serving.label()} buckets={buckets} w={self.context_window}{first}{stored}{alone}{order}"


_KV_DEFAULTS: dict[str, Any] = {
    name: info.default
    for name, info in FidelitySetting.model_fields.items()
    if name not in ("name", "serve_as", "memory_order")
}
"""Each K/V field's default, which a ``serve_as="prompt"`` setting must keep."""


_REPEAT_N = 4


def repeats(token_ids: Sequence[int], n: int = _REPEAT_N) -> bool:
    """Whether an answer repeats itself: some run of ``n`` tokens occurs twice or more."""
    seen: set[tuple[int, ...]] = set()
    for i in range(len(token_ids) - n + 1):
        gram = tuple(token_ids[i : i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False


@dataclass(frozen=True)
class SettingSummary:
    """Aggregates of one (setting, slice, system prompt) group; see the module notes for each figure."""

    setting: str
    slice: str
    system_prompt: str
    n: int
    kl_mean: float
    kl_median: float
    top1_agreement: float
    f1_kv_vs_prompt: float
    f1_kv_gold: float | None
    f1_prompt_gold: float | None
    kv_budget_hit: float
    prompt_budget_hit: float
    kv_repeat: float
    prompt_repeat: float
    added_tokens: float
    added_fraction: float
    ttft_kv_ms: float
    ttft_prompt_ms: float


_FactKey = tuple[str, tuple[str, ...], int, bool]
"""(text, context turns, position bucket, encoded alone): what a fact's K/V depend on in a fidelity run."""


class FactCache:
    """Encoded facts of one engine (system prompt), keyed by (text, context, bucket, alone): each is encoded once,
    and quantised once per storage format from that encoding."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._facts: dict[_FactKey, FactKV] = {}
        self._stored: dict[tuple[str, _FactKey], FactKV] = {}

    def encoded(self) -> list[FactKV]:
        """Every fact encoded so far in batches, in the model's dtype (one per (text, context, bucket))."""
        return [fact for key, fact in self._facts.items() if not key[3]]

    def get(self, case: FidelityCase, setting: FidelitySetting) -> list[FactKV]:
        """The case's facts encoded and stored as ``setting`` asks, in layout order (8-bit ones as codes and
        scales)."""
        fmt = setting.storage_format
        encoded = self._encoded(case, setting)
        if fmt == "model":
            return [fact for _, fact in encoded]
        for key, fact in encoded:
            if (fmt, key) not in self._stored:
                self._stored[(fmt, key)] = fact.quantized(fmt)
        return [self._stored[(fmt, key)] for key, _ in encoded]

    def _encoded(self, case: FidelityCase, setting: FidelitySetting) -> list[tuple[_FactKey, FactKV]]:
        """``(cache key, K/V in the model's dtype)`` of the case's facts, in layout order; missing ones encoded (in
        one call, or one call per fact with ``setting.encode_alone``)."""
        texts = case.memories
        w = setting.context_window
        contexts = [tuple(case.context_of(i)[-w:]) if w else () for i in range(len(texts))]
        lengths = [len(self._engine.fact_token_ids(t)) for t in texts]
        gaps = bucket_per_fact(lengths, setting.position_buckets)
        if setting.first_memory_context_free and texts:  # right after the prefix, as prompt mode's first line
            contexts[0], gaps[0] = (), 0
        alone = [setting.encode_alone] * len(texts)
        wanted = list(zip(texts, contexts, gaps, alone, strict=True))
        missing = list(dict.fromkeys(key for key in wanted if key not in self._facts))
        if missing:
            prefix = self._engine.system_prefix_ids()
            requests = []
            for text, context, bucket, _ in missing:
                turns = self._engine.context_token_ids(list(context))
                requests.append(
                    EncodeRequest(
                        self._engine.fact_token_ids(text),
                        context_ids=prefix + turns,
                        position_gap=gap_for_bucket(bucket, len(turns)),
                    )
                )
            calls = [[r] for r in requests] if setting.encode_alone else [requests]
            encoded = [fact for call in calls for fact in self._engine.encode_facts(call)]
            for key, fact in zip(missing, encoded, strict=True):
                self._facts[key] = fact
        return [(key, self._facts[key]) for key in wanted]


def run_fidelity(
    engines: dict[str, Any],
    slices: Sequence[FidelitySlice],
    settings: Sequence[FidelitySetting],
    max_new_tokens: int = 32,
    generate: bool = True,
    progress: Callable[[str], None] | None = None,
    reference: FidelitySetting | None = None,
    caches: dict[str, FactCache] | None = None,
) -> list[dict[str, Any]]:
    """Measure every setting on every case of every slice, under every system prompt.

    Args:
        engines: one engine (transformers or vLLM) per system prompt name (same model), e.g. built from
            :data:`SYSTEM_PROMPTS`; each setting is passed per request (the engines' own settings are not used).
        slices: the cases.
        settings: the settings to measure.
        max_new_tokens: answer budget (tokens).
        generate: also generate both answers (F1, budget and repeat rates, TTFT); ``False`` measures the first
            token only (KL, agreement), as calibration does.
        progress: called with a line of text after each case.
        reference: answer the reference with the memories' K/V served under this setting instead of prompt mode
            (``kl`` is then KL(reference ‖ setting), and ``prompt_answer``, ``prompt_tokens``, ... are the
            reference's).
        caches: the encoded facts per system prompt name, used and filled (pass the same dict to several runs to
            encode each fact once); ``None`` encodes afresh.

    Returns:
        One row per (system prompt, slice, case, setting): ``kl``, ``top1_agree``, the answers, their token
        counts, ``added_tokens``, ``memory_tokens``, TTFTs (ms) and the case's gold answer.
    """
    rows: list[dict[str, Any]] = []
    caches = {} if caches is None else caches
    for prompt_name, engine in engines.items():
        facts = caches.setdefault(prompt_name, FactCache(engine))
        for part in slices:
            for index, case in enumerate(part.cases):
                if reference is None:
                    baseline = prompt_reference(engine, case, max_new_tokens, generate)
                else:
                    baseline = _kv_reference(
                        engine, facts.get(case, reference), case, reference, max_new_tokens, generate
                    )
                for setting in settings:
                    row = _measure(engine, facts, case, setting, baseline, max_new_tokens, generate)
                    rows.append({"system_prompt": prompt_name, "slice": part.name, "case": index, **row})
                if progress is not None:
                    progress(f"{prompt_name} {part.name} case {index + 1}/{len(part.cases)}")
    return rows


def prompt_reference(engine: Any, case: FidelityCase, max_new_tokens: int, generate: bool) -> dict[str, Any]:
    """Prompt mode on ``case`` (its memories pasted as text, in layout order), the reference every setting is measured
    against: ``"logits"``, the first answer token's logits (``[vocab]`` float32), and with ``generate`` also
    ``"generation"``, its greedy answer of up to ``max_new_tokens`` tokens (a
    :class:`~inferscale.engines.base.Generation`)."""
    ids = [engine.fact_token_ids(t) for t in case.memories]
    reference: dict[str, Any] = {"logits": engine.first_token_logits(case.question, None, ids)}
    if generate:
        reference["generation"] = engine.generate_prompt(case.question, ids, max_new_tokens)
    return reference


def _kv_reference(
    engine: Any,
    served: list[FactKV],
    case: FidelityCase,
    setting: FidelitySetting,
    max_new_tokens: int,
    generate: bool,
) -> dict[str, Any]:
    reference: dict[str, Any] = {"logits": engine.first_token_logits(case.question, served, serving=setting.serving)}
    if generate:
        reference["generation"] = engine.generate_kv(case.question, served, max_new_tokens, serving=setting.serving)
    return reference


def _measure(
    engine: Any,
    facts: FactCache,
    case: FidelityCase,
    setting: FidelitySetting,
    reference: dict[str, Any],
    max_new_tokens: int,
    generate: bool,
) -> dict[str, Any]:
    if setting.serve_as == "prompt":
        return _measure_prompt(engine, case, setting, reference, max_new_tokens, generate)
    if setting.memory_order == "reversed":  # each memory keeps its context; buckets follow the new offsets
        contexts = case.contexts[::-1]
        case = case.model_copy(update={"memories": case.memories[::-1], "contexts": contexts})
    served = facts.get(case, setting)
    kv_logits = engine.first_token_logits(case.question, served, serving=setting.serving)
    row = first_token_row(setting.label, reference["logits"], kv_logits, sum(f.n_tokens for f in served), case)
    if generate:
        kv = engine.generate_kv(case.question, served, max_new_tokens, serving=setting.serving)
        row.update(kv_answer_fields(kv, reference["generation"], max_new_tokens))
    return row


def _measure_prompt(
    engine: Any,
    case: FidelityCase,
    setting: FidelitySetting,
    reference: dict[str, Any],
    max_new_tokens: int,
    generate: bool,
) -> dict[str, Any]:
    """A ``serve_as="prompt"`` control: the memories pasted as text in ``setting.memory_order``; its answer fills
    the ``kv_*`` fields, and every memory token counts as added."""
    ids = [engine.fact_token_ids(t) for t in case.memories]
    if setting.memory_order == "reversed":
        ids = ids[::-1]
    logits = engine.first_token_logits(case.question, None, ids)
    memory_tokens = sum(len(i) for i in ids)
    row = first_token_row(setting.label, reference["logits"], logits, memory_tokens, case)
    if generate:
        answer = engine.generate_prompt(case.question, ids, max_new_tokens)
        row.update(
            _answer_fields(answer, reference["generation"], max_new_tokens),
            added_tokens=memory_tokens,
            ttft_kv_ms=answer.prefill_ms,
        )
    return row


def first_token_row(label: str, reference: Any, logits: Any, memory_tokens: int, case: FidelityCase) -> dict[str, Any]:
    """A row's first-token fields (:func:`summarize_rows` reads them): ``logits`` (``[vocab]``, the setting's first
    token) against ``reference`` (prompt mode's), the ``memory_tokens`` served and the case's gold answer."""
    return {
        "setting": label,
        "kl": first_token_kl(reference, logits),
        "top1_agree": int(logits.argmax()) == int(reference.argmax()),
        "memory_tokens": memory_tokens,
        "gold": case.answer,
    }


def _answer_fields(answer: Any, reference: Any, max_new_tokens: int) -> dict[str, Any]:
    """The answer fields of a row: ``answer`` (the setting's) against ``reference`` (prompt mode's)."""
    return {
        "kv_answer": answer.text,
        "prompt_answer": reference.text,
        "kv_tokens": len(answer.token_ids),
        "prompt_tokens": len(reference.token_ids),
        "kv_budget_hit": len(answer.token_ids) >= max_new_tokens,
        "prompt_budget_hit": len(reference.token_ids) >= max_new_tokens,
        "kv_repeat": repeats(answer.token_ids),
        "prompt_repeat": repeats(reference.token_ids),
        "ttft_prompt_ms": reference.prefill_ms,
    }


def kv_answer_fields(answer: Any, reference: Any, max_new_tokens: int) -> dict[str, Any]:
    """A row's answer fields for a KV-served ``answer`` (a :class:`~inferscale.engines.base.Generation` of
    ``generate_kv``) against ``reference`` (prompt mode's): the answer figures, the memory tokens recomputed, and
    TTFT as K/V assembly plus prefill (ms)."""
    return {
        **_answer_fields(answer, reference, max_new_tokens),
        "added_tokens": answer.recomputed_tokens,
        "ttft_kv_ms": answer.kv_assembly_ms + answer.prefill_ms,
    }


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values)) if values else float("nan")


def summarize_rows(
    rows: Sequence[dict[str, Any]], by: Sequence[str] = ("setting", "slice", "system_prompt")
) -> list[SettingSummary]:
    """One :class:`SettingSummary` per group of ``rows`` (groups in first-seen order).

    ``by`` names the row fields that define a group; fields left out are pooled (e.g. ``("setting",)`` pools
    every slice and system prompt), and the pooled ones are reported as ``"all"``.
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in by), []).append(row)
    out = []
    for key, group in groups.items():
        labels = dict(zip(by, key, strict=True))
        kls = [r["kl"] for r in group]
        generated = [r for r in group if "kv_answer" in r]
        gold = [r for r in generated if r.get("gold")]
        memory = sum(r["memory_tokens"] for r in generated)
        out.append(
            SettingSummary(
                setting=str(labels.get("setting", "all")),
                slice=str(labels.get("slice", "all")),
                system_prompt=str(labels.get("system_prompt", "all")),
                n=len(group),
                kl_mean=_mean(kls),
                kl_median=float(statistics.median(kls)),
                top1_agreement=_mean([float(r["top1_agree"]) for r in group]),
                f1_kv_vs_prompt=_mean([token_f1(r["kv_answer"], r["prompt_answer"]) for r in generated]),
                f1_kv_gold=_mean([token_f1(r["kv_answer"], r["gold"]) for r in gold]) if gold else None,
                f1_prompt_gold=_mean([token_f1(r["prompt_answer"], r["gold"]) for r in gold]) if gold else None,
                kv_budget_hit=_mean([float(r["kv_budget_hit"]) for r in generated]),
                prompt_budget_hit=_mean([float(r["prompt_budget_hit"]) for r in generated]),
                kv_repeat=_mean([float(r["kv_repeat"]) for r in generated]),
                prompt_repeat=_mean([float(r["prompt_repeat"]) for r in generated]),
                added_tokens=_mean([r["added_tokens"] for r in generated]),
                added_fraction=sum(r["added_tokens"] for r in generated) / memory if memory else float("nan"),
                ttft_kv_ms=statistics.median([r["ttft_kv_ms"] for r in generated]) if generated else float("nan"),
                ttft_prompt_ms=statistics.median([r["ttft_prompt_ms"] for r in generated])
                if generated
                else float("nan"),
            )
        )
    return out


SCALE_GRID: tuple[float, ...] = (1.0, 0.7, 0.5, 0.4, 0.35, 0.3, 0.25, 0.2)
"""The attention scales ``--calibrate`` tries."""


@dataclass(frozen=True)
class Calibration:
    """The attention scale chosen for a model on calibration cases, and how it does on held-out ones.

    Attributes:
        scale: the chosen s (lowest mean first-token KL on the calibration half).
        calibration_kl: mean KL of each tried s on the calibration half, ``{s: nats}``.
        held_out_kl: mean KL on the held-out half with the chosen s (nats).
        held_out_kl_unscaled: mean KL on the held-out half with s = 1 (nats).
        n_calibration, n_held_out: cases in each half (times the system prompts).
    """

    scale: float
    calibration_kl: dict[float, float]
    held_out_kl: float
    held_out_kl_unscaled: float
    n_calibration: int
    n_held_out: int


def calibrate_scale(
    engines: dict[str, Any],
    slices: Sequence[FidelitySlice],
    base: FidelitySetting,
    grid: Sequence[float] = SCALE_GRID,
) -> Calibration:
    """Pick the memory attention scale s for a model: the s of ``grid`` with the lowest mean first-token KL on the
    even-numbered cases of every slice (pooled over the system prompts of ``engines``), then report that s and
    s = 1 on the odd-numbered (held-out) cases. Every other field comes from ``base``.

    Raises:
        ValueError: when the slices hold fewer than two cases in all, or ``grid`` is empty.
    """
    calibration = [FidelitySlice(s.name, s.cases[0::2]) for s in slices]
    held_out = [FidelitySlice(s.name, s.cases[1::2]) for s in slices]
    n_cal, n_held = sum(len(s.cases) for s in calibration), sum(len(s.cases) for s in held_out)
    if not grid or n_cal == 0 or n_held == 0:
        raise ValueError("calibration needs a non-empty scale grid and at least two cases")
    candidates = [base.model_copy(update={"attention_scale": s, "name": f"s={s:g}"}) for s in grid]
    rows = run_fidelity(engines, calibration, candidates, generate=False)
    kl = {s: _mean([r["kl"] for r in rows if r["setting"] == c.label]) for s, c in zip(grid, candidates, strict=True)}
    best = min(grid, key=lambda s: (kl[s], -s))
    chosen = base.model_copy(update={"attention_scale": best, "name": "chosen"})
    unscaled = base.model_copy(update={"attention_scale": 1.0, "name": "unscaled"})
    held = run_fidelity(engines, held_out, [chosen, unscaled], generate=False)
    return Calibration(
        scale=best,
        calibration_kl=kl,
        held_out_kl=_mean([r["kl"] for r in held if r["setting"] == "chosen"]),
        held_out_kl_unscaled=_mean([r["kl"] for r in held if r["setting"] == "unscaled"]),
        n_calibration=n_cal * len(engines),
        n_held_out=n_held * len(engines),
    )
