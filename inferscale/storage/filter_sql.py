"""Compile a parsed filter tree (:mod:`inferscale.filters`) into a SQL ``WHERE`` clause on ``memories``.

The same tree compiles for SQLite (``json_each``) and PostgreSQL (``json_typeof``/``->``/``->>``). A metadata key is
always a bound parameter compared with the keys as the database decodes them, never text spliced into a JSON path:
SQLite's path labels match a key's stored (escaped) spelling, so ``$."café"`` misses the key stored as
``"caf\\u00e9"`` and no path can spell a key holding ``"``. Metadata values are compared by JSON type: a string
operand only matches JSON strings, a number only JSON numbers, a bool only JSON booleans, ``None`` only JSON null.
On PostgreSQL, casts are guarded by ``CASE`` so that a row whose value has another type never reaches a cast (it would
raise on ``CAST('abc' AS FLOAT)``). ``NOT``, ``ne`` and ``nin`` are two-valued: a memory that lacks the field is
"not equal". ``icontains`` folds case with one table on both backends (:mod:`inferscale.storage.case_fold`), never
with SQL's ``lower()``.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement, Float, Numeric, and_, case, cast, false, func, not_, null, or_, select, true
from sqlalchemy.sql.elements import KeyedColumnElement

from inferscale.filters import And, Condition, FieldValue, Filter, Not, Or
from inferscale.storage.case_fold import SQLITE_FUNCTION, fold, fold_pairs
from inferscale.storage.models import MemoryRow

_T = TypeVar("_T")

_COLUMNS: dict[str, KeyedColumnElement[object]] = {
    "user_id": MemoryRow.__table__.c.user_id,
    "agent_id": MemoryRow.__table__.c.agent_id,
    "run_id": MemoryRow.__table__.c.run_id,
    "created_at": MemoryRow.__table__.c.created_at,
    "updated_at": MemoryRow.__table__.c.updated_at,
}


def compile_filter(node: Filter, dialect: str) -> ColumnElement[bool]:
    """The SQL condition of ``node`` for the dialect named ``dialect`` (``"sqlite"`` or ``"postgresql"``).

    Returns:
        A boolean SQLAlchemy expression to put in ``select(MemoryRow).where(...)``.

    Raises:
        ValueError: for a dialect other than SQLite or PostgreSQL (metadata filters need its JSON functions).
    """
    if dialect not in ("sqlite", "postgresql"):
        raise ValueError(f"filters are compiled for sqlite and postgresql, not {dialect!r}")
    return _compile(node, dialect)


def _compile(node: Filter, dialect: str) -> ColumnElement[bool]:
    if isinstance(node, And):
        return and_(*(_compile(p, dialect) for p in node.parts))
    if isinstance(node, Or):
        return or_(*(_compile(p, dialect) for p in node.parts))
    if isinstance(node, Not):
        return not_(_definite(_compile(node.part, dialect)))
    if node.kind == "metadata":
        return _metadata(node, dialect)
    return _column(node, dialect)


def _definite(expr: ColumnElement[bool]) -> ColumnElement[bool]:
    """``expr`` with SQL's unknown (NULL) turned into false, so that negation is two-valued."""
    return case((expr, true()), else_=false())


# ---- columns (scope ids, timestamps) ---------------------------------------------------------------------


def _column(cond: Condition, dialect: str) -> ColumnElement[bool]:
    col = _COLUMNS[cond.field]
    op, value = cond.op, cond.value
    if op == "exists":
        return col.is_not(None)
    if op == "eq":
        return col == value
    if op == "ne":
        return or_(col.is_(None), col != value)
    if op == "in":
        return col.in_(_operands(cond))
    if op == "nin":
        return or_(col.is_(None), col.not_in(_operands(cond)))
    if op in ("contains", "icontains"):
        return _contains(col, str(value), dialect, op == "icontains")
    return _compare(col, op, value)


def _operands(cond: Condition) -> tuple[FieldValue, ...]:
    """The value list of an ``in``/``nin`` condition (the parser always stores a tuple there)."""
    if not isinstance(cond.value, tuple):
        raise TypeError(f"{cond.field} {cond.op} needs a tuple of values, got {cond.value!r}")
    return cond.value


def _compare(expr: ColumnElement[_T], op: str, value: object) -> ColumnElement[bool]:
    if op == "gt":
        return expr > value
    if op == "gte":
        return expr >= value
    if op == "lt":
        return expr < value
    if op == "lte":
        return expr <= value
    raise AssertionError(f"not a comparison: {op}")


