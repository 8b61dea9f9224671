"""Prompt layout from the model's own chat template: ``[system prefix][memory segment][query]``.

The template is rendered once with a sentinel where the memory segment goes; the text before it is the system
prefix and the text after it (closing the system turn, the user's query, the assistant header) is the query part.
This works for any chat template that renders the system message verbatim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferscale.errors import ConfigError
from inferscale.kv.recompute import FactLineLayout

_SENTINEL = "\u2063INFERSCALE_MEMORY_SEGMENT\u2063"
_QUERY_SENTINEL = "\u2063INFERSCALE_QUERY\u2063"
_BULLET = "- "
_LINE_END = "\n"


class PromptLayout:
    """Splits the chat template around the memory segment and tokenizes each part separately.

    Both chat modes build the prompt from these same pieces, so their token ids are identical.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        system_prompt: instruction text placed before the memory segment.

    Raises:
        ConfigError: when the tokenizer has no chat template, or the template drops the system message.
    """

    def __init__(self, tokenizer: Any, system_prompt: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("the model's tokenizer has no chat template; configure an instruct model")
        rendered = tokenizer.apply_chat_template(
            [
                {"role": "system", "content": system_prompt + _SENTINEL},
                {"role": "user", "content": _QUERY_SENTINEL},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        if rendered.count(_SENTINEL) != 1 or rendered.count(_QUERY_SENTINEL) != 1:
            raise ConfigError("the chat template does not render the system message verbatim; cannot place memory")
        prefix, rest = rendered.split(_SENTINEL)
        self._tokenizer = tokenizer
        self._query_before, self._query_after = rest.split(_QUERY_SENTINEL)
        self.prefix_ids: list[int] = self._encode(prefix)

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def fact_ids(self, text: str) -> list[int]:
        """Tokens of one fact as a line of the memory segment: ``"- {text}\\n"``."""
        return self._encode(f"{_BULLET}{text.strip()}{_LINE_END}")

    def line_layout_of(self, ids: Sequence[int]) -> FactLineLayout:
        """How many of one fact line's tokens the bullet and the line break take: the leading tokens that decode to
        part of ``"- "`` and the trailing ones that decode to part of ``"\\n"``. A token that merges layout with
        fact text (``".\\n"`` in some vocabularies) is text, so it is not counted.

        Args:
            ids: the line's token ids, as :meth:`fact_ids` gives them.
        """
        opening, text = 0, ""
        while opening < len(ids):
            piece = self._tokenizer.decode([ids[opening]])
            if not piece or not _BULLET.startswith(text + piece):
                break
            text += piece
            opening += 1
        closing, text = 0, ""
        while closing < len(ids) - opening:
            piece = self._tokenizer.decode([ids[len(ids) - 1 - closing]])
            if not piece or not _LINE_END.endswith(piece + text):
                break
            text = piece + text
            closing += 1
        return FactLineLayout(opening=opening, closing=closing)

    def context_ids(self, turns: Sequence[str]) -> list[int]:
        """Tokens of preceding conversation turns used as encoding context, each laid out as a memory line
        (:meth:`fact_ids`): a fact encoded after them sees what it sees when served after other memories."""
        return [t for turn in turns for t in self.fact_ids(turn)]

    def query_ids(self, query: str) -> list[int]:
        """Tokens after the memory segment: the end of the system turn, the user's query, the assistant header."""
        return self._encode(self._query_before + query.strip() + self._query_after)


class LayoutTokensMixin:
    """The token-id accessors of the :class:`inferscale.engines.base.Engine` interface, for engines that build
    their prompts with a :class:`PromptLayout` (the transformers and vLLM engines). Subclasses implement
    :meth:`_prompt_layout`, loading the model first if needed."""

    def _prompt_layout(self) -> PromptLayout:
        raise NotImplementedError

    def system_prefix_ids(self) -> list[int]:
        """Token ids of the system prefix."""
        return list(self._prompt_layout().prefix_ids)

    def fact_token_ids(self, text: str) -> list[int]:
        """Token ids of one fact line of the memory segment."""
        return self._prompt_layout().fact_ids(text)

    def context_token_ids(self, turns: Sequence[str]) -> list[int]:
        """Token ids of preceding turns (encoding context)."""
        return self._prompt_layout().context_ids(turns)

    def query_token_ids(self, query: str) -> list[int]:
        """Token ids after the memory segment (end of system turn, user query, assistant header)."""
        return self._prompt_layout().query_ids(query)


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end an answer: the generation config's EOS ids, the tokenizer's EOS and the end-of-turn
    tokens of common chat templates (ChatML ``<|im_end|>``, Llama 3 ``<|eot_id|>``, Gemma ``<end_of_turn>``)."""
    ids: set[int] = set()
    eos = model.generation_config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids
