"""Next-token choice for the transformers engine, with transformers' own logits processors.

:class:`TokenChooser` applies, in transformers' ``generate`` order, the repetition penalty
(``RepetitionPenaltyLogitsProcessor``, over the prompt and the answer so far), then, when sampling, the temperature
(``TemperatureLogitsWarper``), top-k (``TopKLogitsWarper``) and top-p (``TopPLogitsWarper``), and draws from the
softmax with ``torch.multinomial`` on a seeded ``torch.Generator``, as ``generate(do_sample=True)`` does. Greedy
settings take the argmax of the (penalised) logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inferscale.conversation import SamplingSettings


class TokenChooser:
    """Chooses each next token of one answer.

    Args:
        settings: temperature, top-p, top-k, seed, repetition penalty.
        prompt_ids: the whole prompt's token ids (system prefix, memory, conversation); the repetition penalty
            covers them, as in transformers and vLLM.
        device: where the logits are.
    """

    def __init__(self, settings: SamplingSettings, prompt_ids: Sequence[int], device: torch.device) -> None:
        self._settings = settings
        processors: list[object] = []
        if settings.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(settings.repetition_penalty))
        if not settings.is_greedy:
            processors.append(TemperatureLogitsWarper(settings.temperature))
            if settings.top_k is not None:
                processors.append(TopKLogitsWarper(settings.top_k))
            if settings.top_p < 1.0:
                processors.append(TopPLogitsWarper(settings.top_p))
        self._processors = LogitsProcessorList(processors)
        self._ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        self._generator: torch.Generator | None = None
        if not settings.is_greedy:
            self._generator = torch.Generator(device=device)
            if settings.seed is not None:
                self._generator.manual_seed(settings.seed)
            else:
                self._generator.seed()

    def choose(self, logits: torch.Tensor) -> int:
        """The next token id from the last position's logits ``[vocab]``; the token is appended to the sequence
        the repetition penalty sees."""
        scores = logits.float()[None]
        if self._processors:
            scores = self._processors(cast(torch.LongTensor, self._ids), scores)
        if self._generator is None:
            token = int(scores[0].argmax())
        else:
            probs = torch.softmax(scores[0], dim=-1)
            token = int(torch.multinomial(probs, 1, generator=self._generator))
        if self._settings.repetition_penalty != 1.0:
            self._ids = torch.cat([self._ids, self._ids.new_tensor([[token]])], dim=1)
        return token
