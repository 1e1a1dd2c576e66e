"""One emulated GPU node: kubelet emulator + the real device plugin over gRPC unix sockets,
next to the control-plane harness (API emulator, accounting, refit, real nats-server)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.core import keys
from shared.testing.kubelet_emulator import KubeletConfig, KubeletEmulator, TopologyPolicy
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import GpuInfo, SimulatedBackend
from svc_deviceplugin.service import DevicePluginService, PluginOptions, spec
from tests.builders import container, pod
from tests.integration.harness import Harness, harness, wait_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

RESOURCE = "nvidia.com/gpu"


def gpu(uuid: str, numa: int, index: int, memory: int = 40000) -> GpuInfo:
    return GpuInfo(uuid, index, "NVIDIA A100-SXM4-40GB", memory, numa, False, True)


DEFAULT_GPUS = [gpu("GPU-a", 1, 0), gpu("GPU-b", 0, 1)]


def bare_node(name: str = "node-1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def gpu_pod(
    name: str,
    allocated: str,
    *,
    alignment: str | None = "best-effort",
    init: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    bind_time: int = 1,
) -> dict[str, Any]:
    """A pod bound at `bind_time`: kubelet admits pods in bind order, and so does `pending`."""
    annotations = {keys.BIND_PHASE: keys.PHASE_ALLOCATING, keys.BIND_TIME: str(bind_time)}
    if alignment is not None:
        annotations[keys.NUMA_ALIGNMENT] = alignment
    obj = pod(
        name,
        init=init,
        containers=containers or [container("main", 1, 20000, 30)],
        namespace="ml",
        allocated=allocated,
        annotations=annotations,
    )
    body = copy.deepcopy(obj)
    body["metadata"].pop("uid")
    body["metadata"].pop("resourceVersion")
    return body


@dataclass
class Stack:
    h: Harness
    kubelet: KubeletEmulator
    plugin: DevicePluginService

    async def uid(self, name: str) -> str:
        return str((await self.h.pod("ml", name))["metadata"]["uid"])


@contextlib.asynccontextmanager
async def node_stack(
    nats_url: str,
    tmp_path: Path,
    pods: list[dict[str, Any]],
    *,
    gpus: list[GpuInfo] | None = None,
    with_refit: bool = True,
    refit_timeout_ms: int = 2000,
    policy: TopologyPolicy = TopologyPolicy.SINGLE_NUMA_NODE,
) -> AsyncIterator[Stack]:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))  # unix socket paths are short
    objects = [("node", bare_node()), *(("pod", p) for p in pods)]
    try:
        async with harness(nats_url, tmp_path, objects, with_refit=with_refit) as h:
            kubelet = KubeletEmulator(
                KubeletConfig(directory=directory, topology_policy=policy, cpus={0: 32, 1: 32})
            )
            await kubelet.start()
            config = PluginConfig(
                node="node-1",
                directory=directory,
                replicas=10,
                refit_timeout_ms=refit_timeout_ms,
                watch_interval=0.05,
            )
            backend = SimulatedBackend(gpus or DEFAULT_GPUS)
            plugin: DevicePluginService | None = None
            try:
                plugin = await h.wiring.start(
                    spec(PluginOptions(config, backend)), client_name="deviceplugin"
                )
                count = 10 * len(gpus or DEFAULT_GPUS)
                async with asyncio.timeout(10):
                    await kubelet.wait_for_devices(RESOURCE, count)
                    await plugin.inventory_registered.wait()
                await wait_for(lambda: _registered(h))
                yield Stack(h, kubelet, plugin)
            finally:
                if plugin is not None:  # else the harness stops what did start
                    await h.wiring.stop(plugin, 1.0)
                await kubelet.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def _registered(h: Harness) -> bool:
    snapshot = await h.client.snapshot("node-1")
    return snapshot["nodes"][0]["devices"] is not None
