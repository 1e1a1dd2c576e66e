"""The data model: registered GPUs, their usage, reserved container devices, usage triples.

Names follow HAMi (`usedmem`, `usedcores`, `devmem`, ...) so that reading the reference next to
the code is easy. Reserved devices and registered GPUs are immutable; `DeviceUsage` is the one
mutable record, owned by a node snapshot that the fit works on (copies are cheap and explicit).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One device reserved for one container: HAMi's `ContainerDevice`.

    `idx` is -1 when unknown (the annotation does not carry it) and `slots` 0 means one slot.
    """

    uuid: str
    type: str
    usedmem: int
    usedcores: int
    idx: int = -1
    slots: int = 0


ContainerEntry = tuple[ContainerDevice, ...]
"""All devices of one vendor reserved for one container (possibly empty)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """A (memory MiB, cores percent, slots) triple: one device's share taken by one pod."""

    mem: int = 0
    cores: int = 0
    slots: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.mem + other.mem, self.cores + other.cores, self.slots + other.slots)

    def max(self, other: Usage) -> Usage:
        """Component-wise maximum (phase peaks are taken per component, as HAMi does)."""
        return Usage(
            max(self.mem, other.mem), max(self.cores, other.cores), max(self.slots, other.slots)
        )

    def clamp_sub(self, other: Usage) -> Usage:
        """Component-wise difference clamped at zero."""
        return Usage(
            max(self.mem - other.mem, 0),
            max(self.cores - other.cores, 0),
            max(self.slots - other.slots, 0),
        )

    @property
    def is_zero(self) -> bool:
        return self.mem <= 0 and self.cores <= 0 and self.slots <= 0

    @property
    def counted(self) -> Usage:
        """This stored usage as a node snapshot counts it (d.2: `Used += max(Slots, 1)`)."""
        return Usage(self.mem, self.cores, max(self.slots, 1))


PodUsage = Mapping[str, Usage]
"""A pod's usage per physical GPU UUID (the collapsed or steady-state view of its reservation)."""


class ContainerKind(enum.Enum):
    """Phase class of a container position (reference e.1)."""

    SIDECAR = "sidecar"  # init container with restartPolicy Always: lives as long as the pod
    INIT = "init"  # regular init container: runs before the apps, alone-ish
    APP = "app"  # regular container: all apps run concurrently


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One registered GPU, as in HAMi's `hami.io/node-nvidia-register` JSON."""

    id: str
    index: int
    count: int
    devmem: int
    devcore: int
    type: str
    numa: int
    mode: str = "hami-core"
    health: bool = True

    def matches_vendor(self, vendor: str) -> bool:
        """HAMi matches vendor keys by substring of the card type ("NVIDIA" in "NVIDIA A100")."""
        return vendor in self.type


@dataclass(slots=True)
class DeviceUsage:
    """A registered GPU plus the usage counted on it in one node snapshot."""

    info: DeviceInfo
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0

    def copy(self) -> DeviceUsage:
        return DeviceUsage(self.info, self.used, self.usedmem, self.usedcores)

    def add(self, usage: Usage) -> None:
        self.used += usage.slots
        self.usedmem += usage.mem
        self.usedcores += usage.cores

    def subtract(self, usage: Usage) -> None:
        self.used = max(self.used - usage.slots, 0)
        self.usedmem = max(self.usedmem - usage.mem, 0)
        self.usedcores = max(self.usedcores - usage.cores, 0)

    def raise_to(self, other: DeviceUsage) -> None:
        """Raise this usage to at least `other`'s, component-wise (the d.6 peak)."""
        self.used = max(self.used, other.used)
        self.usedmem = max(self.usedmem, other.usedmem)
        self.usedcores = max(self.usedcores, other.usedcores)

    def as_dict(self) -> dict[str, int]:
        return {"used": self.used, "usedmem": self.usedmem, "usedcores": self.usedcores}


@dataclass(slots=True)
class NodeSnapshot:
    """The GPUs of one node with the usage counted on them; the fit's working state."""

    name: str
    devices: list[DeviceUsage]
    cordoned: frozenset[str] = field(default_factory=frozenset)

    def copy(self) -> NodeSnapshot:
        return NodeSnapshot(self.name, [d.copy() for d in self.devices], self.cordoned)

    def by_uuid(self) -> dict[str, DeviceUsage]:
        return {d.info.id: d for d in self.devices}

    def add_pod_usage(self, usage: PodUsage) -> None:
        """Count one pod's stored usage (d.2: `Used += max(Slots,1)`); unknown GPUs are skipped."""
        devices = self.by_uuid()
        for uuid, u in usage.items():
            device = devices.get(uuid)
            if device is not None:
                device.add(u.counted)

    def usage_table(self) -> dict[str, dict[str, int]]:
        return {d.info.id: d.as_dict() for d in self.devices}

    def __iter__(self) -> Iterator[DeviceUsage]:
        return iter(self.devices)


def snapshot_of(
    name: str, devices: Iterable[DeviceInfo], cordoned: Iterable[str] = ()
) -> NodeSnapshot:
    """A snapshot with zero usage for the given registered devices."""
    return NodeSnapshot(name, [DeviceUsage(d) for d in devices], frozenset(cordoned))
