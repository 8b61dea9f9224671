"""``icontains`` folds case alike on SQLite and PostgreSQL, for any script (found by the bad-input fuzzing in
tests/properties: ``{"ключ": {"icontains": "ÉTÉ"}}`` missed the stored ``"ÉTÉ"`` on SQLite, whose ``lower()`` folds
ASCII only, and found it on PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferscale.filters import parse_filters
from inferscale.scope import Scope
from inferscale.storage import MemoryStore
from inferscale.storage.case_fold import fold, fold_table

SCOPE = Scope(user_id="u")

STORED = ["ÉTÉ", "Étoile", "ΣΟΦΊΑ", "İstanbul", "Straße", "МОСКВА", "plain ASCII", "東京 😀"]

# (needle, the stored texts it must find): the same answer on both backends
CASES: list[tuple[str, list[str]]] = [
    ("été", ["ÉTÉ"]),
    ("ÉTÉ", ["ÉTÉ"]),  # the fuzzer's input: the stored text itself
    ("étoile", ["Étoile"]),
    ("ÉTOILE", ["Étoile"]),
    ("σοφία", ["ΣΟΦΊΑ"]),
    ("istanbul", ["İstanbul"]),  # İ folds to i (its simple lowercase)
    ("STRASSE", []),  # no full folding: ß is not ss
    ("STRASS", []),
    ("STRAẞE", ["Straße"]),  # capital sharp s folds to ß
    ("москва", ["МОСКВА"]),
    ("ASCII", ["plain ASCII"]),
    ("東京 😀", ["東京 😀"]),
    ("T", ["ÉTÉ", "Étoile", "İstanbul", "Straße"]),
]


@pytest.fixture
def store(db_url: str) -> Iterator[MemoryStore]:
    """Each text stored twice: as metadata ``{"k": text}`` in scope u, and as the user id of a memory of agent g."""
    store = MemoryStore(db_url)
    for text in STORED:
        store.add(text, SCOPE, {"k": text})
        store.add(text, Scope(user_id=text, agent_id="g"))
    yield store
    store.close()


def test_icontains_folds_any_script_alike_on_both_backends(store: MemoryStore) -> None:
    wrong = {}
    for needle, expected in CASES:
        on_metadata = parse_filters({"k": {"icontains": needle}})
        on_user_id = parse_filters({"user_id": {"icontains": needle}})
        got = {
            "metadata": [m.text for m in store.list(SCOPE, filters=on_metadata)],
            "user_id": [m.user_id for m in store.list(Scope(agent_id="g"), filters=on_user_id)],
        }
        if got != {"metadata": expected, "user_id": expected}:
            wrong[needle] = got
    assert wrong == {}


def test_the_fold_table_covers_every_cased_character() -> None:
    """The table scans planes 0 and 1 only; every character above them is its own lowercase."""
    assert all(chr(c).lower() == chr(c) for c in range(0x20000, 0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert len(fold_table()) > 1400
    assert fold("ÀÉÎÕÜ ΣΑΣ İ ẞ Ǆ") == "àéîõü σασ i ß ǆ"
    assert all(len(fold(chr(c))) == 1 for c in fold_table())  # one character each: positions stay put
