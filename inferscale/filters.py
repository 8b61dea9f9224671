"""Mem0-shaped filters, parsed into a small typed tree that the storage layer compiles to SQL.

Grammar (the shape Mem0 v1 and v2 accept)::

    filters   := {key: condition, ...}                 every key must hold (AND)
    key       := "AND" | "OR" | "NOT" | field          ("$and", "$or", "$not" are accepted too)
    "AND"/"OR": [filters, ...]                         a non-empty list
    "NOT"     : filters | [filters, ...]               none of them may hold
    condition := scalar                                equality
               | "*"                                   the field is present and not null
               | {op: value, ...}                      every operator must hold
    op        := eq ne gt gte lt lte in nin contains icontains exists

Fields are the scope ids (``user_id``, ``agent_id``, ``run_id``), the timestamps (``created_at``,
``updated_at``: ISO 8601 strings, dates, tz-aware datetimes or epoch seconds; naive values are read as UTC)
and otherwise a top-level metadata key. ``ne`` and ``nin`` also match memories that lack the field, as
MongoDB-style filters do.

Limits, checked while parsing so an oversized filter is refused before any SQL is built: at most
:data:`MAX_FILTER_CONDITIONS` conditions (field tests: an ``in`` list is one condition), at most
:data:`MAX_FILTER_DEPTH` nested ``AND``/``OR``/``NOT``, and at most :data:`MAX_FILTER_VALUES` values in all
``in``/``nin`` lists together. Keys and string values must be storable text (no lone surrogate, no NUL).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal, TypeAlias, TypeGuard

from inferscale.errors import InvalidInputError, ScopeError
from inferscale.scope import SCOPE_KEYS, int_id_text
from inferscale.storable import check_storable
from inferscale.validation_text import shown_input

Operator = Literal["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains", "exists"]
Scalar: TypeAlias = str | int | float | bool | None
FieldValue: TypeAlias = Scalar | datetime | tuple[Scalar | datetime, ...]

OPERATORS: tuple[str, ...] = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains")
TIME_FIELDS: tuple[str, ...] = ("created_at", "updated_at")
LOGICAL_KEYS: tuple[str, ...] = ("AND", "OR", "NOT")
WILDCARD = "*"
"""The condition ``"*"``: the field is present and not null (it pins no scope id)."""

MAX_FILTER_CONDITIONS = 100
"""The most field conditions one filter may hold (an ``in``/``nin`` list counts once; ``AND``/``OR``/``NOT`` not)."""

MAX_FILTER_DEPTH = 8
"""The deepest nesting of ``AND``/``OR``/``NOT`` in one filter (the top-level dict is depth 0)."""

MAX_FILTER_VALUES = 1000
"""The most values in all ``in``/``nin`` lists of one filter together."""

_LOGICAL_ALIASES = {"AND": "AND", "OR": "OR", "NOT": "NOT", "$and": "AND", "$or": "OR", "$not": "NOT"}
_ID_OPERATORS = frozenset({"eq", "ne", "in", "nin", "contains", "icontains", "exists"})
_TIME_OPERATORS = frozenset({"eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "exists"})


@dataclass(frozen=True, slots=True)
class Condition:
    """One test on one field.

    Attributes:
        field: a scope id, a timestamp field or a metadata key.
        op: the operator; ``"exists"`` is the ``*`` wildcard.
        value: the operand: a scalar, a tz-aware UTC datetime (timestamp fields), a tuple (``in``/``nin``) or
            ``None`` (``exists``, or equality with JSON null).
    """

    field: str
    op: Operator
    value: FieldValue

    @property
    def kind(self) -> Literal["id", "time", "metadata"]:
        """Where the field lives: a scope-id column, a timestamp column or the metadata JSON."""
        if self.field in SCOPE_KEYS:
            return "id"
        if self.field in TIME_FIELDS:
            return "time"
        return "metadata"


@dataclass(frozen=True, slots=True)
class And:
    """Every part holds."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """At least one part holds."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True, slots=True)
