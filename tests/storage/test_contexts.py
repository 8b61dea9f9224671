"""Stored contexts keep only texts their scope still holds (:mod:`inferscale.storage.contexts`), on SQLite and
PostgreSQL: the scrub after a delete or re-wording, the neighbour check of an add, and what both leave alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferscale.errors import InvalidInputError
from inferscale.scope import Scope
from inferscale.storage import ChangeSet, MemoryStore, MemoryUpdate, NewMemory
from inferscale.storage.change_sets import validate_changes

U1 = Scope(user_id="u1")
U1_A1 = Scope(user_id="u1", agent_id="a1")
ODD = 'A: code "12%_34" \\ café 😀 \u00e9'
"""A text whose JSON and LIKE forms need escaping (quotes, a backslash, ``%``, ``_``, non-ASCII, an emoji)."""


@pytest.fixture
def store(db_url: str) -> Iterator[MemoryStore]:
    """A store on each backend (SQLite file, fresh PostgreSQL schema; see ``db_url`` in conftest.py)."""
    store = MemoryStore(db_url)
    yield store
    store.close()


def add(store: MemoryStore, scope: Scope, text: str, *context: str, neighbours: int | None = None) -> str:
    """Add ``text`` as ``add`` does (a change set; every context entry a neighbour unless told); its id."""
    n = len(context) if neighbours is None else neighbours
    (added,) = store.apply(ChangeSet(scope, adds=(NewMemory(text, context=context, neighbours=n),))).added
    return added.id


def contexts(store: MemoryStore, *ids: str) -> list[list[str]]:
    return [store.get(i).context for i in ids]  # type: ignore[union-attr]


def test_a_deleted_text_leaves_the_contexts_of_exactly_its_scope_and_their_kv_entries(store: MemoryStore) -> None:
    a = add(store, U1, ODD)
    b = add(store, U1, "B", ODD, "user: my code is 12%_34", neighbours=1)  # a rendered turn after the neighbour
    c = add(store, U1, "C", ODD, "B")
    twin = add(store, U1_A1, ODD)  # the same text in another exact scope, and a memory encoded after it there
    d = add(store, U1_A1, "D", ODD)
    for memory_id in (b, c, d):
        store.put_kv_entry(memory_id, "h", "fp", "key", n_tokens=3, nbytes=12, location="f")

    applied = store.apply(ChangeSet(None, deletes=(a,), strict=True))

    assert contexts(store, b, c, d) == [["user: my code is 12%_34"], ["B"], [ODD]]
    assert sorted(r.id for r in applied.recontexted) == sorted([b, c])
    assert [r.context for r in sorted(applied.recontexted, key=lambda r: r.vector_id)] == contexts(store, b, c)
    assert [store.get_kv_entry(i, "fp", "key") is None for i in (b, c, d)] == [True, True, False]
    assert store.get(twin) is not None and [e.event for e in store.history(b)] == ["ADD"]  # no history row


def test_a_reworded_text_leaves_the_contexts_unless_another_memory_of_the_scope_still_holds_it(
    store: MemoryStore,
) -> None:
    a = add(store, U1, "likes coffee")
    b = add(store, U1, "B", "likes coffee")
    applied = store.apply(ChangeSet(None, updates=(MemoryUpdate(a, "likes green tea"),), strict=True))
    assert contexts(store, b) == [[]] and [r.id for r in applied.recontexted] == [b]  # the new text is not put in

    kept = store.add("lives in Porto", U1)  # the store's own add keeps duplicates: two memories hold the text
    store.add("lives in Porto", U1)
    e = add(store, U1, "E", "lives in Porto")
    assert store.apply(ChangeSet(None, deletes=(kept.id,), strict=True)).recontexted == []
    assert contexts(store, e) == [["lives in Porto"]]


def test_an_adds_neighbour_deleted_before_it_is_written_is_dropped(store: MemoryStore) -> None:
    """The neighbours are read before the transaction; one deleted meanwhile (another thread or process) must not
    slip into the new memory's context, nor one deleted by the same change set (a reconcile DELETE plus ADD)."""
    a = add(store, U1, "A")
    b = add(store, U1, "B", "A")
    store.delete(a)
    late = add(store, U1, "C", "A", "B", "user: hi", "D", neighbours=2)  # "D": a rendered turn, kept as given
    assert contexts(store, late) == [["B", "user: hi", "D"]]

    both = ChangeSet(U1, adds=(NewMemory("E", context=("B", "C"), neighbours=2),), deletes=(b,))
    (e,) = store.apply(both).added
    assert e.context == ["C"] and contexts(store, late) == [["user: hi", "D"]]

    turns = ChangeSet(U1, adds=(NewMemory("F"), NewMemory("G", context=("E", "F"), neighbours=2)))
    assert [r.context for r in store.apply(turns).added] == [[], ["E", "F"]]  # F: added earlier in the same set


