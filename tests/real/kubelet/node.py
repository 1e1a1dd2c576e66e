"""The kubelet tier's GPU node: containerd, a real kubelet seeing two NUMA nodes, and numafit's
device plugin, joined to the real control plane and numafit's stack (tests/real/stack.py).

One node serves every test: `use(policy)` restarts kubelet with another Topology Manager
policy only when a test needs a different one (tests are grouped by policy), and `run(case)`
creates a case's pod, waits until it runs or is refused and accounting has settled, records
what every party shows (observe.PodSeen), and deletes it, so each case starts on an idle node.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from typing import TYPE_CHECKING, Any

from shared.service import natsconn
from shared.testing.realk8s.procs import Processes
from tests.raw_accounting import RawAccounting
from tests.real.kubelet import host, observe
from tests.real.kubelet.api import Api, ApiError
from tests.real.kubelet.cases import NAMESPACE, NODE
from tests.real.kubelet.containerd import Containerd
from tests.real.kubelet.deviceplugin import GPU_NUMA, REPLICAS, DevicePlugin
from tests.real.kubelet.kubelet import Kubelet
from tests.real.waiting import poll

if TYPE_CHECKING:
    from pathlib import Path

    from tests.real.controlplane import Assets, ControlPlane
    from tests.real.kubelet.cases import Case
    from tests.real.stack import NumafitStack

GPU_RESOURCE = "nvidia.com/gpu"
RUN_WITHIN = 90.0
"""Seconds a pod gets to run or be refused: kube-scheduler's backoff after a refusal reaches
10 s, and a loaded 2-core runner is slow."""
SETTLE_WITHIN = 30.0


def heartbeat(condition: dict[str, Any]) -> float:
    """A node condition's lastHeartbeatTime (RFC 3339, whole seconds) as a Unix time."""
    stamp = condition.get("lastHeartbeatTime")
    if not stamp:
        return 0.0
    return (
        datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
        .replace(tzinfo=datetime.UTC)
        .timestamp()
    )