class Not:
    """The part does not hold."""

    part: Filter


Filter: TypeAlias = Condition | And | Or | Not


def parse_filters(filters: Mapping[str, object] | None) -> Filter | None:
    """Parse a Mem0-shaped filter dict (see the module docstring).

    Returns:
        The filter tree, or ``None`` for ``None`` or ``{}`` (no restriction).

    Raises:
        InvalidInputError: for a non-dict, an unknown operator, an empty ``AND``/``OR`` list, an operand of the
            wrong type (e.g. ``in`` without a list, a timestamp that is not ISO 8601), a bare list as a value, a
            key or string value holding a lone surrogate or NUL, or a
            filter beyond the limits (:data:`MAX_FILTER_CONDITIONS`, :data:`MAX_FILTER_DEPTH`,
            :data:`MAX_FILTER_VALUES`). The message names the bad key and the fix.
    """
    if filters is None:
        return None
    if not isinstance(filters, Mapping):
        raise InvalidInputError(f"filters must be a dict such as {{'user_id': 'alice'}}, got {type(filters).__name__}")
    if not filters:
        return None
    return _parse_mapping(filters, "filters", 0, _Budget())


@dataclass(slots=True)
class _Budget:
    """What a filter has used of the limits so far, while it is parsed."""

    conditions: int = 0
    values: int = 0

    def spend(self, where: str, conditions: int, values: int) -> None:
        """Count ``conditions`` more conditions and ``values`` more list values.

        Raises:
            InvalidInputError: when either total goes past its limit, naming ``where`` and the fix.
        """
        self.conditions += conditions
        self.values += values
        if self.conditions > MAX_FILTER_CONDITIONS:
            raise InvalidInputError(
                f"filters hold more than {MAX_FILTER_CONDITIONS} conditions (at {where}); combine them into "
                "'in' lists or split the query"
            )
        if self.values > MAX_FILTER_VALUES:
            raise InvalidInputError(
                f"the in/nin lists of filters hold more than {MAX_FILTER_VALUES} values together (at {where}); "
                "filter on a metadata field that groups them instead, or split the query"
            )


def _parse_mapping(node: Mapping[str, object], where: str, depth: int, budget: _Budget) -> Filter:
    if depth > MAX_FILTER_DEPTH:
        raise InvalidInputError(f"{where} nests AND/OR/NOT deeper than {MAX_FILTER_DEPTH} levels; flatten the filter")
    if not isinstance(node, Mapping) or not node:
        raise InvalidInputError(f"{where} must be a non-empty dict of conditions, got {node!r}")
    parts: list[Filter] = []
    for key, value in node.items():
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"{where} has the key {key!r}; filter keys are non-empty strings")
        check_storable(key, f"a key of {where}")
        here = f"{where}[{key!r}]"
        logical = _LOGICAL_ALIASES.get(key)
        if logical is not None:
            parts.append(_parse_logical(logical, value, here, depth, budget))
        else:
            conditions = _parse_field(key, value, here)
            budget.spend(here, len(conditions), sum(len(c.value) for c in conditions if isinstance(c.value, tuple)))
            parts.extend(conditions)
    return parts[0] if len(parts) == 1 else And(tuple(parts))


def _parse_logical(key: str, value: object, where: str, depth: int, budget: _Budget) -> Filter:
    if key == "NOT" and isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list | tuple) or not value:
        raise InvalidInputError(f"{where} must be a non-empty list of filter dicts, e.g. [{{'category': 'work'}}]")
    children = tuple(_parse_mapping(item, f"{where}[{i}]", depth + 1, budget) for i, item in enumerate(value))
    if key == "AND":
        return children[0] if len(children) == 1 else And(children)
    either = children[0] if len(children) == 1 else Or(children)
    return either if key == "OR" else Not(either)


