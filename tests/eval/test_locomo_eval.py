"""`inferscale eval locomo` on a tiny synthetic LoCoMo-shaped file with the embedded SmolLM2: ingestion keeps
dia_ids, both modes answer from the same memories, and a restart resumes instead of answering again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferscale.config import EngineConfig, MemoryConfig
from inferscale.engines.transformers import TransformersEngine
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.eval import locomo_eval, locomo_files
from inferscale.eval.locomo_eval import LocomoEvalSettings, load_results, run_locomo_eval

CONVERSATION = {
    "sample_id": "conv-t1",
    "conversation": {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a beagle named Biscuit last week."},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely! I started learning the cello."},
        ],
        "session_2_date_time": "10:00 am on 20 June, 2023",
        "session_2": [
            {"speaker": "Ana", "dia_id": "D2:1", "text": "Biscuit and I ran a 5k race in Porto yesterday."},
            {
                "speaker": "Ben",
                "dia_id": "D2:2",
                "text": "Here is my cello teacher.",
                "blip_caption": "a photo of a woman holding a cello",
            },
        ],
    },
    "qa": [
        {"question": "What is the name of Ana's dog?", "answer": "Biscuit", "evidence": ["D1:1"], "category": 4},
        {"question": "What is Ben doing?", "adversarial_answer": "dancing", "evidence": [], "category": 5},
        {"question": "When did Ana run a 5k?", "answer": "19 June 2023", "evidence": ["D2:1"], "category": 2},
        {"question": "Which instrument does Ben learn?", "answer": "cello", "evidence": ["D1:2"], "category": 1},
    ],
}


@pytest.fixture(scope="module")
def engine(smollm2_fp32: tuple[Any, Any]) -> TransformersEngine:
    model, tokenizer = smollm2_fp32
    return TransformersEngine(
        EngineConfig(dtype="float32", device="cpu", max_new_tokens=4),
        MemoryConfig().system_prompt,
        model=model,
        tokenizer=tokenizer,
    )


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "locomo_tiny.json"
    path.write_text(json.dumps([CONVERSATION]), encoding="utf-8")
    return path


def _settings(data: Path, out: Path, **kw: Any) -> LocomoEvalSettings:
    return LocomoEvalSettings(data=data, out_dir=out, k=2, max_new_tokens=4, dtype="float32", device="cpu", **kw)


@pytest.mark.slow
def test_run_is_resumable_and_scores_both_modes(
    tmp_path: Path, data_file: Path, engine: TransformersEngine, embedder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    answered: list[str] = []
    real = locomo_eval.answer_question

    def spy(client: Any, conv: Any, index: int, settings: Any, judge: Any) -> dict[str, Any]:
        answered.append(f"{conv.sample_id}#{index}")
        return real(client, conv, index, settings, judge)

    monkeypatch.setattr(locomo_eval, "answer_question", spy)

    first = run_locomo_eval(_settings(data_file, out, limit=1), engine=engine, embedder=embedder, progress=False)
    assert first.answered == 1 and first.skipped == 0
    assert answered == ["conv-t1#0"]

    # A larger limit continues: question 0 is not answered again, the category-5 item is never answered.
    second = run_locomo_eval(_settings(data_file, out, limit=2), engine=engine, embedder=embedder, progress=False)
    assert second.answered == 1 and second.skipped == 1
    assert answered == ["conv-t1#0", "conv-t1#2"]

    third = run_locomo_eval(_settings(data_file, out, limit=2), engine=engine, embedder=embedder, progress=False)
    assert third.answered == 0 and third.skipped == 2
    assert answered == ["conv-t1#0", "conv-t1#2"]

    lines = (out / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    rows = load_results(out / "results.jsonl")
    assert set(rows) == {"conv-t1#0", "conv-t1#2"}
    row = rows["conv-t1#0"]
    assert row["category"] == 4 and row["gold"] == "Biscuit"
    assert row["memory_ids_same"] is True
    assert row["recall"] in (0.0, 1.0)
    assert set(row["retrieved_dia_ids"]) <= {"D1:1", "D1:2", "D2:1", "D2:2"}
    assert len(row["retrieved_dia_ids"]) == 2
    for mode in ("kv", "prompt"):
        assert 0.0 <= row[mode]["f1"] <= 1.0 and 0.0 <= row[mode]["bleu1"] <= 1.0
        assert row[mode]["judge"] is None  # no judge configured
        assert row[mode]["ttft_ms"] > 0
    assert row["kl"] is not None and row["kl"] >= 0.0
    assert isinstance(row["exact_match"], bool)

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["overall"]["n"] == 2
    assert set(summary["categories"]) == {"2", "4"}
    assert summary["overall"]["j_kv"] is None
    assert (out / "summary.md").read_text(encoding="utf-8").startswith("# LoCoMo")
    assert (out / "summary.png").stat().st_size > 0
    assert json.loads((out / "ingested.json").read_text(encoding="utf-8")) == {"conv-t1": 4}


@pytest.mark.slow
def test_ingestion_records_dia_ids_and_dates(
    tmp_path: Path, data_file: Path, engine: TransformersEngine, embedder: Any
) -> None:
    settings = _settings(data_file, tmp_path / "out")
    client = locomo_eval.build_client(settings, engine=engine, embedder=embedder)
    conv = locomo_eval.load_locomo(data_file)[0]
    assert locomo_eval.ingest_conversation(client, conv, settings) == 4
    stored = {m["metadata"]["dia_id"]: m for m in client.get_all(user_id="conv-t1")["results"]}
    assert set(stored) == {"D1:1", "D1:2", "D2:1", "D2:2"}
    assert stored["D1:1"]["memory"] == "[8 May 2023] Ana: I adopted a beagle named Biscuit last week."
    assert stored["D2:2"]["memory"].endswith("[shares a photo of a woman holding a cello]")
    assert stored["D2:1"]["metadata"]["speaker"] == "Ana"
    assert stored["D2:1"]["metadata"]["session"] == 2
    client.close()


@pytest.mark.slow
def test_other_settings_in_the_same_out_are_refused(
    tmp_path: Path, data_file: Path, engine: TransformersEngine, embedder: Any
) -> None:
    out = tmp_path / "out"
    (out).mkdir()
    (out / "run.json").write_text(json.dumps(_settings(data_file, out).run_dict()), encoding="utf-8")
    with pytest.raises(ConfigError, match="other settings"):
        run_locomo_eval(
            LocomoEvalSettings(data=data_file, out_dir=out, k=3, max_new_tokens=4, dtype="float32"),
            engine=engine,
            embedder=embedder,
            progress=False,
        )


@pytest.mark.parametrize("data", ["missing.json", "empty.json", "conv-999"])
def test_a_run_refused_for_its_input_leaves_no_out_folder_behind(tmp_path: Path, data_file: Path, data: str) -> None:
    """The out folder was made before the data file and the conversation ids were checked (a new user's find)."""
    (tmp_path / "empty.json").write_text("[]", encoding="utf-8")
    out = tmp_path / "out" / "run"
    if data == "conv-999":
        settings = LocomoEvalSettings(data=data_file, out_dir=out, conversations=("conv-999",))
    else:
        settings = LocomoEvalSettings(data=tmp_path / data, out_dir=out)
    with pytest.raises(InvalidInputError):
        run_locomo_eval(settings, progress=False)
    assert not (tmp_path / "out").exists()


def test_run_file_matches_a_resumed_run_with_tuple_settings(tmp_path: Path, data_file: Path) -> None:
    """run.json stores tuples as lists; a rerun with the same position buckets must match it, another must not."""
    settings = _settings(data_file, tmp_path, position_buckets=(0, 128))
    locomo_files.check_run_file(tmp_path, settings)
    locomo_files.check_run_file(tmp_path, settings)  # the same settings, read back from JSON
    with pytest.raises(ConfigError, match="position_buckets"):
        locomo_files.check_run_file(tmp_path, _settings(data_file, tmp_path, position_buckets=(0, 256)))


def test_the_first_memory_context_free_setting_reaches_the_runs_kv_config_and_its_run_file(
    tmp_path: Path, data_file: Path
) -> None:
    on = _settings(data_file, tmp_path, first_memory_context_free=True)
    assert on.kv_config().first_memory_context_free
    locomo_files.check_run_file(tmp_path, on)
    with pytest.raises(ConfigError, match="first_memory_context_free"):
        locomo_files.check_run_file(tmp_path, _settings(data_file, tmp_path, first_memory_context_free=False))


def test_a_run_file_written_before_the_first_memory_setting_resumes_with_it_off_only(
    tmp_path: Path, data_file: Path
) -> None:
    """Runs recorded before ``first_memory_context_free`` existed served every memory in context: their run.json
    lacks the key, and reads as the setting off."""
    old = _settings(data_file, tmp_path, first_memory_context_free=False).run_dict()
    del old["first_memory_context_free"]
    (tmp_path / "run.json").write_text(json.dumps(old), encoding="utf-8")
    locomo_files.check_run_file(tmp_path, _settings(data_file, tmp_path, first_memory_context_free=False))
    with pytest.raises(ConfigError, match="first_memory_context_free: False -> True"):
        locomo_files.check_run_file(tmp_path, _settings(data_file, tmp_path, first_memory_context_free=True))
