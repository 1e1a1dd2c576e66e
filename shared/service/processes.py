"""numafit services in processes of their own, as they are deployed: `python -m svc_<name>`
with the common flags, ready once its /readyz answers 200.

Used where a measurement or a local stack must not share one event loop between services
(`numafit bench`): each process has its own interpreter, loop and GIL, as in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from pathlib import Path

MODULES = {
    "accounting": "svc_accounting",
    "refit": "svc_refit",
    "scheduler": "svc_scheduler",
    "deviceplugin": "svc_deviceplugin",
}
READY_TIMEOUT = 30.0
"""Seconds a service process may take to answer /readyz 200 (imports, NATS, ledger)."""
STOP_TIMEOUT = 5.0
"""Seconds between SIGTERM and SIGKILL when a process is stopped."""
READY_POLL = 0.02
"""Seconds between /readyz probes while a process starts (it offers no other signal)."""


class ProcessFailed(RuntimeError):
    """A service process exited, or did not become ready in time (its log's tail says why)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the usual race applies: bind it soon)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    metrics_port: int
    log: Path
    extra: dict[str, int] = field(default_factory=dict)
    """Other ports the process listens on (the scheduler's `listen`)."""

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def wait_ready(self, within: float = READY_TIMEOUT) -> None:
        """Until /readyz answers 200; ProcessFailed when the process exits or time runs out."""
        url = f"{self.metrics_url}/readyz"
        try:
            async with asyncio.timeout(within), aiohttp.ClientSession() as session:
                while True:
                    if self.process.poll() is not None:
                        raise ProcessFailed(
                            f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                        )
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(url) as response:
                            if response.status == 200:
                                return
                    await asyncio.sleep(READY_POLL)
        except TimeoutError:
            raise ProcessFailed(
                f"{self.name} not ready within {within:.0f}s:\n{self.tail()}"
            ) from None

    async def stop(self, grace: float = STOP_TIMEOUT) -> int:
        """SIGTERM (the service drains), SIGKILL after `grace` seconds; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(None, self.process.wait), grace)
        except TimeoutError:
            self.process.kill()
            return await loop.run_in_executor(None, self.process.wait)


def start_service(
    name: str,
    *,
    nats_url: str,
    kubeconfig: Path | str | None,
    log: Path,
    metrics_port: int | None = None,
    extra_args: tuple[str, ...] = (),
    log_level: str = "warning",
) -> ServiceProcess:
    """Start `python -m svc_<name>` (not yet ready: await `wait_ready`)."""
    port = metrics_port if metrics_port is not None else free_port()
    args = [
        sys.executable,
        "-m",
        MODULES[name],
        "--nats-url",
        nats_url,
        "--metrics-host",
        "127.0.0.1",
        "--metrics-port",
        str(port),
        "--log-level",
        log_level,
        "--log-format",
        "json",
    ]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig)]
    args += list(extra_args)
    env = dict(os.environ)
    env.pop("NUMAFIT_NATS_URL", None)  # the flags say where to connect, not the caller's shell
    with log.open("wb") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env)
    return ServiceProcess(name, process, port, log)
