"""etcd, kube-apiserver and kube-controller-manager on 127.0.0.1, and kube-schedulers on
request, each a child process with its log in `tmp/logs`.

The API server authenticates one admin (a static token in `system:masters`) and authorizes
with Node,RBAC; kube-controller-manager runs every default controller (it makes each
namespace's `default` ServiceAccount, without which pods cannot be created, and lifts the
`not-ready` taint of new Nodes once their status says Ready), with the node monitor grace
period raised to an hour, so that Nodes without a kubelet stay Ready once their status is set.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import yaml

from shared.testing.realk8s import pki
from shared.testing.realk8s.procs import Processes

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    from shared.testing.realk8s.assets import Assets
    from shared.testing.realk8s.procs import Child

SERVICE_CIDR = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
START_WITHIN = 90.0
"""Seconds each component gets to become healthy (about 5 s on a 2-core machine)."""
POLL = 0.1
"""Seconds between two health probes of a component that is starting."""
NODE_MONITOR_GRACE = "1h"


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ControlPlane:
    def __init__(self, assets: Assets, tmp: Path, port: int = 0) -> None:
        """`port`: the API server's secure port (0: a free one; `numafit up` names one)."""
        self.assets = assets
        self.tmp = tmp
        self.processes = Processes(tmp / "logs")
        self.authority = pki.Authority(tmp / "pki")
        self.admin_token = secrets.token_hex(16)
        self.port = port or free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.ca_file = self.authority.cert
        self.kubeconfig = self.token_kubeconfig("admin", self.admin_token)
        self._ssl = ssl.create_default_context(cafile=str(self.ca_file))

    @classmethod
    @contextlib.contextmanager
    def started(cls, assets: Assets, tmp: Path) -> Iterator[ControlPlane]:
        """A running control plane, stopped (every process group) however the block ends."""
        plane = cls(assets, tmp)
        try:
            plane.start()
            yield plane
        finally:
            plane.stop()

    def start(self) -> None:
        self._start_apiserver(self._start_etcd())
        self._start_controller_manager()
        self._healthy(
            "the default ServiceAccount",
            lambda: self.get_status("/api/v1/namespaces/default/serviceaccounts/default") == 200,
            None,
        )

    def stop(self) -> None:
        self.processes.stop_all()

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        child = self.processes.start(
            "etcd",
            [
                str(self.assets.etcd),
                "--name=realk8s",
                f"--data-dir={self.tmp / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=realk8s=http://127.0.0.1:{peer}",
                "--log-level=warn",
            ],
        )
        self._healthy("etcd", lambda: _http_ok(f"{url}/health"), child)
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        directory = self.tmp / "pki"
        serving = self.authority.issue(
            "apiserver",
            common_name="kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ips=("127.0.0.1", "10.96.0.1"),
        )
        keys = pki.signing_key(directory)
        tokens = directory / "tokens.csv"
        tokens.write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        child = self.processes.start(
            "kube-apiserver",
            [
                str(self.assets.binary("kube-apiserver")),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={directory}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca_file}",
                f"--token-auth-file={tokens}",
                f"--service-account-key-file={keys.cert}",
                f"--service-account-signing-key-file={keys.key}",
                f"--service-account-issuer={ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
            ],
        )
        self._healthy("kube-apiserver", lambda: self.get_status("/readyz") == 200, child)

    def _start_controller_manager(self) -> None:
        port = free_port()
        child = self.processes.start(
            "kube-controller-manager",
            [
                str(self.assets.binary("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.tmp / 'kcm'}",
                f"--service-account-private-key-file={self.tmp / 'pki' / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                "--use-service-account-credentials=false",
                "--controllers=*",
                "--leader-elect=false",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                "--profiling=false",
            ],
        )
        self._healthy(
            "kube-controller-manager", lambda: _http_ok(f"https://127.0.0.1:{port}/healthz"), child
        )

    def start_scheduler(
        self, config: dict[str, Any], name: str = "kube-scheduler", extra: Sequence[str] = ()
    ) -> tuple[Child, int]:
        """kube-scheduler with `config` (a KubeSchedulerConfiguration; without a
        clientConnection it runs as the admin), once /healthz answers; and its secure port
        (its /metrics, read with the admin token)."""
        config = dict(config)
        config.setdefault("clientConnection", {"kubeconfig": str(self.kubeconfig)})
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        child = self.processes.start(
            name,
            [
                str(self.assets.binary("kube-scheduler")),
                f"--config={path}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.tmp / name}",
                *extra,
            ],
        )
        self._healthy(name, lambda: _http_ok(f"https://127.0.0.1:{port}/healthz"), child)
        return child, port

    def _healthy(self, what: str, check: Callable[[], bool], child: Child | None) -> None:
        deadline = time.monotonic() + START_WITHIN
        while True:
            if child is not None and not child.alive():
                raise ControlPlaneError(
                    f"{what} exited {child.process.returncode}:\n{child.tail()}"
                )
            with contextlib.suppress(OSError):
                if check():
                    return
            if time.monotonic() >= deadline:
                log = "" if child is None else f"\n{child.tail()}"
                raise ControlPlaneError(f"{what} not healthy within {START_WITHIN:.0f} s{log}")
            time.sleep(POLL)  # a child process starting; bounded by START_WITHIN

    # --- clients --------------------------------------------------------------------------

    def get_status(self, path: str) -> int:
        """The status of an admin GET of `path`."""
        try:
            self.get(path)
        except urllib.error.HTTPError as exc:
            exc.close()  # its response holds the connection
            return exc.code
        return 200

    def get(self, path: str, *, url: str | None = None) -> bytes:
        """An admin GET of `path` on the API server (or on `url`, a component's secure port
        whose certificate is its own, not verified: loopback only)."""
        target = (url or self.server) + path
        context = self._ssl if url is None else ssl._create_unverified_context()
        request = urllib.request.Request(
            target, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            body: bytes = response.read()
            return body

    def get_json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def token_kubeconfig(self, name: str, token: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "realk8s",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "realk8s", "user": name}}],
            "current-context": name,
        }
        directory = self.tmp / "kubeconfigs"
        directory.mkdir(exist_ok=True)
        path = directory / name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path


def _http_ok(url: str) -> bool:
    """GET `url` answers 200 (a component's own self-signed certificate is not verified)."""
    context = ssl._create_unverified_context() if url.startswith("https") else None
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        exc.close()  # its response holds the connection: closed now, not at garbage collection
        return False
