"""``loads_json``: the standard library's parser, with nesting too deep refused as malformed JSON and, with
``unique_keys``, an object naming a key twice too (at any depth, the key named, the position of its last
occurrence); keys repeated across objects are no repetition."""

from __future__ import annotations

import json

import pytest

from inferscale.json_text import JSONDuplicateKeyError, JSONTooDeepError, loads_json


def test_a_repeated_key_keeps_its_last_value_by_default_and_is_refused_with_unique_keys() -> None:
    text = '{"user_id": "u1", "user_id": "u2"}'
    assert loads_json(text) == {"user_id": "u2"} == json.loads(text)
    with pytest.raises(JSONDuplicateKeyError, match="the key 'user_id' is given twice in one object") as refused:
        loads_json(text, unique_keys=True)
    assert isinstance(refused.value, json.JSONDecodeError) and refused.value.pos == text.rindex('"user_id"')


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (b'{"a": [{"b": 1}, {"c": {"d": 1, "d": 1}}]}', "d"),  # the same value twice is still a repetition
        ('[{"k": 1, "k": 2}]', "k"),
        ('{"\\u0075ser": 1, "user": 2}', "user"),  # one of them spelled with an escape: the same key
    ],
)
def test_a_key_repeated_at_any_depth_is_named(text: str | bytes, key: str) -> None:
    with pytest.raises(JSONDuplicateKeyError, match=f"the key {key!r} is given twice"):
        loads_json(text, unique_keys=True)


def test_keys_shared_by_different_objects_are_no_repetition() -> None:
    text = '[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"x": {"role": 1}}]'
    assert loads_json(text, unique_keys=True) == json.loads(text)


def test_nesting_past_the_parser_is_malformed_json_with_or_without_unique_keys() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for unique in (False, True):
        with pytest.raises(JSONTooDeepError, match="nests deeper"):
            loads_json(deep, unique_keys=unique)
