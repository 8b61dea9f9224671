"""Bad input, generated: every public call of the Python API (``add``, ``update``, ``delete``, ``delete_all``,
``get``, ``get_all``, ``search``, ``history``, ``import_memories``) with texts, ids, scope ids, metadata, filters,
counts and Mem0 records drawn from strategies that mix the valid with the malformed (issue 15, Tests: bad-input
fuzzing). Each call runs on a SQLite client and, side by side, a PostgreSQL client holding the same five memories
(:data:`SEED`), and must:

- raise only InferScale's typed errors (:class:`~inferscale.errors.InferScaleError` subclasses), never a raw
  ``TypeError``, ``OverflowError`` or driver error;
- write nothing when it raises: every memory and history row is as before;
- answer the same on both backends: the same error type, or the same result and the same rows stored afterwards
  (ids, timestamps and scores' last digits aside).

Without a PostgreSQL server the calls run on SQLite alone (the report then counts no PostgreSQL case). Chat is left
out: it needs a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, note, target
from hypothesis import strategies as st
from mem0_fakes import HashEmbedder, ScriptedGenerator, facts, fake_config
from property_support import count_case, suite_settings, timed
from sqlalchemy import select

from inferscale import MemoryClient
from inferscale.errors import InferScaleError
from inferscale.scope import MAX_ID_LENGTH
from inferscale.storage.models import HistoryRow, MemoryRow

EXAMPLES = 800
"""Generated calls in CI, each run on every backend."""

# ---- the stored state every call starts from ------------------------------------------------------------------

SEED: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    ("Lives in Lisbon", {"user_id": "u1"}, {"topic": "home", "n": 1, "name": "Étoile"}),
    ("Drinks black coffee", {"user_id": "u1", "agent_id": "a1"}, {"topic": "food", "n": 2.5, "flag": True}),
    ("東京に住んでいる 😀", {"user_id": "u2", "run_id": "r1"}, {"ключ": "ÉTÉ", "n": None, "tags": ["x", "é"]}),
    ("Likes COFFEE in Lisbon", {"user_id": "u1", "run_id": "r1"}, {"name": "été", "n": 2**63, "😀": {"x": 1}}),
    ("Étoile is a café", {"user_id": "u2"}, {"topic": "Lisbon", "n": -1e308, "flag": False, "name": "ÉTOILE"}),
]
UNKNOWN_ID = "00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Ref:
    """The id of seeded memory ``index``: each backend's own id is put in its place before the call."""

    index: int


# ---- strategies ----------------------------------------------------------------------------------------------


