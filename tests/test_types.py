"""`mypy --strict` (with the pydantic plugin) over app/ and client/ finds nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


def test_mypy_strict_finds_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
