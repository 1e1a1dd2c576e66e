"""Drives pods through the simulated cluster as the real components would.

kube-scheduler: create the pod (the API emulator runs the webhook), POST /filter with the node
names (nodeCacheCapable), /prioritize, pick the best-scored node, /bind. kubelet: admit the
containers in its order (init containers first) through the kubelet emulator, whose Topology
Manager and CPU manager call the real device plugin; on success the pod runs (its regular init
containers are reported exited 0), on an admission error it fails. Each step waits for
accounting to have seen the outcome, and for the scheduler to have seen the node's
NodeResourceTopology where it publishes one, so the next pod is decided on settled state.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.model import ContainerKind
from shared.core.pods import Alignment, parse_alignment, pod_from_object
from shared.core.replicas import physical_ids
from shared.service import kube_io
from shared.testing.kubelet_emulator import (
    AdmissionError,
    KubeletEmulator,
    UnexpectedAdmissionError,
    container_asks,
    rejected_status,
)
from shared.tools.simulate.scenario import CreatePod, DeletePod

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    import aiohttp

    from shared.core.accounting import TrackedPod

RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Observed:
    """What kubelet saw of one container's admission."""

    reserved: tuple[str, ...]
    """The GPUs the scheduler reserved for it (before admission)."""
    gpus: tuple[str, ...]
    """The GPUs kubelet allocated (what runs; empty when refused)."""
    honoured: bool
    """The plugin's GetPreferredAllocation answer was taken."""
    alignment: Alignment | None
    error: AdmissionError | None = None
    reused: bool = False
    """kubelet gave it replicas of the pod's init container (its device reuse), unasked."""


def observed_refit(seen: Observed) -> str:
    """The refit outcome as kubelet's side of the exchange shows it (the plugin's own record
    is in another process): the plugin picked other GPUs than reserved -> `moved`; it left the
    choice to kubelet after a mismatch of an opted-in pod -> `fallback` (refused, unanswered
    or timed out: the refit service's log says which); a strict pod refused by the plugin ->
    `strict_failed`; kubelet handed it its init container's replicas -> `reused`; otherwise
    `none` (a pod that did not opt in is never refitted, whatever the plugin preferred)."""
    if seen.error is not None:
        strict = seen.alignment is Alignment.STRICT
        plugin_refused = isinstance(seen.error, UnexpectedAdmissionError)
        return "strict_failed" if strict and plugin_refused and seen.reserved else "none"
    if seen.reused:
        return "reused"
    if set(seen.gpus) == set(seen.reserved) or seen.alignment is None:
        return "none"
    if seen.honoured:
        return "moved"
    return "fallback"


class NodeHandle(Protocol):
    """One node as the driver sees it: its kubelet, its GPUs' NUMA nodes, refit outcomes."""

    kubelet: KubeletEmulator

    @property
    def gpu_numa(self) -> dict[str, int]: ...

    @property
    def policy_none(self) -> bool: ...

    def refit_outcome(self, pod_uid: str, index: int, seen: Observed) -> str: ...


class Environment(Protocol):
    """What the driver needs: the API, the extender's URL, the nodes, accounting's view."""

    @property
    def api(self) -> kube_io.Kube: ...

    @property
    def scheduler_url(self) -> str: ...

    @property
    def node_handles(self) -> Mapping[str, NodeHandle]: ...

    async def tracked(self, uid: str) -> TrackedPod | None: ...

    async def topology_seen(self, node: str) -> None:
        """Until the scheduler has seen the node's last NodeResourceTopology (if it has one)."""


log = logging.getLogger("numafit.simulate")