def test_neighbours_are_checked_with_the_change_set() -> None:
    for bad in (-1, 3, True, 1.0):
        with pytest.raises(InvalidInputError, match="neighbours"):
            validate_changes(ChangeSet(U1, adds=(NewMemory("x", context=("a", "b"), neighbours=bad),)))  # type: ignore[arg-type]


def chained(store: MemoryStore, scope: Scope, text: str, context: tuple[str, ...], chain_from: int) -> str:
    """Add ``text`` in a bounded chain (every context entry a neighbour); its id."""
    new = NewMemory(text, context=context, neighbours=len(context), chain_from=chain_from)
    (added,) = store.apply(ChangeSet(scope, adds=(new,))).added
    return added.id


def chains(store: MemoryStore, *ids: str) -> list[tuple[list[str], int | None]]:
    return [(r.context, r.chain_from) for r in (store.get(i) for i in ids) if r is not None]


def test_a_scrub_moves_each_chain_start_back_by_the_turns_it_removes_before_it(store: MemoryStore) -> None:
    """An anchor "C" after the turns "A" and "B", then "D" and "E" chained on it: deleting a turn of the anchor's
    moves every chain start back; deleting a chained memory leaves them (its text is past the start)."""
    a, b = add(store, U1, "A"), add(store, U1, "B", "A")
    c = chained(store, U1, "C", ("A", "B"), 2)
    d = chained(store, U1, "D", ("A", "B", "C"), 2)
    e = chained(store, U1, "E", ("A", "B", "C", "D"), 2)
    plain = add(store, U1, "F", "A", "B")  # in no chain: its start stays None
    store.apply(ChangeSet(None, deletes=(a,), strict=True))
    assert chains(store, b, c, d, e, plain) == [
        ([], None),
        (["B"], 1),
        (["B", "C"], 1),
        (["B", "C", "D"], 1),
        (["B"], None),
    ]
    store.apply(ChangeSet(None, deletes=(d,), strict=True))
    assert chains(store, c, e) == [(["B"], 1), (["B", "C"], 1)]
    store.apply(ChangeSet(None, updates=(MemoryUpdate(c, "C2"),), strict=True))  # re-worded: its old text goes
    assert chains(store, c, e) == [(["B"], 1), (["B"], 1)]


def test_an_adds_chain_start_moves_back_by_the_neighbours_dropped_before_it(store: MemoryStore) -> None:
    a = add(store, U1, "A")
    add(store, U1, "B", "A")
    c = chained(store, U1, "C", ("A", "B"), 2)
    store.delete(a)
    late = chained(store, U1, "D", ("A", "B", "C"), 2)  # read before "A" was deleted
    assert chains(store, late) == [(["B", "C"], 1)]
    assert chains(store, c) == [(["B"], 1)]


@pytest.mark.parametrize(
    ("new", "message"),
    [
        (NewMemory("x", context=("a", "b"), neighbours=2, chain_from=3), "chain_from is 3 with 2 context turns"),
        (NewMemory("x", context=("a", "b"), neighbours=1, chain_from=1), "of which 1 are neighbours"),
        (NewMemory("x", context=("a",), neighbours=1, chain_from=-1), "chain_from must be a non-negative int"),
        (NewMemory("x", context=("a",), neighbours=1, chain_from=True), "chain_from must be a non-negative int"),  # type: ignore[arg-type]
    ],
)
def test_a_chain_start_outside_the_context_or_over_turns_that_are_not_neighbours_is_refused(
    store: MemoryStore, new: NewMemory, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        store.apply(ChangeSet(U1, adds=(new,)))
    assert store.list(U1) == []
