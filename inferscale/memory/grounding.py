"""Checks that an extracted fact copies its names, numbers and language from the conversation.

Small models are prone to this failure: SmolLM2-135M answered a Chinese introduction with a few-shot example's
"User will fly to Rome on 3 July". The check catches it without another model call. A fact fails when:

- a name (a capitalised word other than the first) or a number in it does not occur in the conversation;
- the conversation is written in CJK script but the fact is not, or most of the fact's CJK characters do not
  occur in the conversation;
- it copies a worked example of the extraction prompt (:data:`inferscale.memory.prompts.FEW_SHOT_EXAMPLES`): its
  words, leaving out "user" and the conversation's own words (a name it put in), are an example fact's, and one of
  them is not in the conversation. SmolLM2-135M answered "Hi, my name is Maya and I live in Porto." with "User
  hates flying", an example fact without a name or number for the checks above to catch.

Paraphrase is allowed ("I ride my red bike" → "Owns a red bicycle"); only copied tokens are checked. Both texts are
compared in Unicode's NFKC form, so a name copied in another normal form (NFD "José" for NFC), full-width digits
and half-width katakana count as copied.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata

from inferscale.memory.prompts import FEW_SHOT_EXAMPLES

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?|\d+(?:[.,:/]\d+)*", re.UNICODE)
_CJK = re.compile(r"[\u1100-\u11ff\u3040-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\U00020000-\U000323af]")
"""A CJK character of NFKC text: Hangul jamo and syllables (NFKC makes compatibility jamo conjoining ones), kana,
Bopomofo, CJK strokes, symbols and ideographs (the compatibility ones and the extensions beyond the BMP too)."""


def is_cjk(char: str) -> bool:
    """Whether ``char`` (of NFKC text) is written in CJK script (:data:`_CJK`), whose words are not spaced."""
    return _CJK.match(char) is not None


def comparable(text: str) -> str:
    """``text`` in Unicode's NFKC form: the form every grounding check compares texts in."""
    return unicodedata.normalize("NFKC", text)


CJK_CONVERSATION_SHARE = 0.3
"""A conversation counts as CJK when at least this share of its letters are CJK characters."""
CJK_FACT_MIN_SHARE = 0.5
"""A CJK fact must take at least this share of its CJK characters from the conversation."""
_GENERIC = frozenset({"user", "the", "i", "he", "she", "they", "we", "it", "assistant"})


def _cjk_share(text: str) -> float:
    letters = [ch for ch in text if ch.isalpha()]
    return sum(1 for ch in letters if _CJK.match(ch)) / len(letters) if letters else 0.0


_FUNCTION_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "but",
        "by",
        "called",
        "for",
        "from",
        "has",
        "have",
        "in",
        "is",
        "it",
        "its",
        "name",
        "named",
        "of",
        "on",
        "or",
        "than",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "will",
        "with",
    ]
)
"""Words that carry no content of their own (a name is told by the name itself): a fact's copy of an example is told
by its content words only."""


def _content_words(text: str) -> frozenset[str]:
    """``text``'s content words, casefolded, possessives cut (``user's`` is ``user``): not numbers (checked
    above), generic words (``user``, pronouns) or function words."""
    words = {w.casefold().removesuffix("'s").removesuffix("’s") for w in _WORD.findall(text) if not w[0].isdigit()}
    return frozenset(words - _GENERIC - _FUNCTION_WORDS)


@functools.cache
def _example_facts() -> tuple[frozenset[str], ...]:
    """The content words of every fact the extraction prompt's worked examples answer with."""
    facts = [fact for _, answer in FEW_SHOT_EXAMPLES for fact in json.loads(answer)["facts"]]
    return tuple(_content_words(fact) for fact in facts)


def _copies_an_example(fact: str, source_words: set[str]) -> bool:
    """Whether ``fact`` is a worked example's fact (its words, the conversation's words aside, are the example's)
    with a word the conversation does not hold, inflections aside: a word counts as held when a word of the
    conversation starts with its first ``max(3, len - 3)`` letters ("I hate flying" grounds "User hates flying")."""
    own = _content_words(fact)
    if not any(own == example or own - source_words == example for example in _example_facts()):
        return False
    return any(not any(s.startswith(w[: max(3, len(w) - 3)]) for s in source_words) for w in own)


def ungrounded_reason(fact: str, conversation: str) -> str | None:
    """Why ``fact`` is not grounded in ``conversation``, or ``None`` when it is.

    Returns:
        A short reason naming the first invented name or number, the copied example, or the language mismatch;
        ``None`` if the fact passes every check.
    """
    fact, conversation = comparable(fact), comparable(conversation)
    source = conversation.casefold()
    source_words = {w.casefold() for w in _WORD.findall(conversation)}
    words = _WORD.findall(fact)
    for index, word in enumerate(words):
        key = word.casefold()
        if word[0].isdigit() and word not in conversation:
            return f"the number {word!r} is not in the conversation"
        is_name = index > 0 and word[0].isupper() and key not in _GENERIC and not _CJK.match(word[0])
        if is_name and key not in source_words and key not in source:
            return f"the name {word!r} is not in the conversation"
    if _copies_an_example(fact, source_words):
        return "it copies a worked example of the extraction prompt"
    if _cjk_share(conversation) >= CJK_CONVERSATION_SHARE:
        chars = _CJK.findall(fact)
        if not chars:
            return "the conversation is in CJK script and the fact is not"
        if sum(1 for ch in chars if ch in conversation) / len(chars) < CJK_FACT_MIN_SHARE:
            return "most of the fact's characters are not in the conversation"
    return None


__all__ = ["comparable", "is_cjk", "ungrounded_reason"]