@dataclass
class ContainerReport:
    name: str
    gpus: list[str] = field(default_factory=list)
    gpu_numa: list[int] = field(default_factory=list)
    cpu_numa: int | None = None
    ledger_gpus: list[str] = field(default_factory=list)
    aligned: bool = True
    refit: str = "none"
    reserved_gpus: list[str] = field(default_factory=list)
    """What the scheduler reserved before kubelet admitted the container (for the table)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpus": self.gpus,
            "gpuNuma": self.gpu_numa,
            "cpuNuma": self.cpu_numa,
            "ledgerGpus": self.ledger_gpus,
            "aligned": self.aligned,
            "refit": self.refit,
        }


@dataclass
class PodReport:
    namespace: str
    name: str
    node: str = ""
    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    containers: list[ContainerReport] = field(default_factory=list)
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "node": self.node,
            "phase": self.phase,
            "reason": self.reason,
            "containers": [c.to_json() for c in self.containers],
        }


class Driver:
    def __init__(self, env: Environment, session: aiohttp.ClientSession) -> None:
        self.env = env
        self.session = session
        self.reports: dict[str, PodReport] = {}
        self.deleted: list[PodReport] = []
        """Pods the scenario deleted: gone from the report, kept for the table's story."""

    @property
    def kube(self) -> kube_io.Kube:
        return self.env.api

    async def _post(self, verb: str, body: Any) -> Any:
        url = f"{self.env.scheduler_url.rstrip('/')}/{verb}"
        async with asyncio.timeout(10), self.session.post(url, json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"extender {verb} answered {response.status}")
            return await response.json()

    async def run(self, step: CreatePod | DeletePod) -> PodReport | None:
        if isinstance(step, DeletePod):
            await self.delete(step)
            return None
        return await self.create(step)

    # --- deletion ---------------------------------------------------------------------------

    async def delete(self, step: DeletePod) -> None:
        key = f"{step.namespace}/{step.name}"
        report = self.reports.get(key)
        try:
            await self.kube.delete_pod(step.namespace, step.name)
        except kube_io.NotFound:
            log.info("delete: no such pod", extra={"pod": key})
            return
        nodes = self.env.node_handles
        if report is not None and report.node in nodes:
            await nodes[report.node].kubelet.release_pod(report.uid)
            await self.env.topology_seen(report.node)
        if report is not None and report.uid:
            await self._settled(lambda: self._ledger_forgot(report.uid))
        if report is not None:
            self.deleted.append(self.reports.pop(key))

    # --- creation ---------------------------------------------------------------------------

    async def create(self, step: CreatePod) -> PodReport:
        manifest = step.manifest
        meta = manifest["metadata"]
        namespace = meta.get("namespace", "default")
        report = PodReport(namespace, meta["name"])
        self.reports[report.key] = report
        try:
            created = await self.kube.create_pod(namespace, manifest)
        except kube_io.KubeError as exc:
            report.phase, report.reason, report.message = "Failed", "AdmissionDenied", str(exc)
            return report
        report.uid = created["metadata"]["uid"]
        pod = pod_from_object(created)
        report.containers = [ContainerReport(c.name) for c in pod.containers]
        node = await self._schedule(report, created)
        if node is None:
            return report
        report.node = node
        await self.admit(report, node)
        return report

    async def _schedule(self, report: PodReport, pod: dict[str, Any]) -> str | None:
        names = sorted(self.env.node_handles)
        result = await self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        if result.get("Error"):
            report.reason, report.message = "SchedulerError", str(result["Error"])
            return None
        feasible = list(result.get("NodeNames") or [])
        if not feasible:
            failed = {
                **(result.get("FailedNodes") or {}),
                **(result.get("FailedAndUnresolvableNodes") or {}),
            }
            report.reason = "Unschedulable"
            report.message = f"0/{len(names)} nodes are available: " + "; ".join(
                f"{n}: {r}" for n, r in sorted(failed.items())
            )
            return None
        scores = await self._post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": feasible})
        by_host = {item["Host"]: item["Score"] for item in scores or []}
        node: str = max(feasible, key=lambda n: (by_host.get(n, 0), -feasible.index(n)))
        for _ in range(50):
            bound = await self._post(
                "bind",
                {
                    "PodName": report.name,
                    "PodNamespace": report.namespace,
                    "PodUID": report.uid,
                    "Node": node,
                },
            )
            error = bound.get("Error") or ""
            if not error:
                return node
            if "still allocating" not in error:
                report.reason, report.message = "BindError", str(error)
                return None
            await asyncio.sleep(0.05)  # another pod holds the node lock; kube-scheduler retries
        report.reason, report.message = "BindError", "node stayed busy"
        return None

    async def admit(self, report: PodReport, node: str) -> None:
        sim = self.env.node_handles[node]
        current = await self.kube.get_pod(report.namespace, report.name)
        pod = pod_from_object(current)
        reserved = (
            codec.decode_pod(pod.annotations.get(keys.ALLOCATED, ""))
            if pod.annotations.get(keys.ALLOCATED)
            else []
        )
        known = frozenset(sim.gpu_numa)
        for index, entry in enumerate(report.containers):
            if index < len(reserved):
                entry.reserved_gpus = [d.uuid for d in reserved[index]]
        try:
            alignment = parse_alignment(pod.annotations.get(keys.NUMA_ALIGNMENT))
        except CoreError:
            alignment = None
        # As kubelet's managers see the pod: its QoS decides whether CPUs are pinned.
        result = await sim.kubelet.admit_pod(report.uid, container_asks(current, RESOURCE))
        for index, admission in enumerate(result.admitted):
            entry = report.containers[index]
            entry.gpus = physical_ids(admission.device_ids, known)
            entry.gpu_numa = [sim.gpu_numa[g] for g in entry.gpus]
            entry.cpu_numa = admission.cpu_numa
            # Without pinned CPUs (a Burstable pod) nothing can be misaligned with them.
            entry.aligned = (
                sim.policy_none
                or admission.cpu_numa is None
                or all(n == admission.cpu_numa for n in entry.gpu_numa)
            )
            seen = Observed(
                tuple(entry.reserved_gpus),
                tuple(entry.gpus),
                admission.preferred_honoured,
                alignment,
                reused=bool(admission.reused),
            )
            entry.refit = sim.refit_outcome(report.uid, index, seen)
        if result.error is not None:
            exc = result.error
            failed = result.failed_index  # None: kubelet's predicate refused the whole pod
            if failed is not None:
                entry = report.containers[failed]
                seen = Observed(tuple(entry.reserved_gpus), (), False, alignment, exc)
                entry.refit = sim.refit_outcome(report.uid, failed, seen)
            report.phase = "Failed"
            report.reason = exc.reason
            report.message = exc.message  # kubelet's Event text; the status is prefixed
            await self.kube.patch_pod_status(
                report.namespace, report.name, rejected_status(current, exc)
            )
            await self._settled(lambda: self._ledger_forgot(report.uid))
            await self.env.topology_seen(node)
            return
        status = {
            "phase": "Running",
            "initContainerStatuses": [
                {"name": c.name, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                for c in pod.containers
                if c.kind is ContainerKind.INIT
            ]
            + [
                {"name": c.name, "state": {"running": {}}}
                for c in pod.containers
                if c.kind is ContainerKind.SIDECAR
            ],
        }
        updated = await self.kube.patch_pod_status(report.namespace, report.name, status)
        report.phase = "Running"
        version = updated["metadata"]["resourceVersion"]
        await self._settled(lambda: self._ledger_saw(report.uid, version))
        tracked = await self.env.tracked(report.uid)
        if tracked is not None and tracked.rows is not None:
            for index, entry in enumerate(report.containers):
                if index < len(tracked.rows):
                    entry.ledger_gpus = [d.uuid for d in tracked.rows[index]]
        await self.env.topology_seen(node)

    # --- waiting for accounting -------------------------------------------------------------

    async def _ledger_forgot(self, uid: str) -> bool:
        return await self.env.tracked(uid) is None

    async def _ledger_saw(self, uid: str, version: str) -> bool:
        tracked = await self.env.tracked(uid)
        if tracked is None:
            return True
        current = tracked.pod.resource_version
        return bool(current.isdigit() and version.isdigit() and int(current) >= int(version))

    async def _settled(self, condition: Callable[[], Awaitable[bool]]) -> None:
        """Accounting follows the API server through its watch: wait until it has caught up
        (bounded), so the next pod is placed on settled state."""
        async with asyncio.timeout(10):
            while not await condition():  # noqa: ASYNC110 - accounting's state, owned elsewhere
                await asyncio.sleep(0.005)
