"""The README's promises: its walkthrough runs as pasted, its settings table is complete."""

from __future__ import annotations

import re
import subprocess

import pytest

from app.core.settings import Settings
from tests.support import ROOT, ServerProcess

README = (ROOT / "README.md").read_text()


def fenced(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_settings_table_lists_every_setting() -> None:
    documented = set(re.findall(r"^\| `AGENTSTATE_([A-Z_]+)` \|", README, flags=re.M))
    assert documented == {name.upper() for name in Settings.model_fields}


@pytest.mark.parametrize("backend_marker", ["any"])
def test_curl_walkthrough_runs_as_pasted(database_url: str, backend_marker: str) -> None:
    walkthrough = next(block for block in fenced("sh") if "T=demo-$RANDOM" in block)
    with ServerProcess(database_url) as server:
        script = walkthrough.replace("localhost:8080", f"127.0.0.1:{server.port}")
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                                text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    statuses = re.findall(r"^HTTP/1.1 (\d{3})", result.stdout, flags=re.M)
    assert statuses == ["201", "200", "412", "428", "200", "304"], result.stdout
    assert '"code":"revision_mismatch","current_revision":2' in result.stdout
    assert '"state":{"agent":"planner","step":3}' in result.stdout
    assert '"has_more":' in result.stdout and '"team":"research"' in result.stdout
