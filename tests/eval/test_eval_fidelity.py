"""``inferscale eval fidelity``: cases, settings, aggregation, the report and the command end to end."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from inferscale.cli import main
from inferscale.config import KVConfig
from inferscale.errors import InvalidInputError
from inferscale.eval.fidelity import FidelitySetting, repeats, summarize_rows
from inferscale.eval.fidelity_cases import FidelitySlice, load_cases, retrieve_cases

CASES = Path(__file__).parents[1] / "data" / "fidelity_cases.json"


def test_cases_file_loads_and_bad_files_are_typed_errors(tmp_path: Path) -> None:
    part = load_cases(CASES)
    assert part.name == "fidelity_cases" and len(part.cases) == 10
    assert part.cases[0].question == "Where did Maya move to?" and len(part.cases[0].memories) == 8
    bad = tmp_path / "bad.json"
    for text, match in [
        ("not json", "not JSON"),
        ("[]", "no cases"),
        ('[{"memories": [], "question": "q"}]', "memories"),
        ('[{"memories": ["a"], "question": "q", "extra": 1}]', "extra"),
    ]:
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(InvalidInputError, match=match):
            load_cases(bad)
    with pytest.raises(InvalidInputError, match="no cases file"):
        load_cases(tmp_path / "missing.json")


def test_validation_errors_read_as_one_line_per_field_with_the_rest_counted(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"question": "q"}] * 7), encoding="utf-8")  # 7 cases without memories
    with pytest.raises(InvalidInputError) as seven:
        load_cases(bad)
    listed = "; ".join(f"item {i}.memories: Field required" for i in range(5))
    assert str(seven.value).endswith(f": {listed} (and 2 more)")
    bad.write_text('{"memories": ["a"], "question": "q"}', encoding="utf-8")  # an object, not a list of them
    with pytest.raises(InvalidInputError) as top:
        load_cases(bad)
    assert str(top.value).endswith("}: Input should be a valid list")  # a top-level error names no item


def test_a_setting_with_two_bad_fields_names_both(capsys: pytest.CaptureFixture[str]) -> None:
    setting = '{"attention_scale": 0, "serve_as": "text"}'
    assert main(["eval", "fidelity", "--cases", str(CASES), "--setting", setting]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the console may wrap the line
    assert "attention_scale: Input should be greater than 0; serve_as: Input should be 'kv' or 'prompt'" in err


def test_a_memory_layout_for_a_cases_file_alone_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "fidelity", "--cases", str(CASES), "--memory-layout", "added"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--memory-layout orders retrieved slices (--demo, --locomo); a --cases file keeps its order" in err


def test_session_contexts_for_a_cases_file_alone_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "fidelity", "--cases", str(CASES), "--session-contexts"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    expected = "--session-contexts builds retrieved slices' contexts (--demo, --locomo); a --cases file gives its own"
    assert expected in err


class _Embedder:
    """Unit vectors by keyword: memory i and question i share dimension i."""

    dim = 3

    def embed(self, texts: list[str]) -> Any:
        import numpy as np

        out = np.zeros((len(texts), 3), dtype=np.float32)
        for row, text in enumerate(texts):
            for col, word in enumerate(("dog", "city", "job")):
                out[row, col] = 1.0 if word in text else 0.1
            out[row] /= np.linalg.norm(out[row])
        return out


def test_retrieved_cases_are_ranked_by_similarity() -> None:
    memories = ["my job is nice", "the dog barks", "the city is big"]
    part = retrieve_cases("toy", memories, [("which dog?", "beagle"), ("what job?", None)], 2, _Embedder())
    assert part.cases[0].memories[0] == "the dog barks" and part.cases[0].answer == "beagle"
    assert part.cases[1].memories[0] == "my job is nice" and len(part.cases[1].memories) == 2
    with pytest.raises(InvalidInputError, match="k must be"):
        retrieve_cases("toy", memories, [("q", None)], 0, _Embedder())


def test_stored_layout_keeps_the_top_k_in_stored_order_with_their_contexts() -> None:
    memories = ["the city is big", "my job is nice", "the dog barks", "the dog sleeps"]
    contexts = [[], ["c0"], ["c0", "c1"], ["c1", "c2"]]
    question = [("which dog?", None)]
    by_score = retrieve_cases("toy", memories, question, 3, _Embedder(), contexts)
    by_date = retrieve_cases("toy", memories, question, 3, _Embedder(), contexts, layout="added")
    # the dog lines score highest; the city and job lines tie, and the first stored of them is retrieved
    assert by_score.cases[0].memories == ["the dog barks", "the dog sleeps", "the city is big"]
    assert by_date.cases[0].memories == ["the city is big", "the dog barks", "the dog sleeps"]
    assert by_date.cases[0].contexts == [[], ["c0", "c1"], ["c1", "c2"]]


def test_setting_validates_and_labels_itself() -> None:
    setting = FidelitySetting(attention_scale=0.35, recompute=" head:4", position_buckets=(128, 0, 128))
    assert setting.position_buckets == (0, 128) and setting.recompute == "head:4"
    # w and the context-free first memory: KVConfig's defaults
    assert setting.label == "s=0.35 T=1 recompute=head:4 buckets=0/128 w=5 first context-free"
    off = FidelitySetting(first_memory_context_free=False)
    assert off.label == "s=1 T=1 recompute=none buckets=0 w=5"
    assert FidelitySetting(name="mine").label == "mine"
    for bad in ({"attention_scale": 0}, {"recompute": "heads:4"}, {"position_buckets": ()}, {"typo": 1}):
        with pytest.raises(ValidationError):
            FidelitySetting(**bad)


def test_prompt_control_setting_refuses_kv_fields_and_names_its_order() -> None:
    assert FidelitySetting(serve_as="prompt", memory_order="reversed").label == "prompt reversed"
    reversed_kv = FidelitySetting(memory_order="reversed")
    assert reversed_kv.label == "s=1 T=1 recompute=none buckets=0 w=5 first context-free reversed"
    assert (
        FidelitySetting.model_validate({"serve_as": "prompt", "context_window": 5, "position_buckets": [0]}).label
        == "prompt"
    )
    for kv_only in ({"context_window": 0}, {"recompute": "head:2"}, {"storage_format": "int8"}, {"encode_alone": 1}):
        with pytest.raises(ValidationError, match="K/V only"):
            FidelitySetting(serve_as="prompt", **kv_only)
    with pytest.raises(ValidationError):
        FidelitySetting.model_validate({"memory_order": "shuffled"})


def test_a_setting_leaves_out_only_what_it_changes_from_the_product_default() -> None:
    """A field left out serves as KVConfig() does: ``{"recompute": "tail:16"}`` is the default (w=5) plus the tail,
    not pure injection plus the tail."""
    from inferscale.eval.fidelity_cli import _settings, default_setting

    assert FidelitySetting().model_dump() == {**default_setting(), "name": ""}
    tail = _settings(('{"recompute": "tail:16"}',))[0]
    assert tail.context_window == KVConfig().context_window == 5 and tail.recompute == "tail:16"
    assert FidelitySetting(context_window=0).serving.is_pure_injection


def test_cli_names_every_setting_field() -> None:
    from inferscale.eval.fidelity_cli import SETTING_FIELDS, STANDARD_SETTINGS

    assert tuple(FidelitySetting.model_fields) == SETTING_FIELDS
    assert [FidelitySetting(**s).serve_as for s in STANDARD_SETTINGS].count("prompt") == 1


def test_repeats_finds_a_repeated_four_token_run() -> None:
    assert repeats([1, 2, 3, 4, 5, 1, 2, 3, 4])
    assert not repeats([1, 2, 3, 4, 5, 1, 2, 3, 6])
    assert not repeats([7, 7, 7])  # shorter than one run


def _row(setting: str, kl: float, agree: bool, kv: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "setting": setting,
        "slice": "s1",
        "system_prompt": "short",
        "kl": kl,
        "top1_agree": agree,
        "memory_tokens": 100,
        "gold": "porto",
        "kv_answer": kv,
        "prompt_answer": prompt,
        "kv_budget_hit": extra.get("kv_budget", False),
        "prompt_budget_hit": False,
        "kv_repeat": extra.get("kv_repeat", False),
        "prompt_repeat": False,
        "added_tokens": extra.get("added", 0),
        "ttft_kv_ms": extra.get("ttft", 10.0),
        "ttft_prompt_ms": 50.0,
    }


def test_summaries_aggregate_each_figure() -> None:
    rows = [
        _row("a", 0.1, True, "porto", "porto", added=10, ttft=10.0),
        _row("a", 0.3, False, "lisbon city", "porto city", kv_budget=True, kv_repeat=True, added=20, ttft=30.0),
        _row("b", 0.0, True, "porto", "porto"),
    ]
    a, b = summarize_rows(rows)
    assert (a.setting, a.n, b.n) == ("a", 2, 1)
    assert a.kl_mean == pytest.approx(0.2) and a.kl_median == pytest.approx(0.2)
    assert a.top1_agreement == 0.5
    assert a.f1_kv_vs_prompt == pytest.approx((1.0 + 0.5) / 2)
    assert a.f1_kv_gold == pytest.approx((1.0 + 0.0) / 2) and a.f1_prompt_gold == pytest.approx((1.0 + 2 / 3) / 2)
    assert (a.kv_budget_hit, a.kv_repeat, a.prompt_budget_hit) == (0.5, 0.5, 0.0)
    assert a.added_tokens == 15 and a.added_fraction == pytest.approx(30 / 200)
    assert a.ttft_kv_ms == 20.0 and a.ttft_prompt_ms == 50.0
    (pooled,) = summarize_rows(rows[:2], by=("setting",))
    assert (pooled.slice, pooled.system_prompt) == ("all", "all")
    (first_token,) = summarize_rows([{k: v for k, v in rows[2].items() if k in _FIRST_TOKEN_KEYS}])
    assert first_token.kl_mean == 0.0 and math.isnan(first_token.f1_kv_vs_prompt)


_FIRST_TOKEN_KEYS = {"setting", "slice", "system_prompt", "kl", "top1_agree", "memory_tokens", "gold"}


@pytest.mark.slow
def test_eval_fidelity_command_writes_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fid"
    cases = tmp_path / "two.json"
    cases.write_text(json.dumps(json.loads(CASES.read_text("utf-8"))[:2]), encoding="utf-8")
    code = main(
        [
            "eval",
            "fidelity",
            "--cases",
            str(cases),
            "--system-prompts",
            "short,default",
            "--setting",
            '{"name": "pure", "context_window": 0}',
            "--setting",
            '{"name": "head:2+s", "recompute": "head:2", "attention_scale": 0.5}',
            "--max-new-tokens",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads((out / "fidelity.json").read_text("utf-8"))
    assert (out / "fidelity.png").stat().st_size > 0
    assert len(document["rows"]) == 2 * 2 * 2  # prompts x cases x settings
    pure = [r for r in document["rows"] if r["setting"] == "pure"]
    healed = [r for r in document["rows"] if r["setting"] == "head:2+s"]
    assert all(r["added_tokens"] == 0 for r in pure)
    assert all(r["added_tokens"] == 2 * 8 for r in healed)  # two tokens of each of the eight memories
    assert all(r["kv_tokens"] <= 4 and r["kl"] >= 0 for r in document["rows"])
    assert {s["setting"] for s in document["pooled"]} == {"pure", "head:2+s"}
    assert "pure" in capsys.readouterr().out


def test_eval_fidelity_refuses_a_bad_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "fidelity", "--cases", str(CASES), "--setting", '{"recompute": "all"}']) == 2
    assert "recompute" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cases", "."], "cannot read the cases file"),  # a folder: was an IsADirectoryError traceback
        (["--setting", "{recompute: 1}"], "is not JSON"),
        (["--setting", "[" * 100_000 + "]" * 100_000], "is not JSON (it nests deeper"),  # was a RecursionError
        (["--setting", "[1, 2]"], "must be a JSON object"),
        (["--setting", "null"], "must be a JSON object"),
        (["--setting", '{"name": "a"}', "--setting", '{"name": "a", "recompute": "tail:4"}'], "share the label 'a'"),
        (["--setting", "{}", "--setting", "{}"], "share the label"),  # would be pooled into one row
        (["--setting", '{"recompute": "tail:0"}'], "needs n >= 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--questions", "0"], "--questions"),  # wrote an empty report, and -1 ran all questions but the last
        (["--questions", "-1"], "--questions"),
        (["-k", "0"], "-k"),
    ],
)
def test_eval_fidelity_refuses_bad_input_with_a_clear_message(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    argv = ["eval", "fidelity", *([] if "--cases" in args else ["--cases", str(CASES)]), *args]
    usage_error = args[0] in ("--max-new-tokens", "--questions", "-k")  # refused by argparse: SystemExit(2)
    with pytest.raises(SystemExit) if usage_error else contextlib.nullcontext():
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "errors.pydantic.dev" not in err


def test_eval_fidelity_refuses_a_cases_file_nested_too_deep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Nested past the JSON parser's recursion limit, the file raised a bare RecursionError (a traceback)."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert main(["eval", "fidelity", "--cases", str(deep)]) == 2
    err = capsys.readouterr().err
    assert "is not JSON: it nests deeper" in err and "Traceback" not in err


@pytest.mark.slow
def test_calibration_picks_the_scale_that_lowers_held_out_kl(smollm2_fp32: tuple[Any, Any]) -> None:
    from inferscale.config import EngineConfig, MemoryConfig
    from inferscale.engines.transformers import TransformersEngine
    from inferscale.eval.fidelity import calibrate_scale

    model, tokenizer = smollm2_fp32
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt, model=model, tokenizer=tokenizer
    )
    part = load_cases(CASES)
    pure = FidelitySetting(context_window=0)  # calibrated on pure injection, where s=0.35 is known to help
    result = calibrate_scale({"default": engine}, [part], pure, grid=(1.0, 0.35))
    assert (result.n_calibration, result.n_held_out) == (5, 5)
    assert set(result.calibration_kl) == {1.0, 0.35}
    assert result.scale == min(result.calibration_kl, key=result.calibration_kl.__getitem__)
    assert result.scale == 0.35 and result.held_out_kl < result.held_out_kl_unscaled
    with pytest.raises(ValueError, match="two cases"):
        calibrate_scale({"default": engine}, [FidelitySlice("one", part.cases[:1])], pure)


@pytest.mark.slow
def test_order_controls_match_the_reordered_case(smollm2_fp32: tuple[Any, Any]) -> None:
    """Prompt mode in the case's order is the reference itself (KL 0); reversed, it is prompt mode on the case
    with its memories reversed, and a reversed K/V setting is that setting on the reversed case."""
    from inferscale.config import EngineConfig, MemoryConfig
    from inferscale.engines.transformers import TransformersEngine
    from inferscale.eval.fidelity import FactCache, run_fidelity
    from inferscale.eval.metrics import first_token_kl

    model, tokenizer = smollm2_fp32
    engine = TransformersEngine(
        EngineConfig(dtype="float32", device="cpu"), MemoryConfig().system_prompt, model=model, tokenizer=tokenizer
    )
    case = load_cases(CASES).cases[0]
    assert len(case.memories) >= 2
    assert case.contexts  # a reversed K/V setting (w=5 by default) keeps each memory's own context turns
    flipped = case.model_copy(update={"memories": case.memories[::-1], "contexts": case.contexts[::-1]})
    settings = [
        FidelitySetting(name="same", serve_as="prompt"),
        FidelitySetting(name="prompt reversed", serve_as="prompt", memory_order="reversed"),
        FidelitySetting(name="kv reversed", memory_order="reversed"),
    ]
    rows = run_fidelity({"default": engine}, [FidelitySlice("one", [case])], settings, max_new_tokens=3)
    by_name = {r["setting"]: r for r in rows}
    assert by_name["same"]["kl"] == 0 and by_name["same"]["top1_agree"]
    assert by_name["same"]["kv_answer"] == by_name["same"]["prompt_answer"]
    assert by_name["same"]["added_tokens"] == by_name["same"]["memory_tokens"]

    ids = [engine.fact_token_ids(t) for t in case.memories]
    reference = engine.first_token_logits(case.question, None, ids)
    reversed_prompt = engine.first_token_logits(case.question, None, ids[::-1])
    assert by_name["prompt reversed"]["kl"] == pytest.approx(first_token_kl(reference, reversed_prompt), abs=1e-6)
    assert by_name["prompt reversed"]["kl"] > 1e-4

    plain = FidelitySetting(name="kv")
    served_flipped = FactCache(engine).get(flipped, plain)
    kv_flipped = engine.first_token_logits(case.question, served_flipped, serving=plain.serving)
    assert by_name["kv reversed"]["kl"] == pytest.approx(first_token_kl(reference, kv_flipped), abs=1e-6)
    flipped_rows = run_fidelity({"default": engine}, [FidelitySlice("flipped", [flipped])], [plain], max_new_tokens=3)
    assert flipped_rows[0]["kv_answer"] == by_name["kv reversed"]["kv_answer"]

    # with position buckets, each reversed fact is encoded at the bucket of its new offset, as on the flipped case
    buckets = {"position_buckets": (0, 16)}
    reversed_rows = run_fidelity(
        {"default": engine},
        [FidelitySlice("one", [case])],
        [FidelitySetting(name="b", memory_order="reversed", **buckets)],
        generate=False,
    )
    served = FactCache(engine).get(flipped, FidelitySetting(**buckets))
    kv_bucketed = engine.first_token_logits(case.question, served)
    assert reversed_rows[0]["kl"] == pytest.approx(first_token_kl(reference, kv_bucketed), abs=1e-6)
