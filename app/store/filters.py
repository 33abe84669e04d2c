"""The `filter` of a search, read into conditions on JSON paths of the value.

The grammar is LangGraph's (its `InMemoryStore` is the reference): a member is a condition
on that key of the value; an object of operators (`$eq $ne $gt $gte $lt $lte`) applies them;
an object without operators is a condition on nested keys (each of its members, one level
down); anything else is equality. Unlike LangGraph's stores, comparisons follow JSON types
(numbers numerically, strings as text in code point order, booleans never equal to numbers),
an order operator needs a number or a string and never matches a value of another type, and a
missing key reads as `null` (as `InMemoryStore` reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.core.errors import Unprocessable

Op = Literal["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "object"]
ORDER_OPS = ("$gt", "$gte", "$lt", "$lte")
OPERATORS = ("$eq", "$ne", *ORDER_OPS)
MAX_CONDITIONS = 64


@dataclass(frozen=True)
class Condition:
    path: tuple[str, ...]
    op: Op
    value: Any = None


def _refuse(pointer: str, message: str, code: str = "invalid_filter") -> Unprocessable:
    return Unprocessable(f"filter{pointer or ''}: {message}", errors=[
        {"pointer": f"/filter{pointer}", "code": code, "message": message}])


def _pointer(path: tuple[str, ...]) -> str:
    return "".join("/" + step.replace("~", "~0").replace("/", "~1") for step in path)


def parse_filter(filter_: dict[str, Any] | None) -> list[Condition]:
    conditions: list[Condition] = []
    stack: list[tuple[tuple[str, ...], dict[str, Any]]] = [((), filter_ or {})]
    while stack:
        base, members = stack.pop()
        for name, wanted in members.items():
            path = (*base, name)
            if '"' in name:
                raise _refuse(_pointer(path), 'a filter key may not contain a double quote (")')
            if isinstance(wanted, dict) and any(k.startswith("$") for k in wanted):
                for op, operand in wanted.items():
                    if op not in OPERATORS:
                        raise _refuse(_pointer(path), f"unknown operator {op!r}; use one of "
                                      f"{', '.join(OPERATORS)}", "unknown_operator")
                    if op in ORDER_OPS and (isinstance(operand, bool)
                                            or not isinstance(operand, (int, float, str))):
                        raise _refuse(_pointer((*path, op)),
                                      f"{op} compares with a number or a string")
                    conditions.append(Condition(path, op, operand))
            elif isinstance(wanted, dict):
                # As in InMemoryStore: nested conditions need an object there, even `$ne`.
                conditions.append(Condition(path, "object"))
                stack.append((path, wanted))
            else:
                conditions.append(Condition(path, "$eq", wanted))
            if len(conditions) > MAX_CONDITIONS:
                raise _refuse("", f"at most {MAX_CONDITIONS} conditions", "too_many_conditions")
    return conditions