def _code_point_order(expr: ColumnElement[Any], dialect: str) -> ColumnElement[Any]:
    """``expr`` ordered by code point, as SQLite's default ``BINARY`` collation orders text: ``COLLATE "C"`` on
    PostgreSQL, whose own order is the database's collation (an ICU ``en-US`` one put ``"B"`` between ``"a"`` and
    ``"c"``, so ``{"gt": "B"}`` left out ``"a"`` there and kept it on SQLite: a tester's find)."""
    return expr.collate("C") if dialect == "postgresql" else expr


def _contains(expr: ColumnElement[Any], needle: str, dialect: str, fold_case: bool) -> ColumnElement[bool]:
    if fold_case:
        expr, needle = _folded(expr, dialect), fold(needle)
    position = func.strpos(expr, needle) if dialect == "postgresql" else func.instr(expr, needle)
    return position > 0


def _folded(expr: ColumnElement[Any], dialect: str) -> ColumnElement[Any]:
    """``expr`` case-folded as :func:`~inferscale.storage.case_fold.fold` folds the needle: ``translate`` on
    PostgreSQL, the registered Python function on SQLite (never SQL's ``lower``, which differs by backend and
    locale)."""
    if dialect == "postgresql":
        upper, lower = fold_pairs()
        return func.translate(expr, upper, lower)
    folded: ColumnElement[Any] = getattr(func, SQLITE_FUNCTION)(expr)  # func.<name> is built by attribute access
    return folded


# ---- metadata (JSON) -------------------------------------------------------------------------------------


def _kind(key: str, dialect: str) -> ColumnElement[str]:
    """The JSON type name of ``metadata[key]`` (NULL when the key is missing). The names differ by dialect:
    PostgreSQL's ``json_typeof`` says object array string number boolean null, SQLite's ``json_each`` object
    array text integer real true false null."""
    if dialect == "postgresql":
        return func.json_typeof(MemoryRow.metadata_[key])
    return _sqlite_member(key, "type")


def _sqlite_member(key: str, column: Literal["type", "value"], types: tuple[str, ...] = ()) -> ColumnElement[Any]:
    """A correlated scalar subquery: the ``column`` of the top-level member ``key`` of the row's metadata, from
    SQLite's ``json_each`` (whose ``key`` is the decoded member name and ``value`` the SQL value: text, integer or
    real for scalars); NULL when there is no such member or its type is not one of ``types`` (any when empty)."""
    member = func.json_each(MemoryRow.metadata_).table_valued("key", "value", "type")
    found = select(member.c[column]).where(member.c.key == key)
    if types:
        found = found.where(member.c.type.in_(types))
    return found.limit(1).scalar_subquery()


def _is(key: str, json_type: str, dialect: str) -> ColumnElement[bool]:
    kind = _kind(key, dialect)
    if json_type == "number":
        return kind == "number" if dialect == "postgresql" else kind.in_(("integer", "real"))
    if json_type == "string":
        return kind == ("string" if dialect == "postgresql" else "text")
    if json_type == "null":
        return kind == "null"
    raise AssertionError(json_type)


def _as_text(key: str, dialect: str) -> ColumnElement[str]:
    """``metadata[key]`` when it is a JSON string, else NULL."""
    if dialect == "postgresql":
        return case((_is(key, "string", dialect), MemoryRow.metadata_[key].as_string()), else_=null())
    return _sqlite_member(key, "value", ("text",))


INTEGER_TEXT = "^-?[0-9]+$"
"""The JSON text of an integer (what :func:`json.loads` reads as an ``int``); any other number is a real."""


def _by(expr: ColumnElement[Any], op: str, value: object) -> ColumnElement[bool]:
    """``expr`` against ``value`` by ``op``: ``eq`` or a comparison."""
    return expr == value if op == "eq" else _compare(expr, op, value)


def _as_double(op: str, operand: int | float) -> tuple[str, float] | None:
    """``op`` and ``operand`` rewritten so that comparing a double with the returned float answers what comparing it
    with ``operand`` exactly does, or ``None`` when no double equals ``operand`` (``eq`` is then never true). Only an
    integer beyond 2**53 needs it: ``float(operand)`` is the nearest double, and no double lies between the two, so
    ``d < operand`` is ``d <= float(operand)`` when the float is below the integer, and ``d < float(operand)``
    otherwise (likewise for the other comparisons)."""
    nearest = float(operand)
    if nearest == operand:
        return op, nearest
    if op == "eq":
        return None
    below = nearest < operand
    rewritten = {"lt": "lte" if below else "lt", "lte": "lte" if below else "lt"}
    rewritten |= {"gt": "gt" if below else "gte", "gte": "gt" if below else "gte"}
    return rewritten[op], nearest


