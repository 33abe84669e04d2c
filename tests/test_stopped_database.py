"""A Postgres that stops under a running server: every request is the documented 503 with
`Retry-After` (docs/operations.md), never a 500, and the server recovers when it is back.

The database is a cluster of this module's own (initdb + pg_ctl in a temporary directory),
stopped for real with `pg_ctl stop`: the shared server on 5432 is never touched. The server
is a real `agentstate serve` process, with and without API keys.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.support import ServerProcess, agentstate, bearer, create_key, free_port

pytestmark = pytest.mark.slow

BIN = Path(os.environ.get("AGENTSTATE_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
# The API-key cache: the server got its 500s once the 5 s cache expired and the
# body-limit middleware's key lookup reached the stopped database.
AUTH_CACHE_SECONDS = 1


class Cluster:
    """A private Postgres cluster on a free port (run as `postgres` when the tests run as
    root, which initdb refuses)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="agentstate-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_owner: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            self.as_owner = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--no-sync")
        self.url = f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self.as_owner, str(BIN / tool), *args], capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{tool}: {done.stdout}{done.stderr}"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(self.root / "log"),
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "fast", "stop")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        made.start()
        assert agentstate(made.url, "migrate").returncode == 0
        yield made
    finally:
        made.remove()


def writes() -> list[tuple[str, str, dict]]:
    """Every write operation of the OpenAPI document: (method, path, body example)."""
    spec = create_app(Settings(database_url="sqlite+aiosqlite:///:memory:",  # type: ignore[call-arg]
                               auto_migrate=False, _env_file=None)).openapi()
    found = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in ("put", "patch", "post", "delete"):
                body = op.get("requestBody", {}).get("content", {})
                example = next((media["example"] for media in body.values()), None)
                concrete = path.replace("{thread_id}", "outage").replace("{revision}", "1")
                for name in ("message_id", "compaction_id", "agent_name", "server_name",
                             "checkpoint_id"):
                    concrete = concrete.replace(f"{{{name}}}", "x")
                found.append((method.upper(), concrete, example))
    return found


WRITES = writes()


@pytest.mark.parametrize("keys", [False, True], ids=["open", "keys"])
def test_every_request_to_a_stopped_database_is_a_503(cluster: Cluster, keys: bool) -> None:
    headers = bearer(create_key(cluster.url, "acme")) if keys else {}
    env = {"AGENTSTATE_AUTH_CACHE_SECONDS": str(AUTH_CACHE_SECONDS),
           "AGENTSTATE_LOG_FORMAT": "text"}
    with ServerProcess(cluster.url, env=env) as server, httpx.Client(
            base_url=server.base_url, headers=headers, timeout=30) as client:
        made = client.put("/v1/threads/outage", json={"state": {}},
                          headers={"If-None-Match": "*"})
        assert made.status_code == 201, made.text
        cluster.stop()
        try:
            time.sleep(AUTH_CACHE_SECONDS + 0.5)  # what the server read about keys expired
            answers = {}
            for method, path, body in [*WRITES, ("GET", "/v1/threads/outage", None)]:
                response = client.request(method, path, json=body,
                                          headers={"If-Match": "*"} if method != "POST" else {})
                answers[f"{method} {path}"] = response
            wrong = [f"{what}: {r.status_code} {r.json().get('code')}"
                     for what, r in answers.items()
                     if r.status_code != 503 or "retry-after" not in r.headers
                     or r.headers.get("connection") == "close"]
            assert not wrong, f"{len(wrong)} of {len(answers)}:\n" + "\n".join(wrong)
            for response in answers.values():
                assert response.headers["content-type"] == "application/problem+json"
                assert response.json()["code"] == "database_unavailable", response.text
                assert int(response.headers["retry-after"]) >= 1
        finally:
            cluster.start()
        back = client.patch("/v1/threads/outage", json={"state": {"back": True}},
                            headers={"If-Match": "*"})
        assert back.status_code == 200, "recovers without a restart: " + back.text
    assert "Traceback" not in server.logs()
    assert "unhandled" not in server.logs()