def mostly(valid: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` five times in six, else ``odd`` (shrinks towards ``valid``), so that a call most often has at most
    one bad argument among good ones and reaches the code behind the first check."""
    return st.integers(0, 5).flatmap(lambda i: valid if i < 5 else odd)


any_char = st.characters(exclude_categories=())  # surrogates and NUL included
odd_text = st.text(any_char, max_size=20)
words = st.sampled_from(["Lisbon", "lisbon", "coffee", "COFFEE", "Étoile", "étoile", "ÉTÉ", "été", "東京", "😀", "x"])
nice_text = st.lists(words, min_size=1, max_size=4).map(" ".join)
not_str = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(object()),
)
texts = mostly(
    nice_text,
    st.one_of(
        odd_text,
        st.sampled_from(["", " ", "\t\n", "\x00", "a\x00b", "\ud800", "x \udfff y", "\U0001f600"]),
        st.sampled_from([3999, 4000, 4001, 100_000]).map(lambda n: "y" * n),  # max_memory_chars is 4000
        not_str,
    ),
)
scope_id_values = mostly(
    st.sampled_from(["u1", "u2", "a1", "r1", "u1 ", "U1"]),
    st.one_of(
        odd_text,
        st.sampled_from([MAX_ID_LENGTH, MAX_ID_LENGTH + 1, 10_000]).map(lambda n: "u" * n),
        st.sampled_from(["", "  ", "u\x00", "\ud83d"]),
        not_str,
    ),
)
memory_ids = mostly(
    st.one_of(st.builds(Ref, st.integers(0, len(SEED) - 1)), st.just(UNKNOWN_ID)),
    st.one_of(
        odd_text,
        st.sampled_from(["", " ", UNKNOWN_ID + "\x00", "\udc00"]),
        st.sampled_from([36, 37, 10_000]).map(lambda n: "x" * n),
        not_str,
    ),
)


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"leaf": 1}
    for i in range(depth):
        node = {f"k{i}": [node]} if i % 2 else {f"k{i}": node}
    return node


def _cyclic() -> dict[str, Any]:
    node: dict[str, Any] = {"a": 1}
    node["self"] = node
    return node


SEED_KEYS = ["topic", "n", "name", "ключ", "flag", "tags", "missing"]
plain_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([2.5, -0.5, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30, 1e308, 5e-324]),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    words,
)
json_scalars = st.one_of(plain_scalars, st.floats(), odd_text)  # NaN and infinities included
odd_values = st.one_of(
    st.binary(max_size=3),
    st.sampled_from([date(2024, 1, 1), datetime(2024, 1, 1, tzinfo=UTC), {1, 2}, object(), float("nan")]),
)
meta_keys = mostly(
    st.sampled_from([*SEED_KEYS, "😀", "a.b", 'q"', "$.x", "AND"]),
    st.one_of(odd_text, st.sampled_from(["user_id", "run_id", ""]), st.integers(), st.none(), st.tuples(st.integers())),
)
json_values = st.recursive(
    mostly(plain_scalars, st.one_of(json_scalars, odd_values)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(meta_keys, inner, max_size=3),
    max_leaves=8,
)
metadata = mostly(
    st.one_of(st.none(), st.dictionaries(meta_keys, json_values, max_size=4)),
    st.one_of(
        st.sampled_from([63, 64, 65, 200]).map(_nested),  # MAX_JSON_DEPTH is 64
        st.integers(1000, 3000).map(lambda n: {f"k{i}": i for i in range(n)}),
        st.just(_cyclic()),
        st.sampled_from([[], "topic", 1, ("a", 1)]),
    ),
)

timestamps = mostly(
    st.one_of(  # well-typed, some beyond what a datetime holds
        st.sampled_from(["2024-01-01", "2024-01-01T00:00:00Z", "2999-01-01T00:00:00+02:00", "1970-01-01"]),
        st.sampled_from(["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+01:00"]),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([1e300, -1e300, 2**70, 253402300800, -62135596801]),
        st.dates(),
        st.datetimes(timezones=st.sampled_from([None, UTC])),
    ),
    st.sampled_from(["2024-13-01", "yesterday", "", float("nan"), float("inf"), True]),
)
VALID_OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains"]
ID_OPERATORS = ["eq", "ne", "in", "nin", "contains", "icontains"]
TIME_OPERATORS = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"]


def _variants(value: object) -> list[object]:
    """``value`` and, for a string, other spellings a filter may test it with (case changed, cut short)."""
    if not isinstance(value, str):
        return [value]
    return list(dict.fromkeys([value, value.lower(), value.upper(), value.swapcase(), value[1:], value[:-1]]))


def _seed_values() -> dict[str, list[object]]:
    by_key: dict[str, list[object]] = {}
    for _, _, meta in SEED:
        for key, value in meta.items():
            if not isinstance(value, list | dict):
                by_key.setdefault(key, []).extend(_variants(value))
    return by_key


SEED_VALUES_BY_KEY = _seed_values()
SEED_VALUES = [v for values in SEED_VALUES_BY_KEY.values() for v in values]
"""The seeds' scalar metadata values and their variants (by key, and all): operands that match something, or
nearly do."""


@st.composite
def condition(draw: st.DrawFn) -> tuple[Any, Any]:
    """One ``field: condition`` pair: mostly a well-formed test on a stored metadata key, a scope id or a timestamp;
    sometimes an odd field, operator or operand."""
    kind = draw(st.sampled_from(["metadata", "metadata", "metadata", "id", "time"]))
    field_name: Any
    if kind == "metadata":
        field_name = draw(mostly(st.sampled_from(SEED_KEYS), meta_keys))
        value = draw(mostly(st.sampled_from(SEED_VALUES) | plain_scalars, json_scalars | odd_values))
    elif kind == "id":
        field_name, value = draw(st.sampled_from(["user_id", "agent_id", "run_id"])), draw(scope_id_values)
    else:
        field_name, value = draw(st.sampled_from(["created_at", "updated_at"])), draw(timestamps)
    shape = draw(st.sampled_from(["value", "op", "op", "list", "wildcard"]))
    if shape == "value":
        return field_name, value
    if shape == "wildcard":
        return field_name, "*"
    op = draw(mostly(st.sampled_from(VALID_OPERATORS), st.sampled_from(["EQ", "$eq", "like", "", "exists", 1])))
    if shape == "list" or op in ("in", "nin"):
        others = st.sampled_from(SEED_VALUES) | plain_scalars
        value = draw(mostly(st.lists(st.just(value) | others, min_size=1, max_size=3), st.just(value)))
    return field_name, {op: value}


filters = st.recursive(
    st.lists(condition(), min_size=1, max_size=3).map(dict),
    lambda inner: st.builds(
        lambda key, parts, rest: {key: parts, **rest},
        mostly(st.sampled_from(["AND", "OR", "NOT", "$and", "$or", "$not"]), st.just("and")),
        mostly(st.lists(inner, min_size=1, max_size=3), st.one_of(inner, st.just([]), plain_scalars)),
        st.just({}) | inner,
    ),
    max_leaves=6,
)
filter_args = mostly(st.none() | filters, st.sampled_from([{}, [], "user_id", 1, [{"user_id": "u1"}]]))
counts = mostly(
    st.none() | st.integers(0, 8), st.one_of(st.integers(), st.sampled_from([10**6, 10**6 + 1, True, 2.0, "5"]))
)
thresholds = mostly(
    st.none() | st.floats(-1, 1),
    st.one_of(st.floats(), st.sampled_from([True, "0.5"]), st.just(400).map(lambda e: 10**e)),
)
flags = mostly(st.just(False), st.sampled_from([True, None, 0, 1, "yes"]))
encode_flags = mostly(st.sampled_from([False, None]), st.sampled_from([0, 1, "yes"]))  # True would load the model


@st.composite
def scope_kwargs(draw: st.DrawFn, *, required: bool) -> dict[str, Any]:
    """Scope ids as keyword arguments: mostly a valid scope (one that holds a seed memory or none), sometimes odd."""
    out: dict[str, Any] = {}
    if draw(st.integers(0, 3)) < 3:
        out.update(draw(st.sampled_from([ids for _, ids, _ in SEED] + [{"user_id": "u3"}, {"agent_id": "a1"}])))
    for key in ("user_id", "agent_id", "run_id"):
        if draw(st.integers(0, 4)) == 0:
            out[key] = draw(scope_id_values)
    if not required and draw(st.booleans()):
        return {}
    return out


@st.composite
def messages(draw: st.DrawFn) -> Any:
    """What ``add`` is given as ``messages``: a text, or message dicts with odd roles, contents and shapes."""
    message = st.fixed_dictionaries(
        {
            "role": st.one_of(
                st.sampled_from(["user", "assistant"]), st.sampled_from(["system", "tool", "USER", ""]), not_str
            ),
            "content": texts,
        },
        optional={
            "name": st.one_of(nice_text, odd_text, not_str),
            "extra": json_scalars,
        },
    )
    return draw(
        st.one_of(
            texts,
            message,
            st.lists(message, min_size=1, max_size=3),
            st.sampled_from([[], [{}], [{"content": "x"}], ["text"], ({"role": "user", "content": "tuple"},)]),
        )
    )


@dataclass(frozen=True)
class Call:
    """A public method and its arguments (``Ref`` where a seeded memory's id goes)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # a failing example's call, with huge strings cut short
        shown = ", ".join([*(_short(a) for a in self.args), *(f"{k}={_short(v)}" for k, v in self.kwargs.items())])
        return f"{self.method}({shown})"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 300 else f"{text[:150]}...<{len(text)} chars>...{text[-50:]}"


_ABSENT = object()
"""An argument left out of the call."""


def _call(method: str, *args: st.SearchStrategy[Any], **kwargs: st.SearchStrategy[Any]) -> st.SearchStrategy[Call]:
    return st.builds(
        lambda a, k: Call(method, a, {name: v for name, v in k.items() if v is not _ABSENT}),
        st.tuples(*args),
        st.fixed_dictionaries(kwargs),
    )


def _merged(scope: st.SearchStrategy[dict[str, Any]], call: st.SearchStrategy[Call]) -> st.SearchStrategy[Call]:
    return st.builds(lambda c, s: Call(c.method, c.args, {**c.kwargs, **s}), call, scope)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(_ABSENT), strategy)


given_ids = mostly(
    st.one_of(st.uuids(version=4).map(str), st.builds(Ref, st.integers(0, len(SEED) - 1)), st.just(UNKNOWN_ID)),
    st.one_of(memory_ids, st.uuids(version=4).map(lambda u: str(u).upper()), st.uuids(version=1).map(str)),
)
mem0_times = mostly(
    st.one_of(st.none(), st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=-8))])).map(str)),
    timestamps,
)


@st.composite
def mem0_record(draw: st.DrawFn) -> Any:
    """A Mem0 memory as ``import_memories`` takes it: a ``get_all`` result item (``memory``) or a vector store
    payload (``data``), mostly as Mem0 writes one, sometimes with an odd id, time, key or value."""
    record = draw(
        st.fixed_dictionaries(
            {"memory": texts, "id": given_ids},
            optional={
                "created_at": mem0_times,
                "updated_at": mem0_times,
                "metadata": metadata,
                "role": mostly(st.sampled_from(["user", "assistant"]), st.one_of(odd_text, not_str)),
                "actor_id": mostly(nice_text, st.one_of(odd_text, not_str)),
                "hash": st.just("d41d8cd98f00b204e9800998ecf8427e"),
                "expiration_date": mostly(st.sampled_from([None, "2020-01-01"]), st.one_of(timestamps, odd_text)),
            },
        )
    )
    if draw(st.integers(0, 5)) == 0:  # a key Mem0's records do not have (its platform's), or none at all
        record = draw(st.sampled_from([{**record, "owner": "o"}, {k: v for k, v in record.items() if k != "id"}]))
    record = {**draw(scope_kwargs(required=True)), **record}
    if draw(st.booleans()):  # a payload: the text under "data", the metadata's keys beside Mem0's own
        text, meta = record.pop("memory"), record.pop("metadata", None)
        record = {**(meta if isinstance(meta, dict) else {}), **record, "data": text}
    return draw(mostly(st.just(record), st.one_of(not_str, odd_text)))


@st.composite
def mem0_history(draw: st.DrawFn, records: Any) -> Any:
    """Mem0 history rows for ``records``: mostly each one's ADD, sometimes an UPDATE from another text to its
    text after it; sometimes a row Mem0 would not write for it (a DELETE, another event, no time, odd values, an
    unknown key), or not a list at all."""
    rows: list[Any] = []
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict) or "id" not in record:
            continue
        text = record.get("memory", record.get("data"))
        first = draw(st.one_of(st.just(text), nice_text))
        row = {"memory_id": record["id"], "event": "ADD", "old_memory": None, "new_memory": first}
        rows.append({**row, "id": draw(st.uuids(version=4).map(str)), "created_at": draw(mem0_times)})
        if first != text:
            updated = {"event": "UPDATE", "old_memory": first, "new_memory": text, "updated_at": draw(mem0_times)}
            rows.append({**row, **updated, "created_at": rows[-1]["created_at"]})
        if draw(st.integers(0, 5)) == 0:
            rows[-1] = draw(
                st.sampled_from(
                    [
                        {**rows[-1], "event": "DELETE", "new_memory": None},
                        {**rows[-1], "event": "MERGE"},
                        {**rows[-1], "created_at": None, "updated_at": None},
                        {**rows[-1], "actor_id": draw(st.one_of(odd_text, not_str))},
                        {**rows[-1], "score": 1},
                        {**rows[-1], 1: "a key that is not a str"},
                    ]
                )
            )
    return draw(mostly(st.just(rows), st.one_of(not_str, odd_text, st.just({"rows": rows}))))


@st.composite
def imports(draw: st.DrawFn) -> Call:
    """An ``import_memories`` call, half of them with Mem0's history of the records."""
    records = draw(mostly(st.lists(mem0_record(), max_size=3), st.one_of(not_str, odd_text, st.just({"results": "x"}))))
    history = {"history": draw(mem0_history(records))} if draw(st.booleans()) else {}
    return Call("import_memories", (records,), history)


calls = st.one_of(
    imports(),
    _merged(
        scope_kwargs(required=True),
        _call("add", messages(), metadata=metadata, infer=flags, encode_kv=_maybe(encode_flags)),
    ),
    _merged(
        scope_kwargs(required=False),
        _call("update", memory_ids, text=_maybe(texts), metadata=_maybe(metadata), data=_maybe(texts)),
    ),
    _merged(scope_kwargs(required=False), _call("delete", memory_ids)),
    _merged(scope_kwargs(required=True), _call("delete_all")),
    _merged(scope_kwargs(required=False), _call("get", memory_ids)),
    _merged(scope_kwargs(required=False), _call("history", memory_ids)),
    _merged(scope_kwargs(required=False), _call("get_all", filters=filter_args, limit=counts, top_k=_maybe(counts))),
    _merged(
        scope_kwargs(required=False),
        _call("search", texts, filters=filter_args, limit=counts, top_k=_maybe(counts), threshold=thresholds),
    ),
)


# ---- the backends --------------------------------------------------------------------------------------------

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


class Backend:
    """One client on one database, holding :data:`SEED`; results and rows read with ids named by role (seed
    ``m0``.., then new ids in order of appearance) and without timestamps, so two backends' can be compared."""

    def __init__(self, name: str, client: MemoryClient) -> None:
        self.name = name
        self.client = client
        self.ids: list[str] = []

    def restore(self) -> None:
        """Empty the store and add the seed memories again."""
        self.client.reset()
        self.ids = [
            self.client.add(text, metadata=meta, infer=False, **ids)["results"][0]["id"] for text, ids, meta in SEED
        ]

    def resolve(self, value: Any) -> Any:
        """``value`` with each :class:`Ref` replaced by this backend's id; in a list of records or history rows
        (what ``import_memories`` takes), each one's ``id`` and ``memory_id`` too."""
        if isinstance(value, Ref):
            return self.ids[value.index]
        if isinstance(value, list):
            named = ("id", "memory_id")
            return [
                {k: self.resolve(x) if k in named else x for k, x in v.items()} if isinstance(v, dict) else v
                for v in value
            ]
        return value

    def run(self, call: Call) -> tuple[str, Any]:
        """``("ok", normalised result)`` or ``("error", the InferScale error's class name)``."""
        args = [self.resolve(a) for a in call.args]
        kwargs = {k: self.resolve(v) for k, v in call.kwargs.items()}
        try:
            result = getattr(self.client, call.method)(*args, **kwargs)
        except InferScaleError as exc:  # anything else fails the test, with the call that raised it
            return "error", type(exc).__name__
        return "ok", self.normalised(result, {})

    def rows(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Every memory (by insertion) and history row (by id), ids named as in :meth:`normalised`."""
        names: dict[str, str] = {}
        with self.client.db.engine.connect() as conn:
            memories = conn.execute(
                select(
                    MemoryRow.id,
                    MemoryRow.text,
                    MemoryRow.hash,
                    MemoryRow.user_id,
                    MemoryRow.agent_id,
                    MemoryRow.run_id,
                    MemoryRow.metadata_,
                    MemoryRow.context,
                ).order_by(MemoryRow.pk)
            ).all()
            history = conn.execute(
                select(
                    HistoryRow.memory_id,
                    HistoryRow.event,
                    HistoryRow.old_text,
                    HistoryRow.new_text,
                    HistoryRow.old_metadata,
                    HistoryRow.new_metadata,
                    HistoryRow.actor,
                ).order_by(HistoryRow.id)
            ).all()
        return (
            [self.normalised(tuple(r), names) for r in memories],
            [self.normalised(tuple(r), names) for r in history],
        )

    def normalised(self, value: Any, names: dict[str, str]) -> Any:
        """``value`` with memory ids renamed (``m<i>`` for a seed, ``new<k>`` for others in order of appearance),
        timestamps and history row numbers (a sequence on PostgreSQL) left out, scores rounded to 5 decimals, and
        bools and floats tagged with their type (Python's ``==`` calls ``True`` equal to ``1`` and ``1.0``)."""
        if isinstance(value, str):
            if value in self.ids:
                return f"m{self.ids.index(value)}"
            if _UUID.fullmatch(value):
                return names.setdefault(value, f"new{len(names)}")
            return value
        if isinstance(value, dict):
            return {
                k: self.normalised(round(v, 5) if k == "score" else v, names)
                for k, v in value.items()
                if k not in ("created_at", "updated_at") and not (k == "id" and "memory_id" in value)
            }
        if isinstance(value, list | tuple):
            return type(value)(self.normalised(v, names) for v in value)
        if isinstance(value, bool | float):
            return f"<{type(value).__name__} {value!r}>"
        return value


@pytest.fixture
def backends(tmp_path: Path, postgres_url_or_none: str | None) -> Iterator[list[Backend]]:
    """SQLite and, when a server answers, PostgreSQL: one client each on the suite's fakes, seeded. Extraction
    (``infer=True``) answers one fact."""
    urls = {"sqlite": f"sqlite:///{tmp_path}/sqlite/memory.db"}
    if postgres_url_or_none is not None:
        urls["postgres"] = postgres_url_or_none
    built = [
        Backend(
            name,
            MemoryClient(
                fake_config(tmp_path / name, url),
                embedder=HashEmbedder(),
                generator=ScriptedGenerator(facts=facts("Likes green tea")),
            ),
        )
        for name, url in urls.items()
    ]
    for backend in built:
        backend.restore()
    yield built
    for backend in built:
        backend.client.close()


def test_bad_input_gets_a_typed_error_writes_nothing_and_answers_alike_on_both_backends(
    backends: list[Backend],
) -> None:
    @suite_settings(EXAMPLES)
    @given(call=calls)
    def check(call: Call) -> None:
        note(f"call: {call!r}")
        outcomes: list[tuple[str, Any, Any, Any]] = []  # (kind, value, rows before, rows after) per backend
        try:
            for backend in backends:
                with timed("fuzz", backend.name):
                    before = backend.rows()
                    kind, value = backend.run(call)
                    after = backend.rows()
                outcomes.append((kind, value, before, after))
                count_case("fuzz: calls", backend.name)
                count_case(f"fuzz: {'accepted' if kind == 'ok' else f'refused with {value}'}", backend.name)
                if call.method == "import_memories":
                    outcome = "accepted" if kind == "ok" else "refused"
                    count_case(f"fuzz: imports {outcome}", backend.name)
                    if "history" in call.kwargs:
                        count_case(f"fuzz: imports with history {outcome}", backend.name)
                if kind == "error":
                    assert after == before, f"{backend.name}: {call!r} raised {value} after writing"
            (kind, value, _, after), *others = outcomes
            for backend, (other_kind, other_value, _, other_after) in zip(backends[1:], others, strict=True):
                assert (other_kind, other_value) == (kind, value), (
                    f"{call!r}: {backends[0].name} gives {kind} {value!r}, {backend.name} {other_kind} {other_value!r}"
                )
                assert other_after == after, f"{call!r} stored different rows on {backend.name}"
        finally:  # the next call starts from the seed again (a backend that raised something untyped, always)
            for i, backend in enumerate(backends):
                if i >= len(outcomes) or outcomes[i][2] != outcomes[i][3]:
                    with timed("fuzz", backend.name):
                        backend.restore()

    check()


seed_strings = st.sampled_from([v for v in SEED_VALUES if isinstance(v, str)]) | words
seed_scalars = st.sampled_from(SEED_VALUES) | plain_scalars
id_values = st.sampled_from(["u1", "u2", "a1", "r1", "U1", "u", "1"])
time_values = st.one_of(
    st.sampled_from(["2024-01-01", "2999-01-01T00:00:00+02:00", "1970-01-01T00:00:00Z"]),
    st.integers(0, 2**33),
    st.dates(),
    st.datetimes(timezones=st.just(UTC)),
)


@st.composite
def valid_condition(draw: st.DrawFn) -> tuple[str, Any]:
    """A well-formed ``field: condition`` pair, on a seeded metadata key (mostly), a scope id or a timestamp."""
    kind = draw(st.sampled_from(["metadata", "metadata", "metadata", "id", "time"]))
    if kind == "metadata":
        key, ops = draw(st.sampled_from(SEED_KEYS)), VALID_OPERATORS
        value = st.sampled_from(SEED_VALUES_BY_KEY.get(key, SEED_VALUES)) | seed_scalars
    elif kind == "id":
        key, ops, value = draw(st.sampled_from(["user_id", "agent_id", "run_id"])), ID_OPERATORS, id_values
    else:
        key, ops, value = draw(st.sampled_from(["created_at", "updated_at"])), TIME_OPERATORS, time_values
    op = draw(st.sampled_from([*ops, "value", "*"]))
    if op == "value":
        return key, draw(value)
    if op == "*":
        return key, "*"
    if op in ("in", "nin"):
        return key, {op: draw(st.lists(value, min_size=1, max_size=4))}
    if op in ("contains", "icontains"):
        strings = [v for v in SEED_VALUES_BY_KEY.get(key, []) if isinstance(v, str)]
        needles = (st.sampled_from(strings) | seed_strings) if strings else seed_strings
        return key, {op: draw(needles if kind == "metadata" else id_values)}
    operand = draw(value)
    if op in ("gt", "gte", "lt", "lte") and (operand is None or isinstance(operand, bool)):
        operand = draw(seed_strings)
    return key, {op: operand}


one_condition = valid_condition().map(lambda pair: dict([pair]))
valid_filters = one_condition | st.recursive(
    one_condition | st.lists(valid_condition(), min_size=2, max_size=2).map(dict),
    lambda inner: st.builds(
        lambda key, parts: {key: parts},
        st.sampled_from(["AND", "OR", "NOT", "$and", "$or", "$not"]),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=4,
)


@st.composite
def filter_reads(draw: st.DrawFn) -> Call:
    """A ``get_all`` or ``search`` of a seeded scope (or of the scope its filter names) with a generated filter:
    mostly well-formed, so that the two backends' answers are compared on what they match."""
    scope = draw(st.sampled_from([ids for _, ids, _ in SEED] + [{"user_id": "u1"}, {}]))
    f = draw(mostly(valid_filters, filters))
    if not scope:
        f = {**f, "user_id": draw(st.sampled_from(["u1", "u2"]))}
    if draw(st.booleans()):
        return Call("get_all", (), {"filters": f, **scope})
    return Call("search", (draw(nice_text),), {"filters": f, "limit": 10, **scope})


FILTER_EXAMPLES = 800
"""Generated filtered reads in CI, each run on every backend."""


def test_filters_answer_alike_on_both_backends(backends: list[Backend]) -> None:
    """Generated filters on the seeded memories (strings in several cases and scripts, big and small numbers,
    booleans, null, lists, objects): the same memories, or the same typed error, on every backend."""

    @suite_settings(FILTER_EXAMPLES)
    @given(call=filter_reads())
    def check(call: Call) -> None:
        note(f"call: {call!r}")
        outcomes = []
        for backend in backends:
            with timed("fuzz filters", backend.name):
                outcomes.append(backend.run(call))
            count_case("fuzz filters: reads", backend.name)
            count_case(f"fuzz filters: {'answered' if outcomes[-1][0] == 'ok' else 'refused'}", backend.name)
        # steer towards filters that match something: a filter that matches nothing anywhere shows no difference
        target(float(max(len(value["results"]) if kind == "ok" else 0 for kind, value in outcomes)))
        for backend, outcome in zip(backends[1:], outcomes[1:], strict=True):
            assert outcome == outcomes[0], f"{call!r}: {backends[0].name} {outcomes[0]}, {backend.name} {outcome}"

    check()
