"""Evaluation helpers: loaders for memory benchmarks such as LoCoMo (data read from a local copy)."""

from inferscale.eval.locomo import (
    DATE_TIME_FORMAT,
    UNANSWERABLE,
    LocomoConversation,
    LocomoQA,
    LocomoSession,
    LocomoTurn,
    date_label,
    get_conversation,
    load_locomo,
    parse_evidence,
    turn_text,
)

__all__ = [
    "DATE_TIME_FORMAT",
    "UNANSWERABLE",
    "LocomoConversation",
    "LocomoQA",
    "LocomoSession",
    "LocomoTurn",
    "date_label",
    "get_conversation",
    "load_locomo",
    "parse_evidence",
    "turn_text",
]
