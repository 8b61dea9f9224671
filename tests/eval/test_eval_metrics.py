"""LoCoMo metrics on hand-computed examples: normalisation, token F1 (per category), BLEU-1, agreement, KL."""

from __future__ import annotations

import math

import pytest
import torch

from inferscale.eval.metrics import (
    bleu1,
    exact_match,
    first_token_kl,
    locomo_f1,
    multi_answer_f1,
    normalize_answer,
    token_f1,
    word_tokens,
)


def test_normalize_answer_drops_case_punctuation_articles_and_commas() -> None:
    assert normalize_answer("The cat, and a Dog!") == "cat dog"
    assert normalize_answer("  7 May,  2023. ") == "7 may 2023"
    assert normalize_answer(2022) == "2022"


def test_token_f1_counts_common_tokens() -> None:
    # pred {paris, france}, gold {paris}: P = 1/2, R = 1, F1 = 2/3.
    assert token_f1("Paris, France", "Paris") == pytest.approx(2 / 3)
    assert token_f1("the Paris", "paris") == pytest.approx(1.0)
    assert token_f1("London", "Paris") == 0.0
    assert token_f1("", "Paris") == 0.0
    # Multiset overlap: "red red blue" vs "red blue blue" share red x1 and blue x1: P = R = 2/3.
    assert token_f1("red red blue", "red blue blue") == pytest.approx(2 / 3)


def test_multi_hop_f1_averages_best_match_per_gold_sub_answer() -> None:
    # gold: swimming -> 1, yoga -> 0, running -> 1; mean 2/3.
    assert multi_answer_f1("running, swimming", "swimming, yoga, running") == pytest.approx(2 / 3)
    assert locomo_f1("running, swimming", "swimming, yoga, running", category=1) == pytest.approx(2 / 3)


def test_open_domain_f1_scores_only_the_part_before_the_semicolon() -> None:
    gold = "Likely no; she wants to be a counselor"
    assert locomo_f1("likely no", gold, category=3) == pytest.approx(1.0)
    assert locomo_f1("likely no", gold, category=4) < 1.0


def test_word_tokens() -> None:
    # NLTK's word_tokenize (Treebank rules, as in Mem0's evaluation) splits the clitic: "it" + "'s".
    assert word_tokens("It's 7 May.") == ["it", "'s", "7", "may", "."]


def test_bleu1_is_clipped_unigram_precision_times_brevity_penalty() -> None:
    # 3 of 3 unigrams match; c = 3 < r = 6, so BP = exp(1 - 6/3) = e^-1.
    assert bleu1("the cat sat", "the cat sat on the mat") == pytest.approx(math.exp(-1))
    # "the" clipped to its one occurrence in the reference: 1/3; c = 3 > r = 2, so BP = 1.
    assert bleu1("the the the", "the cat") == pytest.approx(1 / 3)
    assert bleu1("Dog", "cat") == 0.0
    assert bleu1("", "cat") == 0.0
    assert bleu1("Twice a week", "twice a week") == pytest.approx(1.0)


def test_exact_match_after_normalisation() -> None:
    assert exact_match("The Beagle.", "beagle")
    assert not exact_match("a beagle", "a poodle")


def test_first_token_kl_on_hand_computed_distributions() -> None:
    assert first_token_kl(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.0])) == pytest.approx(0.0)
    # Shifting logits changes nothing.
    assert first_token_kl([1.0, 2.0, 3.0], [11.0, 12.0, 13.0]) == pytest.approx(0.0, abs=1e-12)
    # p = (1/2, 1/2), q = (3/4, 1/4): KL = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
    assert first_token_kl([0.0, 0.0], [math.log(3.0), 0.0]) == pytest.approx(0.5 * math.log(4 / 3))
    # A token with zero probability under p contributes nothing: p = (1, 0), q = (1/2, 1/2) gives ln 2.
    assert first_token_kl([0.0, float("-inf")], [0.0, 0.0]) == pytest.approx(math.log(2.0))
    with pytest.raises(ValueError, match="shape"):
        first_token_kl([0.0, 1.0], [0.0, 1.0, 2.0])
