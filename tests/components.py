"""The real components a scaled deployment runs, started by the tests on free loopback ports:
PgBouncer and HAProxy (Debian's packages, fetched by scripts/fetch-tools) and private
Postgres clusters (initdb/pg_ctl in a temporary directory, never the shared one)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from sqlalchemy.engine import make_url

from tests.support import (
    ADMIN_URL,
    POOLER_PORTS,
    ROOT,
    agentstate,
    create_postgres_database,
    drop_postgres_database,
    free_port,
)


def fetch_tool(name: str) -> str:
    """The path of a tool scripts/fetch-tools provides (failing the test when it cannot)."""
    result = subprocess.run([str(ROOT / "scripts" / "fetch-tools"), name],
                            capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/fetch-tools {name} failed:\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, what: str,
                   timeout: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}: {log.read_text()[-2000:]}")


def unprivileged_account() -> str:
    """The account a daemon that refuses root runs as: postgres (the server's own), else
    nobody."""
    import pwd

    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("no unprivileged account (postgres, nobody) to run the daemon as")


class _Daemon:
    """A process of a component in a temporary directory of its own, until stopped."""

    dir: Path
    process: subprocess.Popen[bytes] | None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def migrated_postgres() -> Iterator[str]:
    """A migrated database of its own on the shared Postgres, reached directly."""
    url = create_postgres_database()
    try:
        assert agentstate(url, "migrate").returncode == 0
        yield url
    finally:
        drop_postgres_database(url)


class PgBouncer(_Daemon):
    """PgBouncer 1.18 in transaction pooling, in front of one Postgres.

    Its settings are the package's defaults (pool sizes, timeouts, no
    ignore_startup_parameters) but for what a private instance needs: the port, the files,
    trust authentication of the postgres role (as the server behind it), pool_mode.
    """

    def __init__(self, server_host: str = "127.0.0.1", server_port: int | None = None,
                 **overrides: str | int) -> None:
        admin = make_url(ADMIN_URL)
        self.server = (server_host, server_port or admin.port or 5432)
        self.user = admin.username or "postgres"
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentstate-pgbouncer-"))
        self.overrides = overrides
        self.process: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        host, port = self.server
        general = {
            "listen_addr": "127.0.0.1", "listen_port": self.port, "unix_socket_dir": "",
            "auth_type": "trust", "auth_file": self.dir / "users.txt",
            "logfile": self.dir / "pgbouncer.log", "pidfile": self.dir / "pgbouncer.pid",
            "pool_mode": "transaction", "admin_users": self.user, **self.overrides,
        }
        return (f"[databases]\n* = host={host} port={port}\n\n[pgbouncer]\n"
                + "".join(f"{name} = {value}\n" for name, value in general.items()))

    def start(self) -> Self:
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(self.config())
        command = [fetch_tool("pgbouncer"), str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root (CI is root)
            account = unprivileged_account()
            shutil.chown(self.dir, account)
            command.append(f"--user={account}")
        log = self.dir / "stdout.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.process, self.dir / "pgbouncer.log", "pgbouncer")
        POOLER_PORTS.add(self.port)
        return self

    def stop(self) -> None:
        # The port is free again once PgBouncer is gone: a later free_port() may hand it to
        # a private Postgres, which must not then be taken for a pooler.
        super().stop()
        POOLER_PORTS.discard(self.port)

    def repoint(self, host: str, port: int) -> None:
        """Send new server connections to another Postgres (a promoted standby): rewrite
        the [databases] line and reload (SIGHUP), as an operator's failover script does."""
        self.server = (host, port)
        (self.dir / "pgbouncer.ini").write_text(self.config())
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)

    def url(self, database_url: str) -> str:
        """`database_url` (a database on the server behind it) reached through PgBouncer."""
        return make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""



def pooled_environment(direct_url: str | None = None) -> dict[str, str]:
    """The settings of a server whose database URL goes through PgBouncer."""
    env = {"AGENTSTATE_DATABASE_POOLER": "transaction"}
    if direct_url:
        env["AGENTSTATE_DIRECT_DATABASE_URL"] = direct_url
    return env


def environ_without_pooler() -> dict[str, str]:
    return {name: value for name, value in os.environ.items()
            if name not in ("AGENTSTATE_DATABASE_POOLER", "AGENTSTATE_DIRECT_DATABASE_URL")}


