"""`agentstate serve --workers N` spreads connections over its workers.

Keep-alive clients stay with the worker that accepted them, so a worker that accepts more
than its share stays the bottleneck for as long as those clients live.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.support import ServerProcess, pool_in_use

pytestmark = pytest.mark.slow  # every test here starts `agentstate serve --workers 2`

CONNECTIONS = 64


def sockets_on(port: int, state: str) -> set[str]:
    """Inodes of the TCP sockets bound to `port` in `state` (01 established, 0A listening)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == state:
                found.add(f"socket:[{fields[9]}]")
    return found


def established_per_worker(server: ServerProcess) -> list[int]:
    """Established connections to the server's port held by each worker process."""
    inodes = sockets_on(server.port, "01")
    assert server.process is not None
    pid = server.process.pid
    workers = [child for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
               if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]
    counts = []
    for worker in workers:
        fds = Path(f"/proc/{worker}/fd")
        held = 0
        for fd in os.listdir(fds):
            try:
                held += os.readlink(fds / fd) in inodes
            except OSError:
                continue
        counts.append(held)
    return counts


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="needs SO_REUSEPORT")
def test_keep_alive_connections_are_spread_over_the_workers(database_url: str) -> None:
    with ServerProcess(database_url, args=("--workers", "2")) as server:
        # /healthz answers as soon as one worker is up; each worker listens on its own socket.
        deadline = time.monotonic() + 30
        while len(sockets_on(server.port, "0A")) < 2:
            assert time.monotonic() < deadline, "the workers never listened on sockets of their own"
            time.sleep(0.05)
        clients = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
                   for _ in range(CONNECTIONS)]
        try:
            for client in clients:
                client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            for client in clients:
                assert client.recv(4096).startswith(b"HTTP/1.1 200")
            counts = established_per_worker(server)
        finally:
            for client in clients:
                client.close()
    assert sum(counts) == CONNECTIONS and len(counts) == 2, counts
    # The kernel hashes each connection to a worker: 64 coin flips, so a worker below 16
    # (four standard deviations from 32) would mean the connections are not being spread.
    assert min(counts) >= 16, counts


def test_metrics_count_the_requests_of_every_worker(database_url: str) -> None:
    """Whichever worker a scrape reaches, /metrics counts what all of them served."""
    served = 40
    line = re.compile(r'^agentstate_http_requests_total\{method="GET",route="/healthz",'
                      r'status="200"\} (\S+)$', re.MULTILINE)
    with ServerProcess(database_url, args=("--workers", "2")) as server:
        deadline = time.monotonic() + 30
        while len(sockets_on(server.port, "0A")) < 2:
            assert time.monotonic() < deadline, "the workers never listened"
            time.sleep(0.05)

        def healthz_count() -> float:
            match = line.search(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
            assert match, "no /healthz counter in /metrics"
            return float(match.group(1))

        before = healthz_count()  # ServerProcess polled /healthz until the server was up
        # A new connection per request, so the kernel spreads them over both workers.
        for _ in range(served):
            assert httpx.get(f"{server.base_url}/healthz", timeout=10).status_code == 200
        counts = {healthz_count() - before for _ in range(10)}
        in_use = pool_in_use(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
    assert counts == {served}, counts
    assert in_use == 0
