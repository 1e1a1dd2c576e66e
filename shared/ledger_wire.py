"""Wire forms of ledger state shared by accounting (writer) and its readers (refit, scheduler).

A tracked pod travels as a *mini pod*: a Pod object cut down to what the core reads (identity,
the hami.io/ and nvidia.com/ annotations, container names and sidecar flags, phase), so readers
rebuild it with the same `pod_from_object` + `track_pod` the accounting service uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.core import codec
from shared.core.accounting import TrackedPod, node_snapshot, track_pod
from shared.core.errors import CoreError
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot, Usage
from shared.core.pods import PodInfo, pod_from_object
from shared.core.quota import QuotaLedger, QuotaLimit
from shared.wire import Reader, WireError

_KEPT_PREFIXES = ("hami.io/", "nvidia.com/")


def mini_pod(pod: PodInfo) -> dict[str, Any]:
    init = [c for c in pod.containers if c.kind is not ContainerKind.APP]
    apps = [c for c in pod.containers if c.kind is ContainerKind.APP]
    return {
        "metadata": {
            "uid": pod.uid,
            "namespace": pod.namespace,
            "name": pod.name,
            "resourceVersion": pod.resource_version,
            "annotations": {
                k: v for k, v in pod.annotations.items() if k.startswith(_KEPT_PREFIXES)
            },
        },
        "spec": {
            "nodeName": pod.node_name,
            "initContainers": [
                {
                    "name": c.name,
                    **({"restartPolicy": "Always"} if c.kind is ContainerKind.SIDECAR else {}),
                }
                for c in init
            ],
            "containers": [{"name": c.name} for c in apps],
        },
        "status": {"phase": pod.phase},
    }


def tracked_to_wire(tracked: TrackedPod) -> dict[str, Any]:
    return {"pod": mini_pod(tracked.pod), "released": tracked.released}


def tracked_from_wire(obj: Mapping[str, Any]) -> TrackedPod:
    reader = Reader(obj, "tracked pod")
    released = reader.boolean("released")
    try:
        pod = pod_from_object(obj.get("pod"))
    except CoreError as exc:
        raise WireError(f"tracked pod: {exc}") from exc
    tracked = track_pod(pod, released=released)
    if tracked is None:
        raise WireError(f"tracked pod {pod.key} carries no reservation")
    return tracked


def devices_from_wire(items: Any) -> tuple[DeviceInfo, ...]:
    """Registered devices, validated exactly like the register annotation."""
    try:
        return codec.parse_register_items(items)
    except CoreError as exc:
        raise WireError(f"devices: {exc}") from exc


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as a reader sees it: inventory, revision and its tracked pods."""

    name: str
    revision: int
    devices: tuple[DeviceInfo, ...] | None
    cordoned: frozenset[str]
    pods: tuple[TrackedPod, ...]

    def snapshot(self) -> NodeSnapshot | None:
        if self.devices is None:
            return None
        return node_snapshot(self.name, self.devices, self.cordoned, self.pods)


def node_state_to_wire(state: NodeState) -> dict[str, Any]:
    return {
        "node": state.name,
        "revision": state.revision,
        "devices": None
        if state.devices is None
        else [codec.register_item(d) for d in state.devices],
        "cordoned": sorted(state.cordoned),
        "pods": [tracked_to_wire(p) for p in state.pods],
    }


def node_state_from_wire(obj: Mapping[str, Any]) -> NodeState:
    reader = Reader(obj, "node state")
    raw_devices = obj.get("devices")
    return NodeState(
        name=reader.text("node"),
        revision=reader.integer("revision", minimum=0),
        devices=None if raw_devices is None else devices_from_wire(raw_devices),
        cordoned=frozenset(reader.texts("cordoned")),
        pods=tuple(tracked_from_wire(p) for p in reader.objects("pods")),
    )


def quota_to_wire(ledger: QuotaLedger, namespace: str) -> dict[str, Any]:
    limit = ledger.limits.get(namespace, QuotaLimit())
    used = ledger.used.get(namespace, Usage())
    return {
        "namespace": namespace,
        "limitMem": limit.mem,
        "limitCores": limit.cores,
        "usedMem": used.mem,
        "usedCores": used.cores,
    }


def quota_from_wire(obj: Mapping[str, Any]) -> QuotaLedger:
    reader = Reader(obj, "quota")
    namespace = reader.text("namespace")
    return QuotaLedger(
        {namespace: QuotaLimit(reader.opt_integer("limitMem"), reader.opt_integer("limitCores"))},
        {namespace: Usage(reader.integer("usedMem", 0), reader.integer("usedCores", 0))},
    )


def usage_from_wire(snapshot: NodeSnapshot, devices: Any) -> NodeSnapshot | None:
    """`snapshot`'s devices with the usage of a published table (`{uuid: {used, usedmem,
    usedcores}}`), or None when the table cannot be applied as is: another device set, or a
    malformed entry (readers then take a snapshot instead)."""
    if not isinstance(devices, dict) or set(devices) != {d.info.id for d in snapshot.devices}:
        return None
    updated: list[DeviceUsage] = []
    for device in snapshot.devices:
        usage = devices[device.info.id]
        if not isinstance(usage, dict):
            return None
        values: list[int] = []
        for key in ("used", "usedmem", "usedcores"):
            value = usage.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return None
            values.append(value)
        updated.append(DeviceUsage(device.info, *values))
    return NodeSnapshot(snapshot.name, updated, snapshot.cordoned)
