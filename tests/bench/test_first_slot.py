"""benchmarks/first_slot.py: which encoding serves each layout slot, the plumbing check on a tiny real engine (a
first memory served from its context-free encoding is prompt mode's first line; any other encoding is caught), and
the rows it measures against the fidelity runner's."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark
from tiny_models import tiny_engine

from inferscale.eval.fidelity import FactCache, FidelitySetting, run_fidelity
from inferscale.eval.fidelity_cases import FidelityCase, FidelitySlice

fs = load_benchmark("first_slot")

CASE = FidelityCase(
    memories=["Maya lives in Porto.", "Raj taught Maya chess.", "Biscuit is a beagle."],
    question="Who taught Maya chess?",
    contexts=[["Maya moved last week.", "She likes the sea."], ["Raj is a colleague."], []],
)


def test_each_scheme_names_the_context_window_of_each_slot() -> None:
    slots = range(8)
    assert [fs.SCHEMES["w=5"](i) for i in slots] == [5] * 8
    assert [fs.SCHEMES["first slot w=0"](i) for i in slots] == [0, 5, 5, 5, 5, 5, 5, 5]
    assert [fs.SCHEMES["slot-matched"](i) for i in slots] == [0, 1, 2, 3, 4, 5, 5, 5]


def test_slot_i_is_served_from_its_schemes_encoding() -> None:
    encodings = {w: [f"w{w}:{m}" for m in CASE.memories] for w in range(6)}
    assert fs.served(CASE, encodings, fs.SCHEMES["slot-matched"]) == [f"w{i}:{m}" for i, m in enumerate(CASE.memories)]
    assert fs.served(CASE, encodings, fs.SCHEMES["first slot w=0"])[:2] == [
        "w0:" + CASE.memories[0],
        "w5:" + CASE.memories[1],
    ]


def test_the_plumbing_check_holds_on_a_real_engine_and_catches_a_first_memory_with_context() -> None:
    engine = tiny_engine("llama")
    cache = FactCache(engine)
    encodings = {
        w: cache.get(CASE, FidelitySetting(context_window=w, first_memory_context_free=False)) for w in range(6)
    }
    fs.check_plumbing(engine, CASE, encodings, cache)  # the w=0 first line is prompt mode's within 1e-4
    wrong = {**encodings, 0: encodings[5]}  # the first memory encoded after its two context turns
    with pytest.raises(SystemExit, match="differ from prompt mode's"):
        fs.check_plumbing(engine, CASE, wrong, cache)


def test_the_w5_rows_are_the_fidelity_runners_default_and_the_first_slot_moves_kl() -> None:
    engine = tiny_engine("llama")
    rows = fs.measure(engine, [CASE], 0, lambda _line: None)
    assert [r["setting"] for r in rows] == list(fs.SCHEMES)
    (reference,) = run_fidelity(
        {"short": engine},
        [FidelitySlice("toy", [CASE])],
        [FidelitySetting(first_memory_context_free=False)],
        generate=False,
    )
    by_scheme = {r["setting"]: r for r in rows}
    assert by_scheme["w=5"]["kl"] == pytest.approx(reference["kl"], abs=1e-6)
    assert by_scheme["first slot w=0"]["kl"] != pytest.approx(reference["kl"], abs=1e-6)


def test_measure_serves_only_the_schemes_named_and_gives_the_same_rows_as_serving_all() -> None:
    engine = tiny_engine("llama")
    every = {r["setting"]: r for r in fs.measure(engine, [CASE], 0, lambda _line: None)}
    (only,) = fs.measure(engine, [CASE], 0, lambda _line: None, ["first slot w=0"])
    assert only["setting"] == "first slot w=0"
    assert only["kl"] == pytest.approx(every["first slot w=0"]["kl"], abs=1e-6)


def test_the_products_setting_serves_what_the_first_slot_scheme_serves() -> None:
    engine = tiny_engine("llama")
    (scheme,) = fs.measure(engine, [CASE], 0, lambda _line: None, ["first slot w=0"])
    setting = FidelitySetting(first_memory_context_free=True)
    (row,) = run_fidelity({"short": engine}, [FidelitySlice("toy", [CASE])], [setting], generate=False)
    assert row["kl"] == pytest.approx(scheme["kl"], abs=1e-6)
    off = FidelitySetting(first_memory_context_free=False)
    (in_context,) = run_fidelity({"short": engine}, [FidelitySlice("toy", [CASE])], [off], generate=False)
    assert in_context["kl"] != pytest.approx(row["kl"], abs=1e-6)  # the setting moves what is served