def _parse_field(field: str, value: object, where: str) -> list[Condition]:
    if isinstance(value, Mapping):
        if not value:
            raise InvalidInputError(f"{where} is an empty operator dict; use e.g. {{'eq': 'x'}} or '*'")
        if not any(_is_operator(str(op)) or op == WILDCARD for op in value):
            if field == "metadata":
                raise InvalidInputError(
                    f"{where}: metadata keys are filtered at the top level, not under 'metadata': write "
                    f"{dict(value)!r} (Mem0 v2's shape)"
                )
            if (logical := _miscased_logical(field)) is not None:
                raise InvalidInputError(f"{where}: to combine filters write {logical!r} in upper case")
        return [_condition(field, str(op), operand, f"{where}[{op!r}]") for op, operand in value.items()]
    if isinstance(value, list | tuple):
        logical = _miscased_logical(field)
        combine = f"; to combine filters write {logical!r} in upper case" if logical is not None else ""
        raise InvalidInputError(f"{where} is a list; to match any of several values write {{'in': [...]}}{combine}")
    if value == WILDCARD:
        return [_condition(field, "eq", WILDCARD, where)]
    return [_condition(field, "eq", value, where)]


def _miscased_logical(field: str) -> str | None:
    """The logical key a field name spells in another case (``"or"``, ``"$And"``), or ``None``."""
    logical = field.upper().lstrip("$")
    return logical if logical in LOGICAL_KEYS else None


def _is_operator(op: str) -> TypeGuard[Operator]:
    return op in OPERATORS or op == "exists"


