"""What the device plugin needs to know about a physical GPU, whatever found it.

Discovery has two sources, real NVML and a simulated topology file (tests,
``numafit simulate``). Both produce the same frozen :class:`GpuInfo` behind the
:class:`GpuBackend` protocol, so the plugin never knows which one it runs on.

Health is one more part of the same interface: :meth:`GpuBackend.watch_health` opens a
:class:`HealthWatch` whose blocking :meth:`HealthWatch.wait` returns the next
:class:`HealthEvent` (an XID, as NVML's ``nvmlEventTypeXidCriticalError`` events carry it).
The plugin calls ``wait`` in a worker thread with a short timeout and decides what an event
means with :attr:`HealthEvent.critical` (NVIDIA's device plugin's rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "APPLICATION_XIDS",
    "NO_NUMA",
    "GpuBackend",
    "GpuInfo",
    "HealthEvent",
    "HealthWatch",
]

NO_NUMA = -1
"""``GpuInfo.numa`` value for a GPU without NUMA affinity (sysfs reports -1)."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as discovered on this node."""

    uuid: str
    """NVML UUID, e.g. ``GPU-6e1f...``; the identity HAMi annotations use."""
    index: int
    """NVML enumeration index (``nvmlDeviceGetHandleByIndex``)."""
    model: str
    """Product name, e.g. ``NVIDIA H100 80GB HBM3``."""
    memory_mib: int
    """Total device memory in MiB."""
    numa: int
    """Kernel NUMA node id, or :data:`NO_NUMA` (-1) when the GPU has none."""
    mig_enabled: bool
    """True when MIG mode is currently enabled on the GPU."""
    healthy: bool
    """False for a GPU that must not be offered to kubelet."""
    cores: int = 100
    """Share of the GPU's compute, in percent, that may be handed out."""
    replicas: int = 0
    """Replica slots for this GPU; 0 means the plugin's `--replicas`."""


APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs an application causes, after which the GPU is still healthy (NVIDIA's device plugin
skips exactly these): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout."""


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """Something happened to a GPU's health."""

    uuid: str | None
    """The GPU concerned, or None when the backend cannot tell which one (NVML failed to name
    the event's device, or waiting for events failed): then it concerns every GPU."""
    xid: int | None
    """The XID (NVML's ``eventData``), or None for a failure that is not an XID."""
    reason: str
    """One line for the logs: what was seen."""

    @property
    def critical(self) -> bool:
        """True when the GPU must be reported unhealthy: any XID but an application one, and
        every non-XID failure."""
        return self.xid is None or self.xid not in APPLICATION_XIDS


class HealthWatch(Protocol):
    """An open subscription to GPU health events."""

    def wait(self, timeout_ms: int) -> HealthEvent | None:
        """Block up to ``timeout_ms`` for the next event; None when none came. Called from a
        worker thread, one call at a time."""
        ...

    def close(self) -> None:
        """Release the subscription (NVML's event set); never while a ``wait`` runs."""
        ...


class GpuBackend(Protocol):
    """A source of the node's GPUs."""

    def list_gpus(self) -> list[GpuInfo]:
        """Every GPU of the node, ordered by index."""
        ...

    def watch_health(self) -> HealthWatch:
        """Subscribe to health events of every GPU (blocking: call it from a thread)."""
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML handles); safe to call twice."""
        ...
