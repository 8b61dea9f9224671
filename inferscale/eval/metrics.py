"""Answer-quality and fidelity metrics of the LoCoMo evaluation.

Quality (each answer against the gold answer):

- :func:`token_f1` / :func:`locomo_f1`: token F1 as in LoCoMo's ``task_eval/evaluation.py``. Both strings are
  normalised (:func:`normalize_answer`: lower case, punctuation, commas and the words ``a an the and`` removed),
  split on whitespace and stemmed, then F1 is taken over the multiset of common tokens. LoCoMo stems with NLTK's
  Porter stemmer; it is used here when ``nltk`` is installed, otherwise tokens are compared unstemmed
  (:data:`STEMMER` says which). Per category (:func:`locomo_f1`): code 1 (multi-hop) is the partial F1 over
  comma-separated sub-answers, code 3 scores only the gold answer's part before the first ``;``, codes 2 and 4
  are plain token F1.
- :func:`bleu1`: sentence BLEU-1 as Mem0's evaluation computes it: NLTK's ``sentence_bleu`` with weights
  ``(1, 0, 0, 0)`` and smoothing ``method1``, one reference, on :func:`word_tokens` (clipped unigram precision
  times the brevity penalty, 0 when no unigram matches). Tokens are NLTK's ``word_tokenize`` of the lower-cased
  text with ``preserve_line=True``: the Treebank-style word tokenizer without the sentence splitter, which needs
  no downloaded data (it differs from Mem0's call only in keeping a sentence-final period inside a multi-sentence
  answer attached to its word). These need ``nltk`` (the ``eval`` extra).

Fidelity (KV injection against prompt injection on the same memories):

- :func:`exact_match` of the two answers after :func:`normalize_answer`;
- :func:`first_token_kl`: KL(prompt ‖ kv) of the first generated token's distribution, in nats.
"""

from __future__ import annotations

import importlib.util
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from inferscale.errors import ConfigError

__all__ = [
    "STEMMER",
    "bleu1",
    "exact_match",
    "first_token_kl",
    "locomo_f1",
    "multi_answer_f1",
    "normalize_answer",
    "token_f1",
    "word_tokens",
]

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _load_stemmer() -> tuple[str, Callable[[str], str]]:
    try:
        from nltk.stem import PorterStemmer
    except ImportError:
        return "none", lambda word: word
    stemmer = PorterStemmer()
    return "porter (nltk)", stemmer.stem


STEMMER, _stem = _load_stemmer()
"""Which stemmer F1 uses: ``"porter (nltk)"`` (as LoCoMo) when ``nltk`` is installed, else ``"none"``."""


def normalize_answer(text: Any) -> str:
    """LoCoMo's answer normalisation.

    Drops commas, lower-cases, removes ASCII punctuation, removes the words ``a``, ``an``, ``the`` and ``and``,
    and collapses whitespace. Non-strings (LoCoMo has a few integer answers) are converted with ``str()``.
    """
    s = str(text).replace(",", "").lower()
    s = s.translate(_PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _f1_tokens(text: str) -> list[str]:
    return [_stem(word) for word in normalize_answer(text).split()]


def token_f1(prediction: Any, gold: Any) -> float:
    """Token F1 (0..1) of ``prediction`` against ``gold``, over normalised, stemmed tokens (multiset overlap).

    Returns 0.0 when either side has no tokens after normalisation.
    """
    pred = _f1_tokens(str(prediction))
    ref = _f1_tokens(str(gold))
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred)
    recall = common / len(ref)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: Any, gold: Any) -> float:
    """LoCoMo's partial F1 for list answers: split both on ``,``; for each gold sub-answer take the best
    :func:`token_f1` over the predicted sub-answers; average over gold sub-answers (0..1)."""
    predictions = [p.strip() for p in str(prediction).split(",")]
    golds = [g.strip() for g in str(gold).split(",")]
    return sum(max(token_f1(p, g) for p in predictions) for g in golds) / len(golds)


def locomo_f1(prediction: Any, gold: Any, category: int) -> float:
    """Token F1 (0..1) the way LoCoMo scores a question of numeric ``category``.

    Code 1 (multi-hop): :func:`multi_answer_f1`. Code 3 (open-domain): :func:`token_f1` against the gold answer's
    part before the first ``;``. Codes 2, 4 (and any other): :func:`token_f1`.
    """
    if category == 1:
        return multi_answer_f1(prediction, gold)
    if category == 3:
        return token_f1(prediction, str(gold).split(";")[0].strip())
    return token_f1(prediction, gold)


def _require_nltk() -> None:
    if importlib.util.find_spec("nltk") is None:
        raise ConfigError("BLEU-1 needs nltk, which is not installed: pip install 'inferscale-memory[eval]'")


def word_tokens(text: Any) -> list[str]:
    """NLTK's word tokens of the lower-cased text, without sentence splitting (``"It's 7 May."`` →
    ``["it", "'s", "7", "may", "."]``).

    Raises:
        ConfigError: when nltk is not installed (the ``eval`` extra).
    """
    _require_nltk()
    from nltk.tokenize import word_tokenize

    return list(word_tokenize(str(text).lower(), preserve_line=True))


def bleu1(prediction: Any, gold: Any) -> float:
    """Sentence BLEU-1 (0..1) with one reference: clipped unigram precision × brevity penalty (NLTK).

    NLTK's ``sentence_bleu([word_tokens(gold)], word_tokens(prediction), weights=(1, 0, 0, 0))`` with
    ``SmoothingFunction().method1``, as Mem0's evaluation scores it. The brevity penalty is 1 when the prediction
    is longer than the reference, else ``exp(1 - r / c)`` (``r``, ``c``: reference and prediction lengths in
    tokens). 0.0 when no unigram matches or the prediction is empty; the smoothing only touches the 2..4-gram
    precisions, whose weights are 0, so it never changes the score.

    Raises:
        ConfigError: when nltk is not installed (the ``eval`` extra).
    """
    _require_nltk()
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    score = sentence_bleu(
        [word_tokens(gold)],
        word_tokens(prediction),
        weights=(1, 0, 0, 0),
        smoothing_function=SmoothingFunction().method1,
    )
    return float(score)


def exact_match(a: Any, b: Any) -> bool:
    """Whether two answers are equal after :func:`normalize_answer`."""
    return normalize_answer(a) == normalize_answer(b)


def first_token_kl(prompt_logits: torch.Tensor | Sequence[float], kv_logits: torch.Tensor | Sequence[float]) -> float:
    """KL(prompt ‖ kv) in nats between the next-token distributions given by two logit vectors ``[vocab]``.

    ``sum_i p_i (log p_i - log q_i)`` with ``p = softmax(prompt_logits)``, ``q = softmax(kv_logits)``, computed in
    float64. 0 when the distributions are equal; always >= 0.

    Raises:
        ValueError: when the two vectors differ in shape.
    """
    p = torch.as_tensor(prompt_logits, dtype=torch.float64).flatten()
    q = torch.as_tensor(kv_logits, dtype=torch.float64).flatten()
    if p.shape != q.shape:
        raise ValueError(f"logit vectors differ in shape: {tuple(p.shape)} vs {tuple(q.shape)}")
    log_p = torch.log_softmax(p, dim=0)
    log_q = torch.log_softmax(q, dim=0)
    probs = log_p.exp()
    terms = torch.where(probs > 0, probs * (log_p - log_q), torch.zeros_like(probs))  # 0 · log 0 = 0
    return max(0.0, float(terms.sum()))
