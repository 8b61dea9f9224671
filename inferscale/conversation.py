"""What a chat request says: the caller's conversation and how to sample the answer.

Both are plain, validated values shared by every layer: the clients build them from their arguments, the engines
turn them into token ids (:class:`inferscale.engines.hf.PromptLayout`) and into their own sampling machinery
(transformers' logits processors, vLLM's ``SamplingParams``), and the server builds them from OpenAI requests. Bad
values raise :class:`~inferscale.errors.InvalidInputError` here, before anything is retrieved or generated, so every
backend refuses the same input the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from inferscale.errors import InvalidInputError
from inferscale.storable import check_unicode, is_blank
from inferscale.validation_text import shown_input

GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy decoding (vLLM's threshold; dividing logits by less overflows)."""

MAX_SEED = 2**63
"""Seeds are ints in ``[0, MAX_SEED)``."""
MAX_TOP_K = 2**31 - 1
"""The largest ``top_k`` (vLLM's sampler holds it in a 32-bit tensor; any value past the vocabulary keeps every
token)."""

Role = Literal["system", "user", "assistant"]
ROLES: tuple[Role, ...] = ("system", "user", "assistant")

ROLE_ALIASES: dict[str, Role] = {"developer": "system"}
"""Role names read as one of :data:`ROLES`: ``developer`` is OpenAI's newer name for ``system`` (its reasoning
models' instructions). Used wherever a role is read: ``chat`` messages, the server's OpenAI requests, ``add``."""


MESSAGE_KEYS = frozenset({"role", "content", "name"})
"""The keys of an OpenAI-style message dict that :func:`check_messages` reads (``name`` only as OpenAI allows it);
any other key must be ``None``."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of the caller's conversation.

    Attributes:
        role: ``"system"`` (an instruction), ``"user"`` or ``"assistant"`` (an earlier answer).
        content: the turn's text.
    """

    role: Role
    content: str


