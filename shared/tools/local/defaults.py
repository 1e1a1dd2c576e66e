"""What `numafit up` uses when not told otherwise, and the check that its ports are free.

Light on purpose (standard library only): `numafit --help` builds its parser from these
without importing the services.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from pathlib import Path

HOST = "127.0.0.1"
API_PORT = 8080
NATS_PORT = 4222
EXTENDER_PORT = 8888
METRICS_PORT_BASE = 9101
"""compose's ports: scheduler 9101, accounting 9102, refit 9103, device plugin 9104 (and one
more per further node)."""
SERVICES = ("scheduler", "accounting", "refit")
"""In metrics-port order; the device plugins follow, one per node."""
LOAD_RATE = 1.0
"""Pods per second `--load` creates."""
LOAD_MAX_PODS = 12
"""Load pods kept; the oldest is deleted beyond it."""
LOAD_NAMESPACE = "load"
SCRAPE_INTERVAL = "5s"


class StackError(RuntimeError):
    """The stack cannot start (the message is one line for the user)."""


def state_dir() -> Path:
    """Stable across runs, private to the user: $XDG_RUNTIME_DIR/numafit, else
    /tmp/numafit-<uid>."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "numafit"
    return Path(tempfile.gettempdir()) / f"numafit-{os.getuid()}"


def check_ports(host: str, ports: dict[str, int]) -> None:
    """Refuse, with one line, a port that is out of range, given twice, or already in use."""
    seen: dict[int, str] = {}
    for what, port in ports.items():
        if not 0 < port < 65536:
            raise StackError(f"port {port} for {what} is not a TCP port (1-65535)")
        if port in seen:
            raise StackError(f"port {port} is given to both {seen[port]} and {what}")
        seen[port] = what
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise StackError(
                        f"{host}:{port}, wanted for {what}, is already in use "
                        "(another `numafit up` or `docker compose up`?)"
                    ) from exc
                raise StackError(f"cannot listen on {host}:{port} for {what}: {exc}") from exc
