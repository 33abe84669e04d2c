"""The tenant guard: no statement reads or changes a tenant's rows without naming the tenant.

Repositories filter every statement by `tenant_id`. This guard makes forgetting that filter a
loud error instead of a silent leak: before a statement reaches the database, every table with
a `tenant_id` column that a SELECT, UPDATE or DELETE touches must be constrained by
`tenant_id = :value` (or `IN (...)`) in an AND-chain of its WHERE or JOIN criteria, directly or
through a `tenant_id = other.tenant_id` join to a constrained table. INSERTs need no check:
`tenant_id` is NOT NULL, so a row without a tenant cannot be written.

The check runs on the compiled statement, which SQLAlchemy caches and reuses for every
execution of the same statement shape; the verdict is cached with it, so in production the
guard costs one set lookup per execution. A table opts out with `info={"cross_tenant": True}`
(only `api_keys`), a statement with `cross_tenant(stmt)` (for deliberate maintenance queries).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import operators, visitors
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


class UnscopedQuery(RuntimeError):
    """A statement touched tenant rows without a tenant filter: a bug, never a request error."""


def cross_tenant(statement: S) -> S:
    """Mark a statement as deliberately crossing tenants (e.g. expiring old rows)."""
    return statement.execution_options(**{_OPTION: True})  # type: ignore[attr-defined]


def install_tenant_guard(engine: AsyncEngine) -> None:
    checked: weakref.WeakSet[Any] = weakref.WeakSet()

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _guard(_conn: Connection, _cursor: Any, _sql: str, _params: Any, context: Any,
               _executemany: bool) -> None:
        compiled = getattr(context, "compiled", None)
        if compiled is None or compiled in checked:
            return
        if context.execution_options.get(_OPTION):
            return
        unscoped = unscoped_tables(compiled.statement)
        if unscoped:
            log.error("unscoped query on %s", ", ".join(sorted(unscoped)))
            raise UnscopedQuery(
                f"Statement touches {', '.join(sorted(unscoped))} without a tenant_id filter."
            )
        checked.add(compiled)


def unscoped_tables(statement: Any) -> set[str]:
    """Tenant tables touched by `statement` whose tenant_id it does not constrain."""
    touched: set[str] = set()
    constrained: set[str] = set()
    joined: list[tuple[str, str]] = []
    for element in visitors.iterate(statement):
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


def _tenant_column(element: Any) -> str | None:
    if isinstance(element, ColumnClause) and element.name == TENANT and element.table is not None:
        return element.table.name
    return None


def _tenant_equalities(criterion: Any) -> list[tuple[str, str | None]]:
    """(table, None) for `table.tenant_id = :value`; (a, b) for `a.tenant_id = b.tenant_id`."""
    found: list[tuple[str, str | None]] = []
    for part in _conjuncts(criterion):
        if not isinstance(part, BinaryExpression) or part.operator not in (
            operators.eq, operators.in_op
        ):
            continue
        left, right = _tenant_column(part.left), _tenant_column(part.right)
        if left and right:
            found.append((left, right))
        elif left and isinstance(part.right, (BindParameter, Grouping)):
            found.append((left, None))
        elif right and isinstance(part.left, BindParameter):
            found.append((right, None))
    return found
