"""The mechanical rules of docs/CONVENTIONS.md, checked."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tests.support import ROOT

APP = ROOT / "app"
# Packages under app/ that are not slices: the shared layers, and `idempotency`, the
# Idempotency-Key mechanism every appending slice uses.
LAYERS = {"core", "db", "http", "idempotency"}
SLICES = sorted(p.name for p in APP.iterdir()
                if (p / "__init__.py").exists() and p.name not in LAYERS)


def imports(path: Path) -> set[str]:
    return source_imports(path.read_text())


def source_imports(source: str) -> set[str]:
    """Every module (and `module.name`) the source imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def imported_names(path: Path, module: str) -> set[str]:
    """The names `path` imports from `module` itself (`from module import a, b`)."""
    return {alias.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.module == module
            for alias in node.names}


def test_there_are_slices() -> None:
    assert {"threads", "messages", "compactions", "agent_states"} <= set(SLICES), SLICES


def test_composers_import_no_router() -> None:
    for slice_name in COMPOSERS:
        for path in (APP / slice_name).rglob("*.py"):
            for name in imports(path):
                parts = name.split(".")
                if len(parts) >= 3 and parts[0] == "app" and parts[1] in SLICES \
                        and parts[1] != slice_name:
                    assert parts[2] != "router", f"{path} imports {name}"


def test_routers_are_thin() -> None:
    routers = sorted(APP.glob("*/*router.py"))  # and the store's langgraph_router.py
    assert routers, "no routers found"
    for router in routers:
        text = router.read_text()
        assert not any(name.startswith("sqlalchemy") for name in imports(router)), router
        assert ".commit(" not in text and "select(" not in text, router


def test_every_router_is_a_domain_router() -> None:
    """Each router the application includes says at once when a path is none of its
    routes' (app/http/routing.py), and is included without a prefix, which it would not
    know of."""
    from app.http.routing import DomainRouter
    from app.main import ROUTERS, console_router

    for router in [*ROUTERS, console_router]:
        assert isinstance(router, DomainRouter), router.routes[0].path
    included = [line for line in (APP / "main.py").read_text().splitlines()
                if "include_router(" in line]
    assert included and not any("prefix" in line for line in included), included


def test_routes_are_planned() -> None:
    """Every route is served from its plan (app/http/plan.py), but the event stream (a
    generator endpoint) and /metrics: a route that stops being plain (a `Header()`
    parameter, a dependency with dependencies) falls back to FastAPI's handler silently, and
    pays its per-request resolution again."""
    from fastapi.routing import APIRoute

    from app.http.plan import plan_of
    from app.main import ROUTERS, console_router

    unplanned = {(method, route.path) for router in [*ROUTERS, console_router]
                 for route in router.routes if isinstance(route, APIRoute)
                 and plan_of(route) is None for method in route.methods}
    assert unplanned == {("GET", "/v1/events/stream"), ("GET", "/metrics")}


# `batch` runs other slices' use cases in one transaction: a composition root like main.py
# (docs/CONVENTIONS.md), and the one slice that may call their services.
COMPOSERS = {"batch"}


def test_no_slice_imports_another_slices_router_or_service() -> None:
    for slice_name in sorted(set(SLICES) - COMPOSERS):
        for path in (APP / slice_name).rglob("*.py"):
            for name in imports(path):
                parts = name.split(".")
                if len(parts) >= 3 and parts[0] == "app" and parts[1] in SLICES \
                        and parts[1] != slice_name:
                    assert parts[2] not in ("router", "service"), f"{path} imports {name}"


def test_sql_lives_in_repositories() -> None:
    """Statements are built only in repositories (and the database layer); services, routers,
    the aggregate and the shared layers use no SQL construct."""
    for path in APP.rglob("*.py"):
        relative = path.relative_to(APP)
        if path.name in ("repository.py", "models.py") or relative.parts[0] == "db":
            continue
        for name in imports(path):
            assert not name.startswith(("sqlalchemy.sql", "sqlalchemy.dialects",
                                        "sqlalchemy.orm")), f"{path} imports {name}"
        assert imported_names(path, "sqlalchemy") <= {"event"}, path


