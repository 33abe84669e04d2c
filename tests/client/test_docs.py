"""Every Python example in docs/client.md and in the README's "Using agentstate from an agent"
runs, as written, against a real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, ServerProcess

DOCS = [ROOT / "docs" / "client.md", ROOT / "README.md"]
BLOCKS = [block for doc in DOCS for block in
          re.findall(r"^```python\n(.*?)^```$", doc.read_text(), re.DOTALL | re.MULTILINE)]


def test_the_readme_section_has_the_three_styles() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Using agentstate from an agent", 1)[1].split("\n## ", 1)[0]
    for needle in ("AgentStateClient", "AgentStateStore", "agentstate_client.colosseum"):
        assert any(needle in block for block in BLOCKS if block in section), needle


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, server: ServerProcess, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={**os.environ, "AGENTSTATE_URL": server.base_url})
    assert run.returncode == 0, f"example {index}:\n{BLOCKS[index]}\n{run.stdout}{run.stderr}"
    assert run.stdout.strip(), "every example shows something"
