"""Allocate's answer for one container: HAMi-core's environment and mounts (pure).

    NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>         the physical GPUs kubelet handed out
    CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m          per visible device, HAMi-core's memory cap
    CUDA_DEVICE_SM_LIMIT=<percent>               the first device's core share
    CUDA_DEVICE_MEMORY_SHARED_CACHE=<dir>/<id>.cache
plus HAMi-core's library, its ld.so.preload and a per-container cache directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.core.model import ContainerEntry
    from svc_deviceplugin.config import HamiCorePaths


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str]
    mounts: list[Mount]


def container_allocation(
    entry: ContainerEntry, pod_uid: str, container_name: str, paths: HamiCorePaths
) -> ContainerAllocation:
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in entry)}
    for i, device in enumerate(entry):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
    if entry:
        envs["CUDA_DEVICE_SM_LIMIT"] = str(entry[0].usedcores)
    cache_id = f"{pod_uid}_{container_name}"
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = f"{paths.cache_container_dir}/{cache_id}.cache"
    mounts = [
        Mount(paths.library_container, paths.library_host, True),
        Mount(paths.preload_container, paths.preload_host, True),
        Mount(paths.cache_container_dir, f"{paths.cache_host_dir}/{cache_id}", False),
    ]
    return ContainerAllocation(envs, mounts)