def _pg_numbers(key: str) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """PostgreSQL: ``metadata[key]`` as ``(integer, real)``: the first its JSON text read as ``numeric`` when that
    text is an integer's (:data:`INTEGER_TEXT`), the second read as a double when it is any other number; each NULL
    otherwise."""
    text = MemoryRow.metadata_[key].as_string()
    number = _is(key, "number", "postgresql")
    integral = text.op("~", is_comparison=True)(INTEGER_TEXT)
    integer = case((and_(number, integral), cast(text, Numeric)), else_=null())
    real = case((and_(number, not_(integral)), cast(text, Float)), else_=null())
    return integer, real


def _number_is(key: str, dialect: str, op: str, operand: int | float) -> ColumnElement[bool]:
    """``metadata[key]`` is a JSON number and compares with ``operand`` by ``op`` (``eq``, ``gt``, ``gte``, ``lt``,
    ``lte``) as Python compares an int or float read from its JSON with ``operand``: exactly, also beyond 2**53
    where a double rounds integers. SQLite's ``json_each`` gives integers as 64-bit integers and reals as doubles,
    and compares the two exactly. PostgreSQL reads an integer's JSON text as ``numeric`` (against the exact value of
    ``operand``) and a real's as a double (against :func:`_as_double`)."""
    if dialect != "postgresql":
        return _by(_sqlite_member(key, "value", ("integer", "real")), op, operand)
    integer, real = _pg_numbers(key)
    exact = _by(integer, op, Decimal(operand))
    as_double = _as_double(op, operand)
    return exact if as_double is None else or_(exact, _by(real, *as_double))


def _number_in(key: str, dialect: str, numbers: list[int | float]) -> ColumnElement[bool]:
    """``metadata[key]`` is a JSON number equal to one of ``numbers`` (exactly, as :func:`_number_is`): one SQL
    ``IN`` per kind of stored number."""
    if dialect != "postgresql":
        return _sqlite_member(key, "value", ("integer", "real")).in_(numbers)
    integer, real = _pg_numbers(key)
    exact = integer.in_([Decimal(v) for v in numbers])
    doubles = [float(v) for v in numbers if float(v) == v]  # an integer no double holds equals no real
    return or_(exact, real.in_(doubles)) if doubles else exact


def _equals(key: str, value: object, dialect: str) -> ColumnElement[bool]:
    if value is None:
        return _is(key, "null", dialect)
    if isinstance(value, bool):
        if dialect == "postgresql":
            return and_(_kind(key, dialect) == "boolean", MemoryRow.metadata_[key].as_string() == str(value).lower())
        return _kind(key, dialect) == ("true" if value else "false")
    if isinstance(value, int | float):
        return _number_is(key, dialect, "eq", value)
    return _as_text(key, dialect) == str(value)


def _equals_any(key: str, values: tuple[FieldValue, ...], dialect: str) -> ColumnElement[bool]:
    """``metadata[key]`` equals one of ``values`` (by JSON type, as :func:`_equals`): one SQL ``IN`` for the
    strings and one for the numbers, so a long list stays one shallow expression (SQLite refuses an expression
    tree deeper than 1000, which a chain of ``OR`` reaches)."""
    texts = [v for v in values if isinstance(v, str)]
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    others = [v for v in values if v is None or isinstance(v, bool)]
    parts = [_equals(key, v, dialect) for v in dict.fromkeys(others)]
    if texts:
        parts.append(_as_text(key, dialect).in_(texts))
    if numbers:
        parts.append(_number_in(key, dialect, numbers))
    return or_(*parts)


def _metadata(cond: Condition, dialect: str) -> ColumnElement[bool]:
    key, op, value = cond.field, cond.op, cond.value
    if op == "exists":
        kind = _kind(key, dialect)
        return and_(kind.is_not(None), kind != "null")
    if op == "eq":
        return _equals(key, value, dialect)
    if op == "ne":
        return not_(_definite(_equals(key, value, dialect)))
    if op in ("in", "nin"):
        either = _equals_any(key, _operands(cond), dialect)
        return either if op == "in" else not_(_definite(either))
    if op in ("contains", "icontains"):
        return _contains(_as_text(key, dialect), str(value), dialect, op == "icontains")
    if isinstance(value, datetime):
        value = value.isoformat()
    if isinstance(value, int | float):
        return _number_is(key, dialect, op, value)
    return _compare(_code_point_order(_as_text(key, dialect), dialect), op, str(value))


__all__ = ["compile_filter"]
