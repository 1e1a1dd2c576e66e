"""What the plugin advertises: replicas for kubelet, the register inventory for accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.keys import NVIDIA
from shared.core.model import DeviceInfo
from shared.core.replicas import replica_ids

if TYPE_CHECKING:
    from collections.abc import Sequence

    from svc_deviceplugin.discovery import GpuInfo


@dataclass(frozen=True, slots=True)
class Replica:
    id: str
    uuid: str
    numa: int
    healthy: bool


def replicas(gpus: Sequence[GpuInfo], count: int) -> list[Replica]:
    return [
        Replica(rid, gpu.uuid, gpu.numa, gpu.healthy)
        for gpu in gpus
        for rid in replica_ids(gpu.uuid, gpu.replicas or count)
    ]


def card_type(model: str) -> str:
    """The register `type`: HAMi matches the vendor key by substring, so it must name NVIDIA."""
    return model if NVIDIA in model else f"{NVIDIA}-{model}"


def register_devices(gpus: Sequence[GpuInfo], count: int, mig_mode: bool) -> list[DeviceInfo]:
    return [
        DeviceInfo(
            id=gpu.uuid,
            index=gpu.index,
            count=gpu.replicas or count,
            devmem=gpu.memory_mib,
            devcore=gpu.cores,
            type=card_type(gpu.model),
            numa=gpu.numa,  # -1 (no affinity) sorts before every real NUMA node
            mode="mig" if (mig_mode or gpu.mig_enabled) else "hami-core",
            health=gpu.healthy,
        )
        for gpu in gpus
    ]
