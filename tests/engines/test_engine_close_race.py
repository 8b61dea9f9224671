"""A call whose engine is closed by another thread after the call loaded it and before it takes the engine's lock
(an async chat opening on a model thread while its client closes; ``prepare_kv`` across a sync ``close()``): it
read attributes ``close()`` had deleted and failed with a bare ``AttributeError`` (``'TransformersEngine' object
has no attribute '_layout'``, ``_encoder``, ...; an in-process concurrency tester, 4 of 6 async chats). Every such
call now raises ``EngineClosedError``, and a call made after the close loads the engine again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tiny_models import tiny_engine

from inferscale.errors import EngineClosedError
from inferscale.kv.encode import EncodeRequest

QUESTION = "Where does Maya live?"

CALLS: dict[str, Callable[[Any], Any]] = {
    "encode_facts": lambda engine: engine.encode_facts([EncodeRequest(engine.fact_token_ids("Maya lives in Porto."))]),
    "assemble": lambda engine: engine.assemble([]),
    "stream_kv": lambda engine: engine.stream_kv(QUESTION, [], 2),
    "stream_prompt": lambda engine: engine.stream_prompt(QUESTION, [[70, 71]], 2),
    "first_token_logits": lambda engine: engine.first_token_logits(QUESTION, None, [[70, 71]]),
    "rope_table": lambda engine: engine.rope_table,
    "prefix_kv": lambda engine: engine.prefix_kv,
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_close_between_a_calls_load_and_its_lock_raises_engine_closed(
    call: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tiny_engine("llama")
    expected = CALLS["first_token_logits"](engine)
    load = engine.load

    def load_then_closed_elsewhere() -> Any:
        loaded = load()
        engine.close()  # another thread's close() lands here, before this call's turn at the lock
        return loaded

    monkeypatch.setattr(engine, "load", load_then_closed_elsewhere)
    with pytest.raises(EngineClosedError, match="the engine was closed while this call"):
        call(engine)
    monkeypatch.setattr(engine, "load", load)
    assert torch.equal(CALLS["first_token_logits"](engine), expected)  # a later call loads it again


def test_the_layout_and_context_window_answer_while_the_engine_is_closed() -> None:
    """They read the loaded state without the lock, so a close on another thread may come at any point of the read;
    what they fall back to is checked here: after a close they answer from the tokenizer and config, the same."""
    engine = tiny_engine("llama")
    window, ids = engine.max_context_tokens, engine.fact_token_ids("Maya lives in Porto.")
    engine.close()
    assert (engine.max_context_tokens, engine.fact_token_ids("Maya lives in Porto.")) == (window, ids)
