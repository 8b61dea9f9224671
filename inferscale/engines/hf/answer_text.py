"""The answer's text as it streams: token ids in, text deltas out, never half a character, never a stop string.

Both engines feed every generated token id to an :class:`AnswerText`. It decodes the whole answer again on each
token (the tokenizer's own ``decode``, so byte-level and SentencePiece vocabularies both come out right) and emits
only the part that can no longer change:

- a trailing U+FFFD (a multi-byte character split across tokens) waits for the token that completes it;
- trailing whitespace waits for the next visible character (the answer is stripped at both ends);
- a suffix that could be the start of a stop string waits until it is not;
- text from the first stop string on is never emitted, and ends the answer.

The deltas joined are the answer, so a streamed answer equals the same request's non-streamed one by construction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

_REPLACEMENT = "\ufffd"


class AnswerText:
    """Incremental detokenizer for one answer.

    Args:
        tokenizer: the model's transformers tokenizer.
        stop: stop strings (:attr:`inferscale.conversation.SamplingSettings.stop`).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self._emitted = ""
        self._rewritten = False
        self.stopped = False
        """True once the decoded text contains a stop string: generation should end."""

    @property
    def text(self) -> str:
        """The text emitted so far (the answer, once :meth:`finish` was called)."""
        return self._emitted

    def _decoded(self) -> str:
        text = self._tokenizer.decode(self._ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        settled = text.rstrip(_REPLACEMENT)  # a trailing U+FFFD is half a character, not text a stop string may match
        cuts = [i for i in (settled.find(s) for s in self._stop) if i >= 0]
        if cuts:
            self.stopped = True
            return text[: min(cuts)]
        return text

    def _held_stop_prefix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        held = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:n]):
                    held = n
                    break
        return held

    def _emit(self, safe: str) -> str:
        if not safe.startswith(self._emitted) and not self._rewritten:
            # The tokenizer changed text already shown (a decoder that cleans up spaces around later tokens).
            # Shown text cannot be taken back: keep it and go on from its length, so nothing later is lost.
            self._rewritten = True
            log.warning("the tokenizer rewrote streamed text already shown; the answer keeps the text as shown")
        delta = safe[len(self._emitted) :]
        self._emitted += delta
        return delta

    def push(self, token_id: int) -> str:
        """Add one generated token; returns the newly stable text (often ``""``)."""
        self._ids.append(int(token_id))
        text = self._decoded().lstrip()
        if self.stopped:
            return self._emit(text.rstrip())
        text = text.rstrip(_REPLACEMENT).rstrip()
        held = self._held_stop_prefix(text)
        # What is shown before a held stop-string prefix is stripped too: if the stop string completes, the answer
        # ends there, stripped.
        return self._emit(text[: len(text) - held].rstrip() if held else text)

    def finish(self) -> str:
        """End the answer (stop token, stop string or budget); returns the rest of the text. A budget that ended
        inside a multi-byte character drops that character."""
        return self._emit(self._decoded().strip().rstrip(_REPLACEMENT).rstrip())
