"""The listening socket of `agentstate serve`, and uvicorn run on it.

Bound (and listening) before the application starts, so a port another server holds is
refused in one line before anything else happens, and with several workers each has a socket
of its own (SO_REUSEPORT, see `WorkerSocket`).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
from typing import Any

from app.ops.startup import StartupError


def listen(host: str, port: int, workers: int) -> socket.socket:
    """The listening socket, or StartupError when another process holds the port.

    With more than one worker each worker listens on a socket of its own (SO_REUSEPORT, see
    WorkerSocket). The kernel lets any process of the same user join such a group, so a
    second server would silently take half the connections; a plain bind first proves the
    port is free (it fails while any socket, SO_REUSEPORT or not, is bound there).
    """
    if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
        _bind(host, port, socket.socket, reuseport=False).close()
        return _reuseport_socket(host, port, WorkerSocket)
    sock = _bind(host, port, socket.socket, reuseport=False)
    sock.listen(2048)
    return sock


def run_uvicorn(app: str, listener: socket.socket | None = None, **options: Any) -> bool:
    """uvicorn.run on `listener` (with a listening socket per worker, see WorkerSocket).

    Returns whether the server started (False: its lifespan refused, and said why).
    """
    import uvicorn

    workers = options.get("workers", 1)
    config = uvicorn.Config(app, **options)
    if listener is None:
        listener = listen(config.host, config.port, workers)
    if workers > 1 and isinstance(listener, WorkerSocket):
        from uvicorn.supervisors import Multiprocess

        from app.core.metrics import MULTIPROCESS_DIR

        logging.getLogger("agentstate.serve").info(
            "listening on %s:%d with %d workers, a socket each (SO_REUSEPORT)",
            config.host, listener.getsockname()[1], workers)
        # The workers' metrics, summed by whichever worker a scrape reaches (app/core/metrics.py).
        metrics_dir = tempfile.mkdtemp(prefix="agentstate-metrics-")
        os.environ[MULTIPROCESS_DIR] = metrics_dir
        try:
            Multiprocess(config, sockets=[listener]).run()
        finally:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        return True
    server = uvicorn.Server(config)
    server.run(sockets=[listener])
    return bool(server.started)


class WorkerSocket(socket.socket):
    """The listening address, handed to each worker as a socket of its own.

    uvicorn's workers accept from one shared socket, and the first awake takes the waiting
    connections: 16 keep-alive clients split 14/2 between two workers, so one worker was
    saturated while the other idled. With SO_REUSEPORT the kernel spreads new connections
    over one listening socket per worker. uvicorn hands its sockets to the workers it spawns
    by pickling them, and this one unpickles as a new socket bound to the same address. The
    supervisor's own is bound, to hold the port, but never listens, so it is never given a
    connection.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        host, port = self.getsockname()[:2]
        return _reuseport_socket, (host, port)


def _reuseport_socket(host: str, port: int,
                      cls: type[socket.socket] = socket.socket) -> socket.socket:
    return _bind(host, port, cls, reuseport=True)


def _bind(host: str, port: int, cls: type[socket.socket], *, reuseport: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = cls(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}"
                           + (" (another server runs there?)"
                              if exc.errno == errno.EADDRINUSE else "")) from None
    sock.set_inheritable(True)
    return sock



def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other host name may resolve to a public address
