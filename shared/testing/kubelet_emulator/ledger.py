"""What the emulated kubelet knows and has handed out: devices per resource and CPUs.

Device lists come from ListAndWatch (each message replaces the whole list, as
in kubelet's device manager); allocations are kept per container and survive a
kubelet restart, like kubelet's checkpoint, so running pods keep their devices
while plugins re-register. Pure bookkeeping: no I/O, no locking (the emulator
serializes admissions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from shared.testing.kubelet_emulator.placement import FreeDevice

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from proto.v1beta1 import api_pb2

__all__ = ["ContainerKey", "CpuLedger", "DeviceLedger", "PluginDevice"]

HEALTHY = "Healthy"


class ContainerKey(NamedTuple):
    """Who holds an allocation."""

    pod_uid: str
    container_name: str


@dataclass(frozen=True, slots=True)
class PluginDevice:
    """One device as the plugin last advertised it."""

    id: str
    healthy: bool
    numa_nodes: frozenset[int]

    @classmethod
    def from_proto(cls, device: api_pb2.Device) -> PluginDevice:
        nodes = frozenset(int(node.ID) for node in device.topology.nodes)
        return cls(id=device.ID, healthy=device.health == HEALTHY, numa_nodes=nodes)


class DeviceLedger:
    """Latest device list per resource and the replicas allocated to containers."""

    def __init__(self) -> None:
        self._devices: dict[str, tuple[PluginDevice, ...]] = {}
        self._allocated: dict[str, dict[str, ContainerKey]] = {}

    def replace(self, resource: str, devices: Iterable[PluginDevice]) -> None:
        """A ListAndWatch message: the new full list for ``resource``."""
        self._devices[resource] = tuple(devices)

    def mark_unhealthy(self, resource: str) -> None:
        """The plugin's stream ended: kubelet keeps its devices but marks them unhealthy."""
        self._devices[resource] = tuple(
            PluginDevice(d.id, False, d.numa_nodes) for d in self._devices.get(resource, ())
        )

    def forget_devices(self) -> None:
        """A kubelet restart: device lists are gone until plugins re-register."""
        self._devices.clear()

    def devices(self, resource: str) -> tuple[PluginDevice, ...]:
        return self._devices.get(resource, ())

    def every_resource(self) -> dict[str, tuple[PluginDevice, ...]]:
        """The latest device list of every resource."""
        return dict(self._devices)

    def topology_aware(self, resource: str) -> bool:
        """True when any device of the resource reports NUMA nodes (kubelet's hint rule)."""
        return any(device.numa_nodes for device in self.devices(resource))

    def free(self, resource: str) -> list[FreeDevice]:
        """Healthy, unallocated replicas, in the plugin's order."""
        taken = self._allocated.get(resource, {})
        return [
            FreeDevice(device.id, device.numa_nodes)
            for device in self.devices(resource)
            if device.healthy and device.id not in taken
        ]

    def allocate(self, resource: str, ids: Sequence[str], owner: ContainerKey) -> None:
        """Hand `ids` to `owner`. A replica may already be held by another container of the
        same pod only: kubelet's reuse of an init container's devices (the first holder stays
        the one named)."""
        taken = self._allocated.setdefault(resource, {})
        clash = [i for i in ids if i in taken and taken[i].pod_uid != owner.pod_uid]
        if clash:
            raise ValueError(f"{resource} replicas already allocated: {', '.join(clash)}")
        for device_id in ids:
            taken.setdefault(device_id, owner)

    def allocations(self, resource: str) -> Mapping[str, ContainerKey]:
        """Replica ID -> holder, for one resource."""
        return dict(self._allocated.get(resource, {}))

    def release_pod(self, pod_uid: str) -> list[str]:
        """Free every replica held by the pod's containers; returns the freed IDs."""
        freed: list[str] = []
        for taken in self._allocated.values():
            mine = [device_id for device_id, owner in taken.items() if owner.pod_uid == pod_uid]
            for device_id in mine:
                del taken[device_id]
            freed.extend(mine)
        return freed


class CpuLedger:
    """Static CPU manager: exclusive CPUs per NUMA node, counted, not numbered.

    Reuse within a pod, as kubelet's static policy does it (`cpusToReuse`): the CPUs a regular
    init container holds are reusable by the containers after it, which take them first; a
    regular init container adds what it holds to the pod's reusable CPUs, any other container
    takes out what it reused. A reused CPU is counted once."""

    def __init__(self, capacity: Mapping[int, int]) -> None:
        self._capacity = dict(capacity)
        self._held: dict[ContainerKey, tuple[int, int, int]] = {}
        """owner -> (NUMA node, CPUs, of which taken from the free pool)."""
        self._reusable: dict[str, dict[int, int]] = {}
        """pod UID -> NUMA node -> CPUs its regular init containers hold, free for reuse."""

    def free(self) -> dict[int, int]:
        """Free exclusive CPUs per NUMA node."""
        free = dict(self._capacity)
        for numa, _count, fresh in self._held.values():
            free[numa] -= fresh
        return free

    def reusable(self, pod_uid: str) -> dict[int, int]:
        """CPUs per NUMA node the pod's regular init containers hold for its later ones."""
        return {n: c for n, c in self._reusable.get(pod_uid, {}).items() if c > 0}

    def allocate(
        self, numa: int | None, count: int, owner: ContainerKey, *, init: bool = False
    ) -> int:
        """Give `owner` `count` CPUs on `numa`, reusable ones first; `init`: a regular init
        container (what it holds becomes reusable). Returns how many were reused."""
        if count == 0:
            return 0
        reusable = self._reusable.setdefault(owner.pod_uid, {})
        reused = min(count, reusable.get(numa, 0)) if numa is not None else 0
        fresh = count - reused
        if numa is None or self.free().get(numa, 0) < fresh:
            raise ValueError(f"{count} CPUs do not fit on NUMA node {numa}")
        self._held[owner] = (numa, count, fresh)
        if init:
            reusable[numa] = reusable.get(numa, 0) + fresh
        else:
            reusable[numa] = reusable.get(numa, 0) - reused
        return reused

    def release_pod(self, pod_uid: str) -> int:
        """Free the pod's CPUs; returns how many."""
        mine = [owner for owner in self._held if owner.pod_uid == pod_uid]
        self._reusable.pop(pod_uid, None)
        return sum(self._held.pop(owner)[2] for owner in mine)