def check_messages(messages: Sequence[ChatMessage | Mapping[str, Any]]) -> tuple[ChatMessage, ...]:
    """Validate a conversation given as :class:`ChatMessage` objects or OpenAI-style ``{"role", "content"}`` dicts.

    A conversation is non-empty, uses only the system, user and assistant roles (a ``name`` key is accepted, as in
    OpenAI's API, and not used; so is any other key set to ``None``, as the OpenAI SDK's ``message.model_dump()``
    sends an answer's unset ``tool_calls``, ``function_call``, ``refusal``, ``audio`` and ``annotations`` back), has
    text content in every turn
    (a lone surrogate nowhere, as it has no UTF-8 form), contains a user message whose last one has text (it is what
    is answered, and retrieved with by default; an earlier user turn may be empty, as a chat engine keeps a question
    it failed to send in its history, and OpenAI's API takes it) and does not end with an assistant turn (continuing a
    partial answer is not supported).

    Returns:
        the messages as a tuple of :class:`ChatMessage`, contents unchanged.

    Raises:
        InvalidInputError: naming the first offending message and why.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInputError(
            f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}"
        )
    if not messages:
        raise InvalidInputError("messages is empty; pass at least one user message")
    checked: list[ChatMessage] = []
    for i, message in enumerate(messages):
        role: object
        content: object
        if isinstance(message, ChatMessage):
            role, content = message.role, message.content
        elif isinstance(message, Mapping):
            unknown = {key for key, value in message.items() if key not in MESSAGE_KEYS and value is not None}
            if unknown:
                raise InvalidInputError(
                    f"messages[{i}] has unsupported keys {sorted(unknown)} (tool calls are not supported)"
                )
            role, content = message.get("role"), message.get("content")
        else:
            raise InvalidInputError(
                f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise InvalidInputError(f"messages[{i}] has role {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise InvalidInputError(f"messages[{i}] content must be a string, got {type(content).__name__}")
        check_unicode(content, f"messages[{i}] content")
        checked.append(ChatMessage(cast(Role, role), content))
    users = [i for i, m in enumerate(checked) if m.role == "user"]
    if not users:
        raise InvalidInputError("messages has no user message; the model answers the last user turn")
    if is_blank(checked[users[-1]].content):
        raise InvalidInputError(f"messages[{users[-1]}] is a user message with no text: the last one is answered")
    if checked[-1].role == "assistant":
        raise InvalidInputError(
            "messages ends with an assistant turn; end with the user turn to answer (continuing an answer is not "
            "supported)"
        )
    return tuple(checked)


def last_user_text(messages: Sequence[ChatMessage]) -> str:
    """The content of the last user message (what ``chat`` retrieves with by default).

    Raises:
        InvalidInputError: when there is no user message.
    """
    for message in reversed(messages):
        if message.role == "user":
            return message.content
    raise InvalidInputError("messages has no user message")


def as_conversation(conversation: str | Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """A single query string as a one-turn conversation; a sequence of messages as a tuple. A string is checked
    for text; a sequence is trusted to come from :func:`check_messages`.

    Raises:
        InvalidInputError: for a query with no text or with a lone surrogate.
    """
    if isinstance(conversation, str):
        if is_blank(conversation):
            raise InvalidInputError("the query is empty")
        check_unicode(conversation, "the query")
        return (ChatMessage("user", conversation),)
    return tuple(conversation)


def _finite(name: str, value: object) -> float:
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int past the float range (10**400)
            number = math.inf
    if not math.isfinite(number):
        raise InvalidInputError(f"{name} must be a finite number, got {shown_input(value)}")
    return number


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """How the answer's tokens are chosen. The default is greedy decoding (the argmax at every step).

    The engines map these onto their own machinery: the transformers engine onto transformers' logits processors
    (``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
    ``TopPLogitsWarper``) and a seeded ``torch.Generator``; the vLLM engine onto ``vllm.SamplingParams``.

    Attributes:
        temperature: 0 (or anything below :data:`GREEDY_BELOW`) is greedy; above, logits are divided by it and
            the token is sampled. Ints are accepted and stored as floats, as are ``top_p`` and
            ``repetition_penalty``.
        top_p: nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``; in (0, 1].
        top_k: keep the ``top_k`` most likely tokens; ``None`` keeps all. At most :data:`MAX_TOP_K`.
        seed: seeds the sampler, so a request with the same seed samples the same answer; ``None`` is unseeded.
            At most ``2**63 - 1`` (what ``torch.Generator.manual_seed`` and vLLM take).
        repetition_penalty: > 0; above 1 makes tokens already in the prompt or the answer less likely (CTRL's
            penalty, as transformers and vLLM apply it). 1 is off.
        stop: strings that end the answer; the answer stops before the first one and does not contain it.

    Raises:
        InvalidInputError: for a sampling value that is not a finite number, ``temperature < 0``, ``top_p`` outside
            (0, 1], ``top_k`` outside ``[1, MAX_TOP_K]``,
            ``repetition_penalty <= 0``, a non-integer seed, or an empty stop string.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        # ints are numbers too (OpenAI clients send temperature=1); the engines' processors take floats
        for name in ("temperature", "top_p", "repetition_penalty"):
            object.__setattr__(self, name, _finite(name, getattr(self, name)))
        if self.temperature < 0:
            raise InvalidInputError(f"temperature must be >= 0 (0 is greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= MAX_TOP_K
        ):
            raise InvalidInputError(f"top_k must be an int in [1, 2**31) or None, got {shown_input(self.top_k)}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < MAX_SEED
        ):
            raise InvalidInputError(f"seed must be an int in [0, 2**63) or None, got {shown_input(self.seed)}")
        if self.repetition_penalty <= 0:
            raise InvalidInputError(f"repetition_penalty must be > 0 (1 is off), got {self.repetition_penalty!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            shown = self.stop if isinstance(self.stop, str) else list(self.stop)
            raise InvalidInputError(f"stop must be a list of non-empty strings, got {shown!r}")

    @classmethod
    def of(
        cls,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
        repetition_penalty: float | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> SamplingSettings:
        """Settings from optional call arguments (``None`` keeps the default); ``stop`` may be one string, as in
        OpenAI's API.

        Raises:
            InvalidInputError: see the class.
        """
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            if not stop:
                raise InvalidInputError("stop must be a non-empty string or a list of them, got ''")
            stops = (stop,)
        elif isinstance(stop, Sequence):
            stops = tuple(stop)
        else:
            raise InvalidInputError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
        return cls(
            temperature=0.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            top_k=top_k,
            seed=seed,
            repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
            stop=stops,
        )

    @property
    def is_greedy(self) -> bool:
        """True when every token is the argmax: ``temperature`` below :data:`GREEDY_BELOW` (as vLLM decides; a
        smaller one would overflow the softmax). Top-p, top-k and the seed then do not apply."""
        return self.temperature < GREEDY_BELOW


GREEDY = SamplingSettings()
"""Greedy decoding, no penalty, no stop strings."""
