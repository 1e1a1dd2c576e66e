"""numafit on the real control plane, deployed the way its Helm charts say.

`NumafitStack.start()` does on a `ControlPlane` what `helm install` of the three control-plane
charts (svc-scheduler, svc-accounting, svc-refit) and their kubelets would:

1. the chart CRDs (NodeResourceTopology) and the rendered ServiceAccounts and RBAC, applied;
2. each ServiceAccount's token from the TokenRequest API, as a kubeconfig;
3. the services as `numafit run ...` processes with the rendered Deployment's arguments
   (accounting with the chart's two replicas), on a private nats-server with JetStream;
   substituted: ports (free ones on 127.0.0.1), the serving certificate's paths, the kubeconfig;
4. the rendered webhook configurations, pointed at the extender's loopback URL;
5. kube-scheduler with the rendered KubeSchedulerConfiguration (kubeconfig and extender URL
   substituted), running as its own ServiceAccount.

Interface: `extender_url`, `metrics(name)` (a service's /metrics text; names `scheduler`,
`refit`, `accounting-0`, `accounting-1`), `children` (name -> Child), `accounting_replica(i)`
(start replica i again, e.g. after a kill), `kubeconfig_of(service_account)`, `nats_url`,
`scheduler_name`.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.core import partitions
from shared.testing.nats_server import NatsServer
from tests.real import chart
from tests.real.controlplane import ControlPlaneError, free_port
from tests.real.waiting import NotReached, poll

if TYPE_CHECKING:
    from shared.testing.realk8s.procs import Child
    from tests.real.controlplane import ControlPlane

NUMAFIT = str(Path(sys.executable).with_name("numafit"))
READY_WITHIN = 60.0
SUBSTITUTED = ("--metrics-port=", "--listen-port=", "--tls-cert-file=", "--tls-key-file=")
"""The rendered arguments a machine differs by (replaced, not kept beside the new values)."""


class NumafitStack:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.rendered = chart.Rendered(plane.ca_file.read_bytes())
        self.nats = NatsServer()
        self.nats_url = ""
        self.children: dict[str, Child] = {}
        self.metrics_ports: dict[str, int] = {}
        self.listen_port = free_port()
        self.extender_url = f"https://127.0.0.1:{self.listen_port}"
        self._kubeconfigs: dict[str, Path] = {}
        _, args = self.rendered.service_args("svc-scheduler")
        self.scheduler_name = _flag(args, "scheduler-name")

    def start(self) -> None:
        plane = self.plane
        plane.kubectl("create", "namespace", chart.NAMESPACE)
        plane.apply(chart.crds("svc-scheduler"))
        plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            "crd/noderesourcetopologies.topology.node.k8s.io",
        )  # fmt: skip
        plane.apply(self.rendered.identities_and_rbac())
        self.nats_url = self.nats.start()
        serving = plane.authority.issue(
            "numafit-scheduler",
            common_name="numafit-scheduler",
            dns=(f"numafit-scheduler.{chart.NAMESPACE}.svc", "localhost"),
            ips=("127.0.0.1",),
        )
        replicas = int(self.rendered.workload("svc-accounting")["spec"]["replicas"])
        for index in range(replicas):
            self.accounting_replica(index)
        self._service("refit", "svc-refit")
        self._service(
            "scheduler",
            "svc-scheduler",
            [
                f"--listen-port={self.listen_port}",
                "--listen-host=127.0.0.1",
                f"--tls-cert-file={serving.cert}",
                f"--tls-key-file={serving.key}",
            ],
        )
        for name in self.children:
            self._ready(name)
        self.wait_settled()
        plane.apply(self.rendered.webhooks(self.extender_url))
        account, rendered = self.rendered.kube_scheduler()
        config = chart.scheduler_config(
            rendered, kubeconfig=self.kubeconfig_of(account), extender_url=self.extender_url
        )
        self.children["kube-scheduler"] = plane.start_scheduler(config, "numafit-kube-scheduler")

    def stop(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop()
        self.nats.stop()

    def kubeconfig_of(self, service_account: str) -> Path:
        if service_account not in self._kubeconfigs:
            self._kubeconfigs[service_account] = self.plane.service_account_kubeconfig(
                chart.NAMESPACE, service_account
            )
        return self._kubeconfigs[service_account]

    def accounting_replica(self, index: int) -> Child:
        """Accounting replica `index` (replica id numafit-accounting-<index>, as a pod of the
        Deployment would be named), started and ready."""
        name = f"accounting-{index}"
        self._service(name, "svc-accounting", env={"NUMAFIT_REPLICA_ID": self.replica_id(name)})
        self._ready(name)
        return self.children[name]

    def wait_settled(self, within: float = READY_WITHIN) -> None:
        """Until each running accounting replica serves the partitions rendezvous hashing gives
        it among the running ones: a replica that just started takes partitions over from the
        others, and a request for a node being handed over waits or times out meanwhile. (A
        readiness wait, not an assertion: the share is the core's to decide.)"""

        def owned() -> dict[str, float]:
            return {
                n: self.sample(n, "numafit_accounting_partitions_owned")
                for n in self.accounting_replicas()
            }

        def settled() -> bool:
            shares = owned()
            members = [self.replica_id(n) for n in shares]
            total = int(self.sample(next(iter(shares)), "numafit_accounting_partitions_total"))
            return all(
                share == len(partitions.targets(self.replica_id(n), total, members))
                for n, share in shares.items()
            )

        poll(settled, within=within, what="accounting partitions settled", last=owned)

    @staticmethod
    def replica_id(name: str) -> str:
        """The replica id of accounting replica `accounting-<i>`: a pod name of the chart's
        Deployment would be there."""
        return f"{chart.RELEASE}-{name}"

    def accounting_replicas(self) -> list[str]:
        """Names of the accounting replicas running now."""
        return [n for n, c in self.children.items() if n.startswith("accounting-") and c.alive()]

    def _service(
        self,
        name: str,
        chart_name: str,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        account, rendered = self.rendered.service_args(chart_name)
        port = free_port()
        args = [a for a in rendered if not a.startswith(SUBSTITUTED)]
        args += [
            f"--metrics-port={port}",
            "--metrics-host=127.0.0.1",
            f"--kubeconfig={self.kubeconfig_of(account)}",
            *(extra or []),
        ]
        environment = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        environment |= {"NUMAFIT_NATS_URL": self.nats_url, **(env or {})}
        self.metrics_ports[name] = port
        self.children[name] = self.plane.processes.start(name, [NUMAFIT, *args], env=environment)

    def _ready(self, name: str) -> None:
        child = self.children[name]

        def ready() -> bool:
            if not child.alive():
                raise ControlPlaneError(f"{name} exited:\n{child.tail()}")
            try:
                return _get(f"http://127.0.0.1:{self.metrics_ports[name]}/readyz")[0] == 200
            except OSError:
                return False

        try:
            poll(ready, within=READY_WITHIN, what=f"{name} ready")
        except NotReached as exc:
            raise ControlPlaneError(f"{exc}\n{child.tail()}") from None

    def metrics(self, name: str) -> str:
        return _get(f"http://127.0.0.1:{self.metrics_ports[name]}/metrics")[1]

    def sample(self, name: str, series: str) -> float:
        """One sample of a service's /metrics, e.g. `numafit_scheduler_filter_total{result="fit"}`
        (0 when the series is absent)."""
        for line in self.metrics(name).splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def _flag(args: list[str], name: str) -> str:
    prefix = f"--{name}="
    return next(a[len(prefix) :] for a in args if a.startswith(prefix))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: Any = response.read()
            return int(response.status), body.decode()
    except urllib.error.HTTPError as exc:
        exc.close()  # its response holds the connection
        return exc.code, ""
