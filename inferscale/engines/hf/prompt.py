"""Prompt layout from the model's own chat template: ``[system prefix][memory segment][conversation]``.

The template renders the configured system prompt followed by a sentinel where the memory segment goes, then the
caller's conversation. The text before the sentinel is the fixed system prefix (the same for every request, so fact
K/V encoded after it stay reusable); the text after it (the end of the system turn, the caller's system text, the
earlier turns, the last user turn and the assistant header) is the conversation part, prefilled on every request.
This works for any chat template that renders the system message verbatim.

Caller system text: a template that renders a system message anywhere (ChatML, Llama 3, ...) gets each of the
caller's system messages as its own system turn, in place. A template that allows only one leading system message
(it raises, or drops the second one; Gemma, Mistral) gets the caller's leading system messages appended to the
fixed system message after the memory segment, separated by blank lines, so they still come after the memory and
are prefilled; a system message after the first user turn is refused for such a template
(:class:`~inferscale.errors.InvalidInputError`). A template that moves the system message away from the start
once there are earlier turns (Mistral's puts it in the last user turn) serves single-turn requests only; a
multi-turn conversation is refused with :class:`~inferscale.errors.InvalidInputError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError

from inferscale.control_tokens import control_token_texts, plain_token_ids, rendered_token_ids, template_token_ids
from inferscale.conversation import ChatMessage, as_conversation
from inferscale.errors import ConfigError, InvalidInputError
from inferscale.kv.recompute import FactLineLayout

_SENTINEL = "\u2063INFERSCALE_MEMORY_SEGMENT\u2063"
_QUERY_SENTINEL = "\u2063INFERSCALE_QUERY\u2063"
_SYSTEM_SENTINEL = "\u2063INFERSCALE_CALLER_SYSTEM\u2063"
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
        self._tokenizer = tokenizer
        self._system_prompt = system_prompt
        self._controls: frozenset[str] | None = None
        rendered = self._render(system_prompt + _SENTINEL, [{"role": "user", "content": _QUERY_SENTINEL}])
        if rendered.count(_SENTINEL) != 1 or rendered.count(_QUERY_SENTINEL) != 1:
            raise ConfigError("the chat template does not render the system message verbatim; cannot place memory")
        self._prefix_text = rendered.split(_SENTINEL)[0]
        self.prefix_ids: list[int] = self._encode(self._prefix_text)
        self.system_turns = self._renders_system_turns()
        """Whether the template renders a caller's system message as its own turn after the fixed one (else the
        caller's leading system text is appended to the fixed system message, after the memory segment)."""

    def _render(self, system_text: str, turns: list[dict[str, str]]) -> str:
        rendered: str = self._tokenizer.apply_chat_template(
            [{"role": "system", "content": system_text}, *turns], tokenize=False, add_generation_prompt=True
        )
        return rendered

    def _renders_system_turns(self) -> bool:
        turns = [{"role": "system", "content": _SYSTEM_SENTINEL}, {"role": "user", "content": _QUERY_SENTINEL}]
        try:
            rendered = self._render(self._system_prompt + _SENTINEL, turns)
        except (TemplateError, ValueError, TypeError):
            return False
        marks = [rendered.find(m) for m in (_SENTINEL, _SYSTEM_SENTINEL, _QUERY_SENTINEL)]
        return rendered.count(_SYSTEM_SENTINEL) == 1 and marks == sorted(marks) and marks[0] >= 0

    def _encode(self, text: str) -> list[int]:
        return template_token_ids(self._tokenizer, text)

    @property
    def control_texts(self) -> frozenset[str]:
        """The texts the tokenizer reads as its control tokens (:func:`inferscale.control_tokens.control_token_texts`):
        in a fact, a context turn or a message they are tokenised as plain text."""
        if self._controls is None:
            self._controls = control_token_texts(self._tokenizer)
        return self._controls

    def fact_ids(self, text: str) -> list[int]:
        """Tokens of one fact as a line of the memory segment: ``"- {text}\\n"``, as plain text (a control token's text
        in ``text`` is split into ordinary tokens: :func:`inferscale.control_tokens.plain_token_ids`)."""
        return plain_token_ids(self._tokenizer, f"{_BULLET}{text.strip()}{_LINE_END}")

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

    def conversation_ids(self, conversation: str | Sequence[ChatMessage]) -> list[int]:
        """Tokens after the memory segment: the end of the system turn, then the caller's conversation (system
        text, earlier turns, the last user turn; each content stripped) in the model's chat template, then the
        assistant header. A string is a one-turn conversation (the user's query). Each content is tokenised as plain
        text (:func:`inferscale.control_tokens.rendered_token_ids`): a message cannot open or close a turn.

        Args:
            conversation: the query, or messages checked by :func:`inferscale.conversation.check_messages`.

        Raises:
            InvalidInputError: when the model's chat template refuses the conversation (roles that do not
                alternate, a system message after the first user turn where only a leading one is allowed), or
                renders the fixed system prefix differently for it (Mistral's template moves the system message
                into the last user turn of a multi-turn conversation), so the memory cannot be placed after it;
                when a content holds a control token's text and the template changes contents as it renders them.
        """
        messages = list(as_conversation(conversation))
        extras: list[str] = []  # the caller's leading system texts, appended to the fixed system message
        if not self.system_turns:
            while messages and messages[0].role == "system":
                extra = messages.pop(0).content.strip()
                extras += [extra] if extra else []
            if any(m.role == "system" for m in messages):
                raise InvalidInputError(
                    "this model's chat template accepts system text only before the first user turn; move the "
                    "system message to the start of the conversation"
                )
        roles = [m.role for m in messages]

        def render(texts: Sequence[str]) -> str:
            system_text = self._system_prompt + _SENTINEL + "".join(f"\n\n{t}" for t in texts[: len(extras)])
            turns = [{"role": r, "content": t} for r, t in zip(roles, texts[len(extras) :], strict=True)]
            try:
                rendered = self._render(system_text, turns)
            except (TemplateError, ValueError, TypeError) as exc:
                raise InvalidInputError(f"the model's chat template refused the conversation: {exc}") from exc
            if rendered.count(_SENTINEL) != 1 or rendered.split(_SENTINEL)[0] != self._prefix_text:
                raise InvalidInputError(
                    "this model's chat template does not keep the system message at the start of this conversation "
                    "(Mistral's renders it inside the last user turn once there are earlier turns), so the memory "
                    "cannot follow the fixed system prefix; send the conversation as one user turn"
                )
            return rendered.split(_SENTINEL)[1]

        contents = [*extras, *(m.content.strip() for m in messages)]
        return rendered_token_ids(self._tokenizer, render, contents, self.control_texts)

    def query_ids(self, query: str) -> list[int]:
        """Tokens after the memory segment for a one-turn conversation: the end of the system turn, the user's
        query, the assistant header (:meth:`conversation_ids` of ``query``).

        Raises:
            InvalidInputError: for an empty query.
        """
        return self.conversation_ids(query)


class LayoutTokensMixin:
    """The token-id accessors of the :class:`inferscale.engines.base.Engine` interface, for engines that build
    their prompts with a :class:`PromptLayout` (the transformers and vLLM engines). Subclasses implement
    :meth:`_prompt_layout`: the loaded model's layout, or before it is loaded one over the tokenizer alone
    (:mod:`inferscale.engines.hf.layout_only`), so these accessors load no weights."""

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

    def control_token_texts(self) -> frozenset[str]:
        """The texts the tokenizer reads as its control tokens; tokenised as plain text in facts, turns and
        messages (:attr:`PromptLayout.control_texts`)."""
        return self._prompt_layout().control_texts

    def query_token_ids(self, query: str) -> list[int]:
        """Token ids after the memory segment (end of system turn, user query, assistant header)."""
        return self._prompt_layout().query_ids(query)

    def conversation_token_ids(self, conversation: str | Sequence[ChatMessage]) -> list[int]:
        """Token ids after the memory segment for a conversation (:meth:`PromptLayout.conversation_ids`)."""
        return self._prompt_layout().conversation_ids(conversation)


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
