"""Every Python example in docs/client.md and in the README's "Using agentstate from an agent"
runs, as written, against a real server, after the install line printed above it and with
nothing else installed.

An example's install line is the last `pip install` of `./client` before it in its `##`
section, else the document's first. The example runs in an interpreter that sees the
standard library, the client's source and the files of exactly the distributions that line
installs (the client with the extras it names, the packages it names, and what they require,
by their metadata): a directory of links into this venv's site-packages, `python -S` (no
site-packages of its own). So an import the line does not provide fails as it would in a
fresh environment: `No module named 'langgraph.graph'` after an extra that brings only
`langgraph-checkpoint`.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import ROOT, ServerProcess

DOCS = [ROOT / "docs" / "client.md", ROOT / "README.md"]
CLIENT = "./client"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"`([^`]+)`")
_INSTALL = re.compile(r"pip install\s+([^#\n`]+(?:\n[^#\n`]+)?)")


@dataclass(frozen=True)
class Example:
    doc: str
    code: str
    install: tuple[str, ...]  # the arguments of its install line

    def __str__(self) -> str:
        return f"{self.doc}: after `pip install {shlex.join(self.install)}`:\n{self.code}"


def _install_lines(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """(position, arguments) of every `pip install` in a fenced block or inline code."""
    spans = [(m.start(2), m.group(2)) for m in _FENCE.finditer(text)]
    outside = _FENCE.sub(lambda m: " " * len(m.group()), text)
    spans += [(m.start(1), m.group(1)) for m in _INLINE.finditer(outside)]
    found = []
    for start, span in spans:
        for line in _INSTALL.finditer(span):
            found.append((start + line.start(), tuple(shlex.split(line.group(1)))))
    return sorted(found)


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        sections = [m.start() for m in re.finditer(r"^## ", text, re.MULTILINE)]
        installs = [(at, args) for at, args in _install_lines(text)
                    if any(arg.split("[")[0] == CLIENT for arg in args)]
        for block in _FENCE.finditer(text):
            if block.group(1) != "python":
                continue
            at = block.start()
            section = max((s for s in sections if s < at), default=0)
            mine = [args for where, args in installs if section <= where < at]
            line = mine[-1] if mine else installs[0][1] if installs else ()
            found.append(Example(doc.relative_to(ROOT).as_posix(), block.group(2), line))
    return found


EXAMPLES = examples()


def test_the_readme_section_has_the_three_styles() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using agentstate from an agent", 1)[1].split("\n## ", 1)[0]
    for needle in ("AgentStateClient", "AgentStateStore", "agentstate_client.colosseum"):
        assert any(needle in e.code for e in EXAMPLES if e.code in section), needle


def test_every_install_line_installs_this_checkouts_client() -> None:
    """The client is not on PyPI: `pip install agentstate-client` would install whatever
    that name is there. Every example has a line, and every line names `./client`."""
    for doc in DOCS:
        for _, args in _install_lines(doc.read_text()):
            assert not any(canonicalize_name(a.split("[")[0]) == "agentstate-client"
                           for a in args), (doc.name, args)
    for example in EXAMPLES:
        assert example.install, f"no install line above:\n{example}"


def _requirements(install: tuple[str, ...]) -> list[Requirement]:
    roots = []
    for arg in install:
        if arg.startswith("-"):
            continue
        name, bracket, extras = arg.partition("[")
        roots.append(Requirement(f"agentstate-client{bracket}{extras}" if name == CLIENT
                                 else arg))
    return roots


def _closure(install: tuple[str, ...]) -> set[str]:
    """The distributions an install line brings, by their requirements' metadata."""
    extras: dict[str, set[str]] = {}
    todo = _requirements(install)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in extras and set(requirement.extras) <= extras[name]:
            continue
        wanted = extras.setdefault(name, set())
        wanted |= set(requirement.extras)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            raise AssertionError(f"{name}, which `pip install {shlex.join(install)}` brings, "
                                 "is not in the test environment") from None
        for raw in requires:
            needed = Requirement(raw)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra})
                                            for extra in wanted | {""}):
                todo.append(needed)
    return set(extras)


@functools.cache
def _owners() -> tuple[Path, dict[tuple[str, ...], set[str]]]:
    """site-packages, and for every path in it that a distribution's RECORD lists (and each
    directory above one), the distributions with files there."""
    site = Path(metadata.distribution("httpx").locate_file("")).resolve()
    owners: dict[tuple[str, ...], set[str]] = {}
    for dist in metadata.distributions():
        if Path(dist.locate_file("")).resolve() != site:
            continue
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or []:
            parts = file.parts
            if ".." in parts:
                continue  # a script in bin/
            for depth in range(1, len(parts) + 1):
                owners.setdefault(parts[:depth], set()).add(name)
    return site, owners


@functools.cache
def environment(install: tuple[str, ...], root: Path) -> Path:
    """A directory holding links to the files of exactly what `install` brings."""
    allowed = _closure(install)
    site, owners = _owners()
    tree = root / re.sub(r"[^A-Za-z0-9]+", "-", shlex.join(install)).strip("-")

    def place(parts: tuple[str, ...]) -> None:
        who = owners[parts]
        if not who & allowed:
            return
        target = tree.joinpath(*parts)
        if who <= allowed:  # wholly theirs: one link
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(site.joinpath(*parts))
            return
        target.mkdir(parents=True, exist_ok=True)  # shared (a namespace package): go down
        for child in sorted(p for p in owners if len(p) == len(parts) + 1 and p[:-1] == parts):
            place(child)

    for top in sorted(p for p in owners if len(p) == 1):
        place(top)
    return tree


@pytest.fixture(scope="session")
def environments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("installed")


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_example_runs_after_its_install_line(index: int, server: ServerProcess,
                                             environments: Path, tmp_path: Path) -> None:
    example = EXAMPLES[index]
    script = tmp_path / "example.py"
    script.write_text(example.code)
    installed = environment(example.install, environments)
    path = os.pathsep.join([str(installed), str(ROOT / "client")])
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    run = subprocess.run([sys.executable, "-S", "-s", str(script)], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, check=False,
                         env={**env, "PYTHONPATH": path, "AGENTSTATE_URL": server.base_url})
    assert run.returncode == 0, f"{example}\n{run.stdout}{run.stderr}"
    assert run.stdout.strip(), "every example shows something"
