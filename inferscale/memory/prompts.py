"""The fact-extraction prompt, sized for a 135M model: a short system instruction plus worked examples.

The examples are real chat turns (user asks, assistant answers in JSON) rather than text inside the system
prompt: a tiny model imitates a previous answer turn far more reliably than it follows a description. One
example yields no facts, so the model learns that the answer depends on the input and may be empty.
By default only the user's turns are shown; measured on SmolLM2-135M, assistant turns mostly produced false
facts and copied example facts.
"""

from __future__ import annotations

from datetime import date

from inferscale.memory.messages import TOOL_ROLES, Message

FACT_EXTRACTION_SYSTEM_PROMPT = (
    "You save facts about the user from a chat. Today is {today}.\n"
    "Write each fact as one short sentence that makes sense alone. Use names instead of I, my, he or she. "
    "Copy names, places and dates exactly. Keep the language of the chat. "
    "Save preferences, plans, relationships, dates and personal details. "
    "Skip greetings and the assistant's advice. "
    'Reply with JSON: {{"facts": [...]}}; use {{"facts": []}} when there is nothing to save.'
)

# (conversation as rendered by format_conversation, expected JSON answer)
FEW_SHOT_EXAMPLES: tuple[tuple[str, str], ...] = (
    (
        "user: I'm Tom, a teacher from Oslo.\nuser: My wife Ingrid loves hiking.",
        '{"facts": ["User\'s name is Tom", "Tom is a teacher from Oslo", "Tom\'s wife is Ingrid", '
        '"Ingrid loves hiking"]}',
    ),
    ("user: What's the capital of Peru?", '{"facts": []}'),
    (
        "user: I'll fly to Rome on 3 July. I hate flying though.",
        '{"facts": ["User will fly to Rome on 3 July", "User hates flying"]}',
    ),
)


CUSTOM_INSTRUCTIONS_HEADER = "Instructions from the app, which win where they differ from the rules above:"
"""The line that introduces custom instructions (Mem0's ``custom_instructions``) after the system instruction."""


def fact_extraction_system_prompt(today: date, instructions: str | None = None) -> str:
    """The system instruction, with ``today`` written as ISO 8601 (``YYYY-MM-DD``) to anchor relative dates, and
    then, when given, the app's ``instructions`` (stripped) under :data:`CUSTOM_INSTRUCTIONS_HEADER`."""
    prompt = FACT_EXTRACTION_SYSTEM_PROMPT.format(today=today.isoformat())
    return prompt if instructions is None else f"{prompt}\n{CUSTOM_INSTRUCTIONS_HEADER}\n{instructions.strip()}"


def format_conversation(messages: list[Message], *, include_assistant: bool = False) -> str:
    """Render turns as ``role: content`` lines (``role (name): content`` when a name is set).

    System messages are always left out: they instruct the agent and hold no facts about the user; so are tool
    results (as Mem0 leaves them out of extraction).

    Args:
        messages: the conversation.
        include_assistant: keep assistant turns too. Off by default: a 135M model turns the assistant's
            pleasantries into false facts ("User is fine"); larger models can use the context they give.
    """
    lines = []
    for message in messages:
        if (
            message.role == "system"
            or message.role in TOOL_ROLES
            or (message.role == "assistant" and not include_assistant)
        ):
            continue
        speaker = f"{message.role} ({message.name})" if message.name else message.role
        lines.append(f"{speaker}: {message.content.strip()}")
    return "\n".join(lines)


def build_extraction_messages(
    messages: list[Message], today: date, *, include_assistant: bool = False, instructions: str | None = None
) -> list[dict[str, str]]:
    """The chat sent to the extraction LLM: system prompt, the worked examples, then the conversation.

    Args:
        messages: the conversation.
        today: the date relative dates are resolved against.
        include_assistant: show assistant turns to the LLM (see :func:`format_conversation`).
        instructions: the app's custom instructions, appended to the system prompt
            (:func:`fact_extraction_system_prompt`); ``None`` for none.

    Returns:
        OpenAI-style turns; empty when no message is left to show (nothing to extract from).
    """
    conversation = format_conversation(messages, include_assistant=include_assistant)
    if not conversation:
        return []
    chat = [{"role": "system", "content": fact_extraction_system_prompt(today, instructions)}]
    for example, answer in FEW_SHOT_EXAMPLES:
        chat.append({"role": "user", "content": example})
        chat.append({"role": "assistant", "content": answer})
    chat.append({"role": "user", "content": conversation})
    return chat