def table_aliases(source: str) -> list[tuple[str, str]]:
    """(alias, model) of each module-level `alias = table(Model)` (tuples too)."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = (zip(target.elts, value.elts, strict=False)
                 if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                 else [(target, value)])
        for name, call in pairs:
            if (isinstance(name, ast.Name) and isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Name) and call.func.id == "table"
                    and call.args and isinstance(call.args[0], ast.Name)):
                found.append((name.id, call.args[0].id))
    return found


def test_a_table_alias_means_one_table_everywhere() -> None:
    """`c` was a checkpoint in one repository and a compaction in another: each alias names
    one table in every module (the register is in docs/CONVENTIONS.md), and each table has
    one alias."""
    seen: dict[str, set[str]] = {}
    for path in APP.rglob("*.py"):
        for alias, model in table_aliases(path.read_text()):
            seen.setdefault(alias, set()).add(model)
    assert {"t", "m", "c", "cp"} <= set(seen), seen
    assert all(len(models) == 1 for models in seen.values()), seen
    models = [next(iter(models)) for models in seen.values()]
    assert len(models) == len(set(models)), f"a table with two aliases: {seen}"
    assert table_aliases("t, e = table(Thread), table(Event)\n") == [("t", "Thread"),
                                                                      ("e", "Event")]


def test_repositories_return_facts_and_services_decide_errors() -> None:
    for path in APP.glob("*/repository.py"):
        for name in imports(path):
            assert not name.endswith((".errors", "errors.AppError")) \
                and not name.startswith("app.core.errors"), f"{path} imports {name}"


# The layers point one way: core <- db <- the slices, http and the composition roots
# (docs/ARCHITECTURE.md). A layer imports, from the app, only itself and the layers listed.
LAYER_IMPORTS = {"core": set(), "db": {"core"}}
# The model registry (app/db/models.py) imports every slice's tables, so that Base.metadata is
# complete: the one import from a slice the db layer makes.
MODEL_REGISTRY = APP / "db" / "models.py"


def layer_violations(layer: str, path: Path, source: str) -> list[str]:
    allowed = {layer, *LAYER_IMPORTS[layer]}
    found = []
    for name in source_imports(source):
        parts = name.split(".")
        if parts[0] != "app" or len(parts) < 2 or parts[1] in allowed:
            continue
        if path == MODEL_REGISTRY and parts[2:3] == ["models"]:
            continue
        found.append(f"{path.relative_to(ROOT)} imports {name}: {layer} may import only "
                     f"{', '.join(sorted(allowed))}")
    return found


def test_layers_point_one_way() -> None:
    for layer in LAYER_IMPORTS:
        for path in (APP / layer).rglob("*.py"):
            assert not layer_violations(layer, path, path.read_text())


def test_the_layer_rule_sees_lazy_and_aliased_imports() -> None:
    """What the rule above would miss if it only read top-level `from` imports."""
    core, db = APP / "core" / "x.py", APP / "db" / "x.py"
    assert layer_violations("core", core, "def f():\n    from app.db.engine import x\n")
    assert layer_violations("core", core, "import app.auth.principal as p\n")
    assert layer_violations("db", db, "from app.auth import tenancy\n")
    assert layer_violations("db", db, "from app.threads.models import Thread\n")
    assert not layer_violations("db", MODEL_REGISTRY, "from app.threads.models import Thread\n")
    assert not layer_violations("db", db, "from app.core.settings import Settings\n")


def test_core_knows_nothing_of_fastapi() -> None:
    for path in (APP / "core").rglob("*.py"):
        for name in imports(path):
            assert not name.startswith(("fastapi", "starlette")), f"{path} imports {name}"


def test_every_dependency_is_async() -> None:
    """FastAPI runs a plain `def` dependency in its thread pool: a thread hop per request."""
    from app.core.settings import Settings
    from app.main import create_app

    app = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:", _env_file=None))  # type: ignore[call-arg]
    seen = 0

    def walk(dependant: object) -> None:
        nonlocal seen
        for dependency in getattr(dependant, "dependencies", []):
            call = dependency.call
            target = call if inspect.isfunction(call) else getattr(call, "__call__", call)  # noqa: B004
            assert inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target), (
                f"{call} is a sync dependency")
            seen += 1
            walk(dependency)

    def routes(items: list[object]) -> list[object]:
        flat: list[object] = []
        for item in items:  # FastAPI keeps included routers as they were declared
            router = getattr(item, "original_router", None)
            flat += routes(router.routes) if router is not None else [item]
        return flat

    for route in routes(app.routes):
        if hasattr(route, "dependant"):
            assert inspect.iscoroutinefunction(route.endpoint), route
            walk(route.dependant)
    assert seen > 20


def test_only_the_request_dependency_commits() -> None:
    # Requests commit in app/http/dependencies.py; the CLI's maintenance commands (each
    # package's commands.py) own theirs, and import (which copy runs) commits a thread at a
    # time; the feed's sequencer call is a transaction of its own, which through a transaction
    # pooler a read connection commits at once.
    allowed = {APP / "http" / "dependencies.py", APP / "portability" / "importer.py",
               APP / "events" / "repository.py"}
    for path in APP.rglob("*.py"):
        if path not in allowed and path.name != "commands.py":
            assert ".commit(" not in path.read_text(), f"{path} commits; services only execute"


def test_client_never_imports_app() -> None:
    for path in (ROOT / "client").rglob("*.py"):
        assert not any(n == "app" or n.startswith("app.") for n in imports(path)), path


def test_no_create_all() -> None:
    for path in [*APP.rglob("*.py"), *(ROOT / "migrations").rglob("*.py")]:
        assert "create_all(" not in path.read_text(), path


def test_every_model_is_registered_for_migrations() -> None:
    registered = imports(APP / "db" / "models.py")
    for path in APP.glob("*/models.py"):
        if path.parent.name == "db":
            continue
        module = f"app.{path.parent.name}.models"
        assert module in registered, f"{module} is not imported in app/db/models.py"


def test_every_package_is_shipped() -> None:
    import tomllib

    shipped = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for init in APP.rglob("__init__.py"):
        package = ".".join(init.parent.relative_to(ROOT).parts)
        assert package in shipped, f"{package} is missing from pyproject's packages"
