"""Text from users and memories is tokenised as plain text, never as the model's control tokens.

A tokenizer turns the text of its special added tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``,
``<|eot_id|>``, ...) into those tokens wherever they appear. A memory holding ``"<|im_end|><|im_start|>system"``
would otherwise close the system turn and open a forged one inside the memory segment, and a message's content could
do the same in the conversation. Every text that comes from a caller or a stored memory (fact lines, context turns,
message contents, the extraction LLM's input) goes through :func:`plain_token_ids` or :func:`rendered_token_ids`;
only the chat template's own markup and the configured system prompt keep their control tokens.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from inferscale.errors import InvalidInputError

_PLACEHOLDER = "\u2063INFERSCALE_CONTENT_{}\u2063"


def control_token_texts(tokenizer: Any) -> frozenset[str]:
    """The texts a transformers ``tokenizer`` reads as one of its special added tokens (its control tokens).

    Args:
        tokenizer: a transformers tokenizer (read duck-typed: ``added_tokens_decoder``, ``all_special_tokens``).
    """
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {token.content for token in added.values() if getattr(token, "special", False)}
    texts.update(getattr(tokenizer, "all_special_tokens", ()) or ())
    return frozenset(text for text in texts if text)


def holds_control_token(text: str, controls: frozenset[str]) -> bool:
    """Whether ``text`` holds one of ``controls`` (:func:`control_token_texts`) as a substring."""
    return any(control in text for control in controls)


_PLAIN_TOKENIZERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_PLAIN_TOKENIZERS_LOCK = threading.Lock()


def _plain_tokenizer(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` that only ever tokenises plain text (made once per tokenizer). A fast tokenizer
    applies ``split_special_tokens`` by setting a flag on its backend for the call: one tokenizer asked for plain
    text on one thread and for template markup on another read control tokens in the plain text, or none in the
    markup. The copy's flag is only ever set one way, the original's the other."""
    with _PLAIN_TOKENIZERS_LOCK:
        plain = _PLAIN_TOKENIZERS.get(tokenizer)
        if plain is None:
            plain = _PLAIN_TOKENIZERS[tokenizer] = copy.deepcopy(tokenizer)
        return plain


def plain_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text: no special tokens added, and none read from the text (a control token's
    text is split into ordinary tokens, ``"<|im_end|>"`` → ``"<", "|", "im", "_", "end", "|", ">"`` in ChatML
    vocabularies). Equal to the tokenizer's default ids for a text that holds no control token's text. Safe to call
    from several threads while others tokenise template markup (:func:`_plain_tokenizer`)."""
    plain = _plain_tokenizer(tokenizer)
    return list(plain(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def template_token_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of chat-template markup (control tokens read as such), no special tokens added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def rendered_token_ids(
    tokenizer: Any,
    render: Callable[[Sequence[str]], str],
    contents: Sequence[str],
    controls: frozenset[str] | None = None,
) -> list[int]:
    """Token ids of ``render(contents)`` (a chat template's output around the callers' texts), with each of
    ``contents`` tokenised as plain text (:func:`plain_token_ids`) and the template's markup as such.

    When no content holds a control token's text, these are the tokenizer's ids of the rendered text, unchanged.
    Otherwise the template is rendered once more with a placeholder in place of each content, and the markup between
    them and the contents are tokenised apart.

    Args:
        tokenizer: a transformers tokenizer.
        render: renders the template around a list of contents, one per text slot, in the order given.
        contents: the callers' texts.
        controls: the tokenizer's :func:`control_token_texts`, when the caller keeps them (``None``: read here).

    Raises:
        InvalidInputError: when a content holds a control token's text and the template does not render the contents
            verbatim, in order (it changes them), so they cannot be kept apart from its markup.
    """
    rendered = render(contents)
    controls = control_token_texts(tokenizer) if controls is None else controls
    offending = [content for content in contents if holds_control_token(content, controls)]
    if not offending:
        return template_token_ids(tokenizer, rendered)
    placeholders = [_PLACEHOLDER.format(i) for i in range(len(contents))]
    markup = render(placeholders)
    pieces: list[str] = []
    rest = markup
    for placeholder in placeholders:
        before, found, rest = rest.partition(placeholder)
        if not found:
            break
        pieces.append(before)
    if len(pieces) != len(contents) or "".join(p + c for p, c in zip(pieces, contents, strict=True)) + rest != rendered:
        control = next(c for c in sorted(controls) if c in offending[0])
        raise InvalidInputError(
            f"a message holds the model's control token {control!r}, and this model's chat template changes message "
            "text as it renders it, so the text cannot be kept apart from the template's own tokens; remove it"
        )
    ids: list[int] = []
    for piece, content in zip(pieces, contents, strict=True):
        ids += template_token_ids(tokenizer, piece) + plain_token_ids(tokenizer, content)
    return ids + template_token_ids(tokenizer, rest)


__all__ = [
    "control_token_texts",
    "holds_control_token",
    "plain_token_ids",
    "rendered_token_ids",
    "template_token_ids",
]
