"""What the device plugin needs to know about a physical GPU, whatever found it.

Discovery has two sources, real NVML and a simulated topology file (tests,
``numafit simulate``). Both produce the same frozen :class:`GpuInfo` behind the
:class:`GpuBackend` protocol, so the plugin never knows which one it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["NO_NUMA", "GpuBackend", "GpuInfo"]

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


class GpuBackend(Protocol):
    """A source of the node's GPUs."""

    def list_gpus(self) -> list[GpuInfo]:
        """Every GPU of the node, ordered by index."""
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML handles); safe to call twice."""
        ...
