"""The system prompts ``inferscale eval fidelity`` runs every setting under, apart from the evaluation (which
imports torch), so that building the command line parser imports none of it."""

from __future__ import annotations

__all__ = ["SYSTEM_PROMPTS"]

SYSTEM_PROMPTS: dict[str, str] = {
    "short": "Memories:\n",
    "default": (
        "You are a helpful assistant with a long-term memory of the user. "
        "Answer the question briefly, using the memories below when they are relevant.\nMemories:\n"
    ),
    "long": (
        "You are a careful, friendly assistant that remembers what the user told you in earlier conversations. "
        "Below is a list of memories retrieved for this question: each line is one thing the user or someone "
        "they spoke with said, sometimes with the date it was said. Some memories may be irrelevant. Answer the "
        "user's question in one short sentence, using only the memories that matter; if they do not contain the "
        "answer, say that you do not know.\nMemories:\n"
    ),
}
"""The three system prompts every setting is judged on (a remedy tuned on one prompt is not a default)."""
