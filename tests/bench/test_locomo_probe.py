"""benchmarks/locomo_probe.py: the probes' shared figure and answer-line formats against hand-written lines."""

from __future__ import annotations

import numpy as np
from benchmark_scripts import load_benchmark

from inferscale.eval.fidelity import SettingSummary

lp = load_benchmark("locomo_probe")


def test_figures_print_three_decimals_or_a_dash() -> None:
    assert lp.figure(0.46251) == "0.463"
    assert lp.figure(None) == "-"


def _summary(f1_gold: float | None) -> SettingSummary:
    return SettingSummary(
        setting="w=5",
        slice="conv-26",
        system_prompt="default",
        n=40,
        kl_mean=0.055,
        kl_median=0.045,
        top1_agreement=0.8,
        f1_kv_vs_prompt=0.4681,
        f1_kv_gold=f1_gold,
        f1_prompt_gold=0.119,
        kv_budget_hit=0.55,
        prompt_budget_hit=0.525,
        kv_repeat=0.35,
        prompt_repeat=0.175,
        added_tokens=0.0,
        added_fraction=0.0,
        ttft_kv_ms=88.0,
        ttft_prompt_ms=487.0,
    )


def test_an_answer_line_gives_every_answer_figure_and_the_budget() -> None:
    assert lp.answer_line(_summary(0.1051), 32) == (
        "w=5                              F1 kv~prompt 0.468  F1 gold kv 0.105 / prompt 0.119  "
        "budget hit kv 0.55 / prompt 0.53  repeat kv 0.35 / prompt 0.17  (32-token budget)"
    )
    assert "F1 gold kv - / prompt 0.119" in lp.answer_line(_summary(None), 16)


def test_an_answer_holds_the_gold_one_as_whole_words_after_locomos_normalisation() -> None:
    assert lp.contains_answer("Maya's teacher was Raj, at school.", "raj")
    assert lp.contains_answer("She lives in Porto now", "Porto.")
    assert not lp.contains_answer("She lives in Lisbon", "Porto")
    assert not lp.contains_answer("She went to a party", "art")  # not inside a word
    assert not lp.contains_answer("In 2010", "10")
    assert not lp.contains_answer("The end", "The")  # nothing left to hold after normalising
    assert not lp.contains_answer("Raj", None)


class _OneHotEmbedder:
    """Each text's vector: 1 at the text's first character's code modulo 8."""

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [[1.0 if i == ord(t[0]) % 8 else 0.0 for i in range(8)] for t in texts]


def test_the_demo_conversation_is_its_messages_with_their_contexts_and_vectors() -> None:
    demo = lp.embedded_demo(_OneHotEmbedder())
    from inferscale.demo import bundled_script

    script = bundled_script()
    messages = [m["content"] for _, session in script.sessions for m in session]
    assert demo.memories == list(dict.fromkeys(messages))
    assert demo.temporal[0] == [] and demo.temporal[1] == [messages[0]]
    assert demo.questions == [(q.question, q.expected) for q in script.questions]
    assert demo.vectors.dtype == np.float32 and demo.vectors.shape == (len(demo.memories), 8)
    assert demo.texts([[1, 0], []]) == [[demo.memories[1], demo.memories[0]], []]
