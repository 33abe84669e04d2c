"""The mechanical rules of docs/CONVENTIONS.md, checked."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

APP = ROOT / "app"


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_routers_are_thin() -> None:
    routers = sorted(APP.glob("*/router.py"))
    assert routers, "no routers found"
    for router in routers:
        text = router.read_text()
        assert not any(name.startswith("sqlalchemy") for name in imports(router)), router
        assert ".commit(" not in text and "select(" not in text, router


def test_only_the_session_dependency_commits() -> None:
    # Requests commit in app/db/session.py; the CLI's maintenance commands own their own.
    allowed = {APP / "db" / "session.py", APP / "cli.py"}
    for path in APP.rglob("*.py"):
        if path not in allowed:
            assert ".commit(" not in path.read_text(), f"{path} commits; services only flush"


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
