"""A real Kubernetes control plane on 127.0.0.1 for tests: etcd, kube-apiserver,
kube-controller-manager and, on request, kube-scheduler (upstream binaries, envtest's
KUBEBUILDER_ASSETS convention).

    with ControlPlane.started(assets, tmp) as cp:
        cp.kubectl("get", "nodes")
        cp.service_account_kubeconfig("numafit-system", "numafit-accounting")
        cp.start_scheduler(config)     # a KubeSchedulerConfiguration (dict)

Interface (what the other real-tier fixtures and tests use):

- `server` (https URL), `ca_file` (the CA of every certificate here), `admin_token` and
  `kubeconfig` (an admin in system:masters), `tmp` (this control plane's directory: logs in
  `tmp/logs`, certificates in `tmp/pki`);
- `kubectl(*args, input=None, check=True)` (admin), `kubectl_json(*args)`, `apply(objects)`;
- `token_kubeconfig(name, token)`, `service_account_token(ns, name)` (TokenRequest),
  `service_account_kubeconfig(ns, name)`, `user_kubeconfig(name, user, groups)` (a client
  certificate signed by the API server's client CA: e.g. `system:node:<node>` in
  `system:nodes` for a kubelet under the Node authorizer), `authority` (to issue serving
  certificates for webhooks and extenders);
- `start_scheduler(config, name)` (health checked), `processes` (every child, stopped by
  `stop()`).

kube-apiserver authorizes with Node,RBAC and admits with its default plugins plus
NodeRestriction; kube-controller-manager runs every default controller with the node monitor
grace period raised to an hour, so Nodes without a kubelet (status set by the test) stay Ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from shared.testing.realk8s import pki
from shared.testing.realk8s.procs import Child, Processes
from tests.real.waiting import NotReached, poll

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
SERVICE_CIDR = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"
START_WITHIN = 90.0
"""Seconds each component gets to become healthy (about 5 s here; a loaded 2-core CI runner
is slower)."""
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # The tests' own admin (and kube-controller-manager, which runs as it) is not audited:
        # the log is there to judge everybody else's rights (numafit's service accounts,
        # kube-scheduler, kubelets).
        {"level": "None", "users": ["admin"]},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*", "/version"]},
        {"level": "Metadata"},
    ],
}
"""One line per request at ResponseComplete: who, what, and the answer's code."""
NODE_MONITOR_GRACE = "1h"
"""Nodes the tests create have no kubelet renewing their Lease: they stay Ready this long."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class Assets:
    """The binaries: kube-* (and kubelet, for the kubelet tier) from KUBEBUILDER_ASSETS, etcd
    from there when it has one, else from PATH."""

    directory: Path
    etcd: Path

    def binary(self, name: str) -> Path:
        return self.directory / name

    @classmethod
    def find(cls, environ: dict[str, str] | None = None) -> Assets | str:
        """The assets, or why the real tier cannot run (one line)."""
        env = os.environ if environ is None else environ
        named = env.get("KUBEBUILDER_ASSETS", "")
        if not named:
            return "real tier: KUBEBUILDER_ASSETS not set (see README: make test-real)"
        directory = Path(named).resolve()
        missing = [b for b in BINARIES if not os.access(directory / b, os.X_OK)]
        if missing:
            return f"real tier: KUBEBUILDER_ASSETS={named} lacks {', '.join(missing)}"
        etcd = directory / "etcd"
        if not os.access(etcd, os.X_OK):
            found = shutil.which("etcd")
            if found is None:
                return f"real tier: no etcd in KUBEBUILDER_ASSETS={named} nor on PATH"
            etcd = Path(found)
        if shutil.which("openssl") is None:
            return "real tier: openssl not on PATH (it makes the certificates)"
        return cls(directory, etcd)


class ControlPlaneError(RuntimeError):
    pass


class ControlPlane:
    def __init__(self, assets: Assets, tmp: Path) -> None:
        self.assets = assets
        self.tmp = tmp
        self.processes = Processes(tmp / "logs")
        self.authority = pki.Authority(tmp / "pki")
        self.admin_token = secrets.token_hex(16)
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.ca_file = self.authority.cert
        self.kubeconfig = self.token_kubeconfig("admin", self.admin_token)
        self.audit_log = tmp / "logs" / "audit.log"
        self._ssl = ssl.create_default_context(cafile=str(self.ca_file))

    # --- lifecycle ------------------------------------------------------------------------

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
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url)
        self._start_controller_manager()
        # Pods can be created once the namespace's default ServiceAccount exists (made by
        # kube-controller-manager; the ServiceAccount admission plugin refuses pods before).
        self._healthy(
            "default ServiceAccount",
            lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
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
                "--name=real-tier",
                f"--data-dir={self.tmp / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=real-tier=http://127.0.0.1:{peer}",
                "--log-level=warn",
            ],
        )
        self._healthy("etcd", lambda: _http_ok(f"{url}/health", None), child)
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        pki_dir = self.tmp / "pki"
        serving = self.authority.issue(
            "apiserver",
            common_name="kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ips=("127.0.0.1", "10.96.0.1"),
        )
        keys = pki.signing_key(pki_dir)
        tokens = pki_dir / "tokens.csv"
        tokens.write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        policy = pki_dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        binary = self.assets.binary("kube-apiserver")
        child = self.processes.start(
            "kube-apiserver",
            [
                str(binary),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={pki_dir}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca_file}",
                f"--token-auth-file={tokens}",
                f"--service-account-key-file={keys.cert}",
                f"--service-account-signing-key-file={keys.key}",
                f"--service-account-issuer={ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",
                "--profiling=false",
            ],
        )
        self._healthy("kube-apiserver", lambda: self._get("/readyz") == 200, child)

    def _start_controller_manager(self) -> None:
        keys = self.tmp / "pki"
        child = self.processes.start(
            "kube-controller-manager",
            [
                str(self.assets.binary("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={(port := free_port())}",
                f"--cert-dir={self.tmp / 'kcm'}",
                f"--service-account-private-key-file={keys / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                f"--cluster-signing-cert-file={self.ca_file}",
                f"--cluster-signing-key-file={self.authority.key}",
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

    def start_scheduler(self, config: dict[str, Any], name: str = "kube-scheduler") -> Child:
        """kube-scheduler with `config` (a KubeSchedulerConfiguration; its clientConnection
        names the kubeconfig it runs with), once its /healthz answers ok."""
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        kubeconfig = config.get("clientConnection", {}).get("kubeconfig") or self.kubeconfig
        child = self.processes.start(
            name,
            [
                str(self.assets.binary("kube-scheduler")),
                f"--config={path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.tmp / name}",
            ],
        )
        self._healthy(name, lambda: _http_ok(f"https://127.0.0.1:{port}/healthz"), child)
        return child

    def _healthy(self, what: str, check: Any, child: Child | None) -> None:
        def answered() -> bool:
            if child is not None and not child.alive():
                raise ControlPlaneError(
                    f"{what} exited {child.process.returncode}:\n{child.tail()}"
                )
            try:
                return bool(check())
            except OSError:
                return False

        try:
            poll(answered, within=START_WITHIN, what=f"{what} healthy")
        except NotReached as exc:
            log = "" if child is None else f"\n{child.tail()}"
            raise ControlPlaneError(f"{exc}{log}") from None

    def audit_events(self, user_prefix: str = "") -> list[dict[str, Any]]:
        """Every audited request so far (ResponseComplete, or Panic) of users whose name
        starts with `user_prefix`."""
        events: list[dict[str, Any]] = []
        with contextlib.suppress(FileNotFoundError), self.audit_log.open() as log:
            for line in log:
                with contextlib.suppress(json.JSONDecodeError):
                    event = json.loads(line)
                    if event.get("user", {}).get("username", "").startswith(user_prefix):
                        events.append(event)
        return events

    # --- clients --------------------------------------------------------------------------

    def _get(self, path: str) -> int:
        request = urllib.request.Request(
            self.server + path, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        try:
            with urllib.request.urlopen(request, context=self._ssl, timeout=5) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as exc:
            exc.close()  # its response holds the connection
            return exc.code

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl ARGS` as the admin (or with `kubeconfig`); with `check`, a failure raises
        with kubectl's stderr."""
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, objects: Sequence[dict[str, Any]], *, server_side: bool = False) -> None:
        listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        extra = ("--server-side", "--force-conflicts") if server_side else ()
        self.kubectl("apply", *extra, "-f", "-", input=json.dumps(listed))

    def token_kubeconfig(self, name: str, token: str) -> Path:
        return self._kubeconfig(name, {"token": token})

    def user_kubeconfig(self, name: str, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig authenticating as `user` in `groups` with a client certificate."""
        pair = self.authority.issue(f"client-{name}", common_name=user, organizations=groups)
        return self._kubeconfig(
            name, {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
        )

    def service_account_token(self, namespace: str, name: str, duration: str = "12h") -> str:
        """A token of ServiceAccount `namespace/name` from the TokenRequest API (as the kubelet
        projects into a pod)."""
        created = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}")
        return created.stdout.strip()

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        return self.token_kubeconfig(
            f"sa-{namespace}-{name}", self.service_account_token(namespace, name)
        )

    def _kubeconfig(self, name: str, user: dict[str, str]) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "real",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": "real", "user": name}}],
            "current-context": name,
        }
        directory = self.tmp / "kubeconfigs"
        directory.mkdir(exist_ok=True)
        path = directory / name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """GET `url` answers 200 (certificates not verified: components' self-signed ones)."""
    if url.startswith("https") and context is None:
        context = ssl._create_unverified_context()  # health of loopback components only
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError as exc:
        exc.close()  # its response holds the connection: closed now, not at garbage collection
        return False
