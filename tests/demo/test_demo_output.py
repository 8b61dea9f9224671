"""What the demo prints of memories, questions and answers (a LoCoMo file's, or a model's) is text: never rich
markup, and terminal controls escaped, as the memory commands print them (a review's find: a ``[/x]`` in a memory
made rich raise ``MarkupError``, and the tiny model's control characters reached the terminal)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from inferscale.demo import DemoQuestion, DemoScript, run_demo

MEMORY = "Rex [/x] the \x1b[2J beagle"
ANSWER = "Rex\u202e [bold]x[/bold]\x9b"


class _Client:
    """The calls ``run_demo`` makes, answering with the texts above."""

    def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        return {"results": [{}]}

    def wait_for_encoding(self) -> bool:
        return True

    def get_all(self, **kwargs: Any) -> dict[str, Any]:
        return {"results": [{"memory": MEMORY}]}

    def chat(self, question: str, **kwargs: Any) -> Any:
        timings = SimpleNamespace(ttft_ms=1.0, retrieval_ms=0.0, kv_assembly_ms=0.0, prefill_ms=0.0, total_ms=2.0)
        return SimpleNamespace(answer=ANSWER, memory_ids=["m"], timings=timings, memory_tokens=3)


SCRIPT = DemoScript("u", [("day 1", [{"role": "user", "content": "hi"}])], [DemoQuestion("Who [/q]?", "Rex")])


@pytest.mark.parametrize("as_json", [False, True])
def test_the_demo_prints_text_never_markup_or_terminal_controls(
    as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    run_demo(SCRIPT, _Client(), 3, False, as_json, Console(file=out, width=200))  # type: ignore[arg-type]
    printed = out.getvalue() + capsys.readouterr().out
    assert not any(char in printed for char in ("\x1b", "\u202e", "\x9b")), ascii(printed)
    if as_json:
        assert json.loads(printed)["kv"]["answer"] == ANSWER
    else:
        assert "Rex [/x] the \\x1b[2J beagle" in printed and "[bold]x[/bold]" in printed and "Who [/q]?" in printed
