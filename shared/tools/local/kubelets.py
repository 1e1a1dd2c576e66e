"""What each node's kubelet does in `numafit up` once a pod is bound to it.

Admission is `numafit simulate`'s: the driver admits the containers in kubelet's order (init
containers first) through the node's kubelet emulator, whose Topology Manager and static CPU
manager call the real device plugin over gRPC, and writes the pod's status (Running, or Failed
with kubelet's reason). This module adds what a long-running node needs beside it: the Events
kubelet records when it refuses a pod, and the release of a deleted pod's CPUs and GPU replicas
(also when the deletion lands while the pod is being admitted).
"""

from __future__ import annotations

import datetime
import logging
from typing import TYPE_CHECKING, Any

from shared.core.pods import pod_from_object
from shared.service import kube_io
from shared.tools.simulate.driver import ContainerReport, Driver, PodReport

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.tools.local.events import EventSink
    from shared.tools.simulate.driver import NodeHandle

log = logging.getLogger("numafit.up.kubelet")


class Kubelets:
    """The kubelets of the stack's nodes, behind the driver that admits pods through them."""

    def __init__(self, driver: Driver, nodes: Mapping[str, NodeHandle], events: EventSink) -> None:
        self.driver = driver
        self.nodes = nodes
        self.events = events
        self._admitting: str | None = None
        self._deleted_while_admitting = False

    def runs(self, node: str) -> bool:
        """Whether `node` has a kubelet here (a Node object made by hand has none)."""
        return node in self.nodes

    async def admit(self, pod: Mapping[str, Any], node: str) -> PodReport:
        """Admit a pod bound to `node`; the report says how it ended (phase, reason, and per
        container the GPUs, NUMA nodes and refit outcome)."""
        meta = pod["metadata"]
        report = PodReport(meta.get("namespace", "default"), meta["name"], node=node)
        report.uid = meta["uid"]
        report.containers = [ContainerReport(c.name) for c in pod_from_object(pod).containers]
        self._admitting, self._deleted_while_admitting = report.uid, False
        try:
            await self.driver.admit(report, node)
        except kube_io.NotFound:  # deleted under our feet: its status write found no pod
            self._deleted_while_admitting = True
        finally:
            self._admitting = None
        if self._deleted_while_admitting:  # the release came before the last container
            await self.nodes[node].kubelet.release_pod(report.uid)
            report.phase, report.reason = "Deleted", "DeletedDuringAdmission"
        elif report.phase == "Failed":
            await self.events.record(
                pod, "Warning", report.reason, report.message, "kubelet", host=node
            )
        elif report.phase == "Running":
            await self._started(pod)
        return report

    async def _started(self, pod: Mapping[str, Any]) -> None:
        """What kubelet reports once the containers run (the driver wrote the phase and the
        init containers): each app container started and ready, and the pod's conditions, so
        `kubectl get pods` shows READY 1/1."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            "startTime": now,
            "conditions": [
                {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "containerID": f"emulated://{meta['uid']}/{container['name']}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for container in spec.get("containers") or []
            ],
        }
        try:
            await self.driver.kube.patch_pod_status(
                meta.get("namespace", "default"), meta["name"], status
            )
        except kube_io.NotFound:
            return

    async def release(self, node: str, uid: str) -> None:
        """The pod was deleted: free what its containers held on `node`."""
        if uid == self._admitting:
            self._deleted_while_admitting = True
        if node in self.nodes:
            await self.nodes[node].kubelet.release_pod(uid)
