"""The tenant guard: no request reads or changes a tenant's rows without naming the tenant.

Repositories filter every statement by `tenant_id`. This guard makes forgetting that filter a
loud error instead of a silent leak: while a request is being served, every table with a
`tenant_id` column that a SELECT, UPDATE or DELETE touches must be constrained, in an AND-chain
of its WHERE or JOIN criteria, by `tenant_id = :value` (or `IN (...)`), by its primary key
(internal ids never leave the server, so they can only come from a tenant-scoped read), or by
`tenant_id = other.tenant_id` to a constrained table. INSERTs need no check: `tenant_id` is
NOT NULL, so a row without a tenant cannot be written.

The check runs on the compiled statement, which SQLAlchemy caches and reuses for every
execution of the same statement shape; the verdict is cached with it, so in production the
guard costs one set lookup per execution. Outside requests (CLI maintenance, tests reading
rows directly) nothing is checked. A table opts out with `info={"cross_tenant": True}` (only
`api_keys`), a statement with `cross_tenant(stmt)`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import operators
from sqlalchemy.sql.dml import Delete, Update
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ColumnClause,
    Grouping,
)
from sqlalchemy.sql.selectable import Alias, Join, Select, TableClause

log = logging.getLogger("agentstate.tenancy")

TENANT = "tenant_id"
_OPTION = "agentstate_cross_tenant"
S = TypeVar("S")
# The tenant of the request being served, set by the key dependencies of
# app/http/dependencies.py; None outside requests.
request_tenant: ContextVar[str | None] = ContextVar("agentstate_request_tenant", default=None)


class UnscopedQuery(RuntimeError):
    """A statement touched tenant rows without a tenant filter: a bug, never a request error."""


def cross_tenant(statement: S) -> S:
    """Mark a statement as deliberately crossing tenants (e.g. expiring old rows)."""
    marked: S = statement.execution_options(**{_OPTION: True})  # type: ignore[attr-defined]
    return marked


def install_tenant_guard(engine: AsyncEngine) -> None:
    checked: weakref.WeakSet[Any] = weakref.WeakSet()

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _guard(_conn: Connection, _cursor: Any, _sql: str, _params: Any, context: Any,
               _executemany: bool) -> None:
        compiled = getattr(context, "compiled", None)
        if compiled is None or compiled in checked or request_tenant.get() is None:
            return
        if context.execution_options.get(_OPTION):
            return
        require_scoped(compiled.statement)
        checked.add(compiled)


def require_scoped(statement: Any) -> None:
    """Raise `UnscopedQuery` (and log it) if `statement` touches tenant rows unscoped."""
    unscoped = unscoped_tables(statement)
    if unscoped:
        log.error("unscoped query on %s", ", ".join(sorted(unscoped)))
        raise UnscopedQuery(
            f"Statement touches {', '.join(sorted(unscoped))} without a tenant_id filter."
        )


def unscoped_tables(statement: Any) -> set[str]:
    """Tenant tables touched by `statement` whose tenant_id it does not constrain."""
    touched: set[str] = set()
    constrained: set[str] = set()
    joined: list[tuple[str, str]] = []
    for element in _elements(statement):
        if isinstance(element, Select):
            froms = list(element.get_final_froms())
            criteria = [element.whereclause]
        elif isinstance(element, (Update, Delete)):
            froms = [element.table]
            criteria = [element.whereclause]
        else:
            continue
        for source in froms:
            _tables(source, touched, criteria)
        for criterion in criteria:
            for left, right in _tenant_equalities(criterion):
                if right is None:
                    constrained.add(left)
                else:
                    joined.append((left, right))
    # Equality joins on tenant_id carry the constraint across, in any order.
    changed = True
    while changed:
        changed = False
        for a, b in joined:
            if (a in constrained) != (b in constrained):
                constrained.update((a, b))
                changed = True
    return touched - constrained


def _elements(statement: Any) -> Iterator[Any]:
    """Each element of `statement` once: a CTE or subquery referenced in several places is
    walked once, not once per reference (`visitors.iterate` walks it each time, and
    `get_final_froms` compiles each SELECT it yields: quadratic in a statement that refers
    to its CTEs many times, seconds for the 31-channel `delta_history`)."""
    seen: set[int] = set()
    stack = [statement]
    while stack:
        element = stack.pop()
        if id(element) in seen:
            continue
        seen.add(id(element))
        yield element
        stack.extend(element.get_children())


def _tables(source: Any, touched: set[str], criteria: list[Any]) -> None:
    if isinstance(source, Join):
        criteria.append(source.onclause)
        _tables(source.left, touched, criteria)
        _tables(source.right, touched, criteria)
        return
    base = source.element if isinstance(source, Alias) else source
    if (isinstance(base, TableClause) and TENANT in base.c
            and not getattr(base, "info", {}).get("cross_tenant")):
        touched.add(source.name)


def _conjuncts(criterion: Any) -> list[Any]:
    if criterion is None:
        return []
    if isinstance(criterion, Grouping):
        return _conjuncts(criterion.element)
    if isinstance(criterion, BooleanClauseList) and criterion.operator is operators.and_:
        return [part for clause in criterion.clauses for part in _conjuncts(clause)]
    return [criterion]


def _column(element: Any) -> tuple[str, bool] | None:
    """(table, is tenant_id) for a tenant_id or primary key column, else None."""
    if isinstance(element, ColumnClause) and element.table is not None and (
        element.name == TENANT or getattr(element, "primary_key", False)
    ):
        return str(getattr(element.table, "name", "")), element.name == TENANT
    return None


def _tenant_equalities(criterion: Any) -> list[tuple[str, str | None]]:
    """(table, None) for `table.tenant_id = :value` or `table.pk = :value`;
    (a, b) for `a.tenant_id = b.tenant_id`."""
    found: list[tuple[str, str | None]] = []
    for part in _conjuncts(criterion):
        if not isinstance(part, BinaryExpression) or part.operator not in (
            operators.eq, operators.in_op
        ):
            continue
        left, right = _column(part.left), _column(part.right)
        if left and right:
            if left[1] and right[1]:
                found.append((left[0], right[0]))
        elif left and _value(part.right, tenant=left[1]):
            found.append((left[0], None))
        elif right and _value(part.left, tenant=right[1]):
            found.append((right[0], None))
    return found


def _value(element: Any, *, tenant: bool) -> bool:
    """A tenant_id may be compared with any value that is not a column (a bind, a scalar
    subquery checked on its own); a primary key only with values from Python, since a
    subquery over the same table would otherwise vouch for itself."""
    return isinstance(element, BindParameter) or (
        tenant and not isinstance(element, ColumnClause)
    )