class HAProxy(_Daemon):
    """HAProxy 2.6 balancing HTTP over agentstate instances, health-checking `/readyz`
    (every `check_ms`, each given 5 s; down after 2 failures, up after 2 successes), retrying a request
    whose connection to an instance failed on another one (`option redispatch`)."""

    def __init__(self, backends: list[int], check_ms: int = 1000) -> None:
        self.backends = backends
        self.check_ms = check_ms
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentstate-haproxy-"))
        self.socket = self.dir / "admin.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        servers = "".join(f"    server api{i} 127.0.0.1:{port} check\n"
                          for i, port in enumerate(self.backends))
        return f"""global
    maxconn 2000
    stats socket {self.socket} mode 600 level admin

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 10s
    timeout check 5s
    retries 3
    option redispatch 1
    option http-keep-alive

frontend api
    bind 127.0.0.1:{self.port}
    default_backend agentstate

backend agentstate
    balance roundrobin
    option httpchk
    http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    default-server inter {self.check_ms}ms fall 2 rise 2
{servers}"""

    def start(self) -> Self:
        (self.dir / "haproxy.cfg").write_text(self.config())
        log = self.dir / "haproxy.log"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [fetch_tool("haproxy"), "-db", "-f", str(self.dir / "haproxy.cfg")],
                stdout=out, stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.process, log, "haproxy")
        return self

    def states(self) -> dict[str, str]:
        """Each instance's state as HAProxy sees it (UP, DOWN, ...), from its stats socket;
        none yet while HAProxy has not opened it (it listens on its port first)."""
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(str(self.socket))
            except (FileNotFoundError, ConnectionRefusedError):
                return {}
            sock.sendall(b"show stat\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        header, *rows = data.decode().splitlines()
        names = header.lstrip("# ").split(",")
        states = {}
        for row in rows:
            values = dict(zip(names, row.split(","), strict=False))
            if values.get("svname", "").startswith("api"):
                states[values["svname"]] = values["status"].split()[0]
        return states

    def log(self) -> str:
        return (self.dir / "haproxy.log").read_text(errors="replace")



def postgres_bin(name: str) -> str:
    """A Postgres server program (initdb, pg_ctl, pg_basebackup): on PATH, else the newest
    of Debian's /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0)
    for bindir in reversed(versions):
        if (bindir / name).exists():
            return str(bindir / name)
    raise RuntimeError(f"{name} not found: install Debian's postgresql package")


class PrivatePostgres:
    """A Postgres cluster of the test's own (initdb in a temporary directory, its own port),
    which the test may crash: never the shared one. As root, it runs as the postgres
    account (Postgres refuses root)."""

    def __init__(self, root: Path | None = None, name: str = "primary") -> None:
        self.root = root or Path(tempfile.mkdtemp(prefix="agentstate-pg-"))
        self.name = name
        self.data = self.root / name
        self.port = free_port()
        self.account = unprivileged_account() if os.geteuid() == 0 else None
        if self.account:
            shutil.chown(self.root, self.account)

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = [postgres_bin(argv[0]), *argv[1:]]
        if self.account:
            command = ["runuser", "-u", self.account, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {done.stdout}{done.stderr}")
        return done

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def initdb(self, **settings: str) -> PrivatePostgres:
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                 "--no-sync")
        return self.configure(**settings)

    def configure(self, **settings: str) -> PrivatePostgres:
        lines = "".join(f"{name} = '{value}'\n" for name, value in {
            "port": str(self.port), "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root), "fsync": "off", **settings}.items())
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(lines)
        return self

    def start(self) -> PrivatePostgres:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.root / f"{self.name}.log"),
                 "-w", "-t", "60", "start")
        return self

    def basebackup(self, name: str = "standby", **settings: str) -> PrivatePostgres:
        """A streaming standby of this cluster (its `name` is the application_name it
        replicates as, what synchronous_standby_names names)."""
        standby = PrivatePostgres(self.root, name)
        self.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                 "-D", str(standby.data), "-R", "-X", "stream", "--no-sync")
        # Not the primary's synchronous_standby_names: promoted, it would wait for itself.
        return standby.configure(primary_conninfo=(
            f"host=127.0.0.1 port={self.port} user=postgres application_name={name}"),
            synchronous_standby_names="", **settings)

    def promote(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster and every process of it, as a crash of the machine would
        end them: nothing is flushed, no client is told."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        children = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
                    and _parent(int(entry.name)) == pid]
        for victim in [pid, *children]:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def log(self) -> str:
        path = self.root / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.postmaster_pid() is not None and self.data.exists():
            subprocess.run(
                [*(["runuser", "-u", self.account, "--"] if self.account else []),
                 postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"],
                capture_output=True, timeout=60, check=False)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])