def _condition(field: str, name: str, operand: object, where: str) -> Condition:
    if name == WILDCARD:
        raise InvalidInputError(f"{where}: '*' is a value, not an operator: write {{{field!r}: '*'}} (present and set)")
    if not _is_operator(name):
        raise InvalidInputError(
            f"{where}: unknown operator {name!r}; use one of {', '.join(OPERATORS)}, exists, or the value '*' "
            f"({{{field!r}: '*'}}: present and not null)"
        )
    op: Operator = "exists" if name == "eq" and operand == WILDCARD else name
    kind = Condition(field, "eq", None).kind
    allowed = _ID_OPERATORS if kind == "id" else _TIME_OPERATORS if kind == "time" else None
    if allowed is not None and op not in allowed:
        raise InvalidInputError(f"{where}: {field} does not support {op!r}; use one of {sorted(allowed)}")
    if op == "exists":
        if name == "exists" and operand is not True:
            raise InvalidInputError(
                f"{where} must be True (the field is present and not null), got {operand!r}; for a field that is "
                f"absent or null write {{'NOT': [{{{field!r}: '*'}}]}}"
            )
        return Condition(field, "exists", None)
    if op in ("in", "nin"):
        if not isinstance(operand, list | tuple) or not operand:
            raise InvalidInputError(f"{where} needs a non-empty list, e.g. {{'{op}': ['a', 'b']}}")
        if len(operand) > MAX_FILTER_VALUES:
            raise InvalidInputError(
                f"{where} lists {len(operand):,} values; an in/nin list holds at most {MAX_FILTER_VALUES}. Filter on "
                "a metadata field that groups them instead, or split the query"
            )
        values = tuple(_operand(kind, field, item, f"{where}[{i}]") for i, item in enumerate(operand))
        return Condition(field, op, values)
    value = _operand(kind, field, operand, where)
    if op in ("contains", "icontains") and not isinstance(value, str):
        raise InvalidInputError(f"{where} needs a string to search for, got {operand!r}")
    if op in ("gt", "gte", "lt", "lte") and (value is None or isinstance(value, bool)):
        raise InvalidInputError(f"{where} needs a number, a string or a timestamp to compare with, got {operand!r}")
    return Condition(field, op, value)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The integers a filter compares (exactly, on both backends; SQLite binds no wider integer)."""


def _operand(kind: str, field: str, value: object, where: str) -> Scalar | datetime:
    if kind == "time":
        return parse_timestamp(value, where)
    if kind == "id":
        if field in SCOPE_KEYS and isinstance(value, int) and not isinstance(value, bool):
            value = int_id_text(value, where)  # as a scope id given as an argument (check_scope_id)
        if not isinstance(value, str) or not value:
            raise InvalidInputError(f"{where}: {field} values are non-empty strings (or ints), got {value!r}")
        return check_storable(value, where)
    if isinstance(value, str):
        return check_storable(value, where)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            shown = shown_input(value, 40)
            raise InvalidInputError(f"{where} is {shown}; filter integers are 64-bit ({INT64_MIN} to {INT64_MAX})")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{where} is {value!r}; filters compare finite numbers only")
        return value
    raise InvalidInputError(f"{where} is a {type(value).__name__}; filter values are str, int, float, bool or None")


def parse_timestamp(value: object, where: str = "timestamp") -> datetime:
    """A tz-aware UTC datetime from a datetime, a date, an ISO 8601 string or epoch seconds (naive = UTC).

    Raises:
        InvalidInputError: for any other value, a string that is not ISO 8601, or a moment outside what a UTC
            datetime holds (years 1 to 9999): epoch seconds beyond it, NaN or an infinity, or a time near either end
            whose offset carries it past (``"9999-12-31T23:59:59-05:00"``).
    """
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime(value.year, value.month, value.day)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError) as exc:  # what fromtimestamp raises varies with the platform
            raise InvalidInputError(
                f"{where} is {value!r} epoch seconds, outside the years 1 to 9999 a timestamp can hold ({exc})"
            ) from exc
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as exc:
            raise InvalidInputError(f"{where} is {value!r}; write timestamps as ISO 8601, e.g. '2024-07-01'") from exc
    else:
        raise InvalidInputError(f"{where} is {value!r}; use an ISO 8601 string, a datetime or epoch seconds")
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError as exc:
        raise InvalidInputError(
            f"{where} is {value!r}, which in UTC falls outside the years 1 to 9999 a timestamp can hold"
        ) from exc


def required_ids(node: Filter | None) -> dict[str, str]:
    """The scope ids a filter pins by equality on every path: top-level conditions and those inside ``AND``.

    ``{"AND": [{"user_id": "a"}, {"agent_id": "g"}]}`` gives ``{"user_id": "a", "agent_id": "g"}``; ids under
    ``OR``/``NOT``, wildcards and ``in`` lists pin nothing.

    Raises:
        ScopeError: when the filter pins one id to two different values (it could match nothing).
    """
    found: dict[str, str] = {}

    def visit(part: Filter) -> None:
        if isinstance(part, And):
            for child in part.parts:
                visit(child)
        elif isinstance(part, Condition) and part.kind == "id" and part.op == "eq" and isinstance(part.value, str):
            previous = found.setdefault(part.field, part.value)
            if previous != part.value:
                raise ScopeError(f"filters require {part.field} to be both {previous!r} and {part.value!r}")

    if node is not None:
        visit(node)
    return found


def describe(node: Filter | None) -> str:
    """A short readable form of the tree, for logs and error messages."""
    if node is None:
        return "<no filter>"
    if isinstance(node, Condition):
        return f"{node.field} {node.op} {node.value!r}"
    if isinstance(node, Not):
        return f"NOT ({describe(node.part)})"
    joiner = " AND " if isinstance(node, And) else " OR "
    return "(" + joiner.join(describe(p) for p in node.parts) + ")"


__all__ = [
    "MAX_FILTER_CONDITIONS",
    "MAX_FILTER_DEPTH",
    "MAX_FILTER_VALUES",
    "OPERATORS",
    "TIME_FIELDS",
    "WILDCARD",
    "And",
    "Condition",
    "Filter",
    "Not",
    "Operator",
    "Or",
    "describe",
    "parse_filters",
    "parse_timestamp",
    "required_ids",
]