def scheduling(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's PodScheduled condition ({} before kube-scheduler wrote one)."""
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "PodScheduled":
            found: dict[str, Any] = condition
            return found
    return {}


class RealNode:
    def __init__(
        self, assets: Assets, plane: ControlPlane, stack: NumafitStack, directory: Path
    ) -> None:
        self.plane = plane
        self.stack = stack
        self.directory = directory
        self.api = Api(plane.server, plane.admin_token, plane.ca_file)
        self.processes = Processes(directory / "logs")
        self.containerd = Containerd(directory / "containerd", self.processes)
        self.kubelet = Kubelet(
            assets.binary("kubelet"),
            directory / "kubelet",
            self.processes,
            node=NODE,
            kubeconfig=plane.user_kubeconfig("kubelet", f"system:node:{NODE}", ["system:nodes"]),
            containerd_endpoint=self.containerd.endpoint,
        )
        self.plugin = DevicePlugin(directory / "deviceplugin", self.processes, stack.nats_url, NODE)

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, policy: str) -> None:
        host.clean_kubelet_leftovers()  # a run killed before its teardown
        self.containerd.start()
        self.kubelet.prepare_root()
        self.kubelet.start(policy)
        self.plugin.start()
        if not self.api.exists(f"/api/v1/namespaces/{NAMESPACE}"):
            self.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        # Pods are refused until kube-controller-manager made the namespace's ServiceAccount.
        poll(
            lambda: self.api.exists(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
            within=SETTLE_WITHIN,
            what=f"the default ServiceAccount of {NAMESPACE}",
        )
        self.wait_node_ready()

    def stop(self) -> None:
        """Everything this node started or left, whatever state it is in."""
        with contextlib.suppress(Exception):
            self._force_delete_pods()
        self.plugin.stop()
        self.kubelet.stop()
        self.containerd.stop()
        host.clean_kubelet_leftovers()
        with contextlib.suppress(Exception):
            self.api.delete(f"/api/v1/nodes/{NODE}")
        self.processes.stop_all()

    def use(self, policy: str) -> RealNode:
        """This node with kubelet on `policy` (restarted only if it runs another)."""
        if self.kubelet.policy != policy:
            self.assert_idle()
            self.kubelet.restart(policy)
            self.wait_node_ready()
            self.wait_cpus_released()
        return self

    def wait_cpus_released(self) -> None:
        """Until kubelet's CPU manager holds no pod's CPUs. A restarted kubelet keeps the
        assignments of pods deleted just before (its checkpoint) until its reconcile loop,
        once its pod sources are ready, drops them: an admission before that finds no free
        exclusive CPU (`not enough cpus available to satisfy request`)."""
        poll(
            lambda: not self.kubelet.cpu_assignments(),
            within=SETTLE_WITHIN,
            what="kubelet's CPU manager released every CPU",
            last=self.kubelet.cpu_assignments,
        )

    def wait_node_ready(self) -> None:
        """Ready, untainted, every GPU replica allocatable, and the inventory in accounting."""

        def ready() -> bool:
            self.check_alive()
            node = self.api.node(NODE)
            conditions = {c["type"]: c for c in node["status"].get("conditions", [])}
            ready = conditions.get("Ready", {})
            allocatable = node["status"].get("allocatable", {})
            return (
                ready.get("status") == "True"
                # Reported by this kubelet, not the one before a restart: a restarted kubelet
                # is NotReady for a moment, kube-controller-manager taints the node, and a pod
                # kube-scheduler finds it tainted may wait minutes for its next try.
                and heartbeat(ready) >= int(self.kubelet.started)
                and not node["spec"].get("taints")
                and allocatable.get(GPU_RESOURCE) == str(REPLICAS * len(GPU_NUMA))
            )

        poll(ready, within=RUN_WITHIN, what=f"node {NODE} ready", last=self._node_summary)
        replicas = REPLICAS * len(GPU_NUMA)
        poll(
            lambda: self.kubelet.healthy_devices(GPU_RESOURCE) == replicas,
            within=RUN_WITHIN,
            what=f"kubelet itself holds {replicas} healthy {GPU_RESOURCE}",
            last=lambda: self.kubelet.healthy_devices(GPU_RESOURCE),
        )
        poll(
            lambda: self.health() == dict.fromkeys(GPU_NUMA, True),
            within=SETTLE_WITHIN,
            what="accounting holds the node's healthy inventory",
            last=self.health,
        )

    def check_alive(self) -> None:
        """Fail at once, with its log, if kubelet or the plugin has exited (instead of waiting
        out a bound for something that cannot happen any more)."""
        self.plugin.check_alive()
        if self.kubelet.child is not None and not self.kubelet.alive:
            raise AssertionError(f"kubelet exited:\n{self.kubelet.log()}")

    def _node_summary(self) -> object:
        try:
            node = self.api.node(NODE)
        except ApiError as exc:
            return exc
        return {
            "conditions": node["status"].get("conditions"),
            "taints": node["spec"].get("taints"),
            "allocatable": node["status"].get("allocatable"),
        }

    def pods_on_node(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = self.api.get(
            "/api/v1/pods", fieldSelector=f"spec.nodeName={NODE}"
        )["items"]
        return listed

    def assert_idle(self) -> None:
        left = [
            f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in self.pods_on_node()
        ]
        assert not left, f"pods left on the node: {left}"

    def _force_delete_pods(self) -> None:
        for pod in self.pods_on_node():
            meta = pod["metadata"]
            self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", grace_seconds=0
            )

    # --- GPU health -----------------------------------------------------------------------

    def health(self) -> dict[str, bool]:
        """GPU -> healthy, as accounting's inventory of the node says."""
        reply = self.accounting("snapshot", {})
        nodes = reply.get("nodes") or []
        if not nodes or nodes[0].get("devices") is None:
            return {}
        return {d["id"]: bool(d["health"]) for d in nodes[0]["devices"]}

    def lose(self, gpus: tuple[str, ...]) -> None:
        """XIDs on `gpus`, until kubelet and accounting both see them unhealthy."""
        for uuid in gpus:
            self.plugin.inject_xid(uuid)
        healthy = REPLICAS * (len(GPU_NUMA) - len(gpus))
        poll(
            lambda: self.api.node(NODE)["status"]["allocatable"].get(GPU_RESOURCE) == str(healthy),
            within=SETTLE_WITHIN,
            what=f"kubelet sees {healthy} healthy replicas",
            last=self._node_summary,
        )
        poll(
            lambda: self.health() == {u: u not in gpus for u in GPU_NUMA},
            within=SETTLE_WITHIN,
            what=f"accounting sees {', '.join(gpus)} unhealthy",
            last=self.health,
        )

    def heal(self) -> None:
        """A fresh plugin (XIDs do not heal within one plugin's lifetime)."""
        self.plugin.restart()
        self.wait_node_ready()

    # --- accounting -----------------------------------------------------------------------

    def accounting(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            nc = (await natsconn.connect(self.stack.nats_url, "kubelet-tier")).client
            try:
                return await RawAccounting(nc, default_timeout=5.0).call(op, NODE, body)
            finally:
                await nc.close()

        reply = asyncio.run(call())
        assert reply.get("ok") is True, reply
        return reply

    def ledger_pod(self, uid: str) -> dict[str, Any] | None:
        """Accounting's record of pod `uid` (its annotations and `released`), or None."""
        reply = self.accounting("snapshot", {})
        for node in reply.get("nodes") or []:
            for entry in node["pods"]:
                if entry["pod"]["metadata"]["uid"] == uid:
                    found: dict[str, Any] = entry
                    return found
        return None

    def reserved_memory(self) -> dict[str, float]:
        """MiB accounting holds per GPU of the node, from its replicas' /metrics."""
        prefix = f'numafit_accounting_device_memory_reserved_mib{{node="{NODE}",uuid="'
        found: dict[str, float] = {}
        for name in self.stack.accounting_replicas():
            for line in self.stack.metrics(name).splitlines():
                if line.startswith(prefix):
                    found[line[len(prefix) :].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
        return found

    # --- running a case -------------------------------------------------------------------

    def run(self, case: Case, *, keep: bool = False, alone: bool = True) -> observe.PodSeen:
        """Create the case's pod, wait for its outcome, record it, delete it (unless `keep`).
        `alone`: on an idle node (no other pod)."""
        assert self.kubelet.policy == case.policy, (self.kubelet.policy, case.policy)
        if alone:
            self.assert_idle()
        if case.unhealthy:
            self.lose(case.unhealthy)
        before = self.plugin.metrics()
        created = self.api.create(f"/api/v1/namespaces/{case.namespace}/pods", case.manifest())
        uid = created["metadata"]["uid"]
        try:
            pod = poll(
                lambda: self._outcome(case, uid),
                within=RUN_WITHIN,
                what=f"pod {case.name} running or refused",
                last=lambda: self._describe(case),
            )
            self._settle(case, uid, pod)
            seen = self._record(case, uid, before)
        finally:
            if not keep:
                self.delete(case.namespace, case.name, uid)
                if case.unhealthy:
                    self.heal()
        return seen

    def _describe(self, case: Case) -> str:
        described = self.plane.kubectl(
            "describe", "pod", case.name, "-n", case.namespace, check=False
        )
        return described.stdout[-2500:]

    def _outcome(self, case: Case, uid: str) -> dict[str, Any] | None:
        """The pod once it is Failed, or Running with every container's report written."""
        self.check_alive()
        pod = self.api.pod(case.namespace, case.name)
        phase = pod["status"].get("phase")
        if phase == "Failed":
            return pod
        if case.unschedulable and scheduling(pod).get("reason") == "Unschedulable":
            return pod
        if phase != "Running":
            return None
        for box in case.boxes:
            if "Cpus_allowed_list" not in observe.container_output(
                case.namespace, case.name, uid, box.name
            ):
                return None
        return pod

    def _settle(self, case: Case, uid: str, pod: dict[str, Any]) -> None:
        """Until accounting's ledger has caught up with the pod (its watch lags the API)."""

        def hami(annotations: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in annotations.items() if k.startswith(observe.HAMI_PREFIX)}

        def settled() -> bool:
            current = self.api.pod(case.namespace, case.name)
            held = self.ledger_pod(uid)
            phase = current["status"].get("phase")
            if phase == "Failed":
                # kubelet may write the refused pod's phase before its containers' final
                # statuses (terminated; a pod refused for its topology gets none).
                statuses = current["status"].get("containerStatuses") or []
                final = all("terminated" in (s.get("state") or {}) for s in statuses)
                return held is None and final  # a refused pod holds nothing
            if phase != "Running":
                return held is None  # nor does one never scheduled
            if held is None:
                return False
            same = hami(held["pod"]["metadata"]["annotations"]) == hami(
                current["metadata"].get("annotations", {})
            )
            # With init containers: until accounting shrank the pod to its steady state.
            return same and (not case.init_boxes or bool(held["released"]))

        poll(
            settled,
            within=SETTLE_WITHIN,
            what=f"accounting settled on pod {case.name}",
            last=lambda: self.ledger_pod(uid),
        )

    def _record(self, case: Case, uid: str, before: str) -> observe.PodSeen:
        pod = self.api.pod(case.namespace, case.name)
        annotations = pod["metadata"].get("annotations", {})
        held = self.ledger_pod(uid)
        ledger_annotations = {} if held is None else held["pod"]["metadata"]["annotations"]
        allocated = observe.entries(annotations.get(observe.ALLOCATED, ""))
        ledger = observe.entries(ledger_annotations.get(observe.ALLOCATED, ""))
        replicas = observe.checkpoint_devices(uid)
        containers = []
        for index, box in enumerate((*case.init_boxes, *case.app_boxes)):
            output = observe.container_output(case.namespace, case.name, uid, box.name)
            gpus = output.get("gpus")
            containers.append(
                observe.ContainerSeen(
                    name=box.name,
                    init=box.init,
                    gpus=tuple(sorted(gpus.split(","))) if gpus else (),
                    cpus=output.get("Cpus_allowed_list"),
                    replicas=replicas.get(box.name, ()),
                    allocated=allocated[index] if index < len(allocated) else (),
                    ledger=ledger[index] if index < len(ledger) else (),
                )
            )
        after = self.plugin.metrics()
        status = pod["status"]
        # An unscheduled pod's reason is in its PodScheduled condition, as kube-scheduler
        # writes it; a pod kubelet refused has it in the status itself.
        said = scheduling(pod) if status.get("phase") == "Pending" else status
        return observe.PodSeen(
            case=case,
            namespace=case.namespace,
            uid=uid,
            phase=status.get("phase", ""),
            reason=said.get("reason", ""),
            message=said.get("message", ""),
            annotations=annotations,
            container_statuses=[
                *status.get("initContainerStatuses", []),
                *status.get("containerStatuses", []),
            ],
            events=self.events(case.namespace, uid),
            containers=containers,
            reserved_memory=self.reserved_memory(),
            refits=observe.refit_results(after) - observe.refit_results(before),
            allocations=observe.allocations_ok(after) - observe.allocations_ok(before),
            ledger_released=None if held is None else bool(held["released"]),
            kubelet_version=self.api.node(NODE)["status"]["nodeInfo"]["kubeletVersion"],
            spec=pod["spec"],
        )

    def events(self, namespace: str, uid: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of every event about pod `uid`."""
        return [
            (e.get("type", ""), e.get("reason", ""), e.get("message", ""))
            for e in self.api.events(namespace, uid)
        ]

    def delete(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod and wait until kubelet, the API server and accounting let it go."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        self.api.delete(path)
        poll(
            lambda: not self.api.exists(path),
            within=RUN_WITHIN,
            what=f"pod {name} deleted",
        )
        poll(
            lambda: self.ledger_pod(uid) is None,
            within=SETTLE_WITHIN,
            what=f"accounting released pod {name}",
        )
