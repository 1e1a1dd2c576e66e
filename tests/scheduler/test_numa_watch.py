"""The scheduler's NodeResourceTopology watch (svc_scheduler/topology_watch.py) against the
API emulator through the real kubernetes-asyncio client: list, watch, deletions, objects that
cannot be read, a 410 relist, and the pod reads that judge predictions."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from shared.core import codec, keys
from shared.core.model import ContainerDevice
from shared.core.nrt import ZoneResource, nrt_object
from shared.core.numa_prediction import (
    KubeletChoice,
    NumaPlan,
    PodPrediction,
    TopologyPolicy,
    TopologyScope,
    Verdict,
)
from shared.core.pods import pod_from_object
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from shared.service.kube_topology import TopologyApi
from shared.service.supervisor import Supervisor
from shared.testing.kube_emulator import KubeEmulator
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.topology import NodePrediction, TopologyState
from svc_scheduler.topology_watch import TopologyWatch
from tests.builders import container, pod
from tests.integration.harness import wait_for
from tests.metrics import sample

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

WAIT = 5.0
T0 = 1_800_000_000.0


def figures(node: str, free0: int, sampled_at: float = T0) -> dict[str, Any]:
    zones = {0: [ZoneResource("cpu", 32, 32, free0)], 1: [ZoneResource("cpu", 32, 32, 32)]}
    return nrt_object(
        node, TopologyPolicy.SINGLE_NUMA_NODE, TopologyScope.CONTAINER, zones, sampled_at
    )


class Setup:
    def __init__(self, emulator: KubeEmulator, kube: Kube, watch: TopologyWatch) -> None:
        self.emulator = emulator
        self.kube = kube
        self.api = TopologyApi(kube)
        self.watch = watch
        self.state = watch.state

    async def until(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT):
            await self.watch.wait_until(predicate)

    def free0(self, node: str) -> int | None:
        free = self.state.free_cpus(node)
        return None if free is None else free.get(0)


@contextlib.asynccontextmanager
async def setup(before: list[dict[str, Any]] | None = None) -> AsyncIterator[Setup]:
    emulator = KubeEmulator()
    await emulator.start()
    directory = Path(tempfile.mkdtemp(prefix="nf-nrt-"))
    kubeconfig = emulator.write_kubeconfig(directory / "kubeconfig")
    api = await api_client(str(kubeconfig))
    kube = Kube(api, "test")
    for obj in before or []:
        await TopologyApi(kube).publish(obj)
    supervisor = Supervisor("test")
    await supervisor.start()
    metrics = SchedulerMetrics(CollectorRegistry(auto_describe=True))
    watch = TopologyWatch(kube, TopologyState(), metrics, supervisor, clock=lambda: T0 + 10)
    try:
        watch.start()
        yield Setup(emulator, kube, watch)
    finally:
        await supervisor.stop(1.0)
        await api.close()
        await emulator.stop()


async def test_objects_listed_at_start_and_watched_after() -> None:
    async with setup([figures("node-1", 20)]) as s:
        await s.until(lambda: s.free0("node-1") == 20)
        await s.api.publish(figures("node-2", 8))
        await s.until(lambda: s.free0("node-2") == 8)
        await s.api.publish(figures("node-1", 4, T0 + 1))
        await s.until(lambda: s.free0("node-1") == 4)
        assert sample(s.watch.metrics.registry, "numafit_scheduler_topology_nodes") == 2


async def test_a_deleted_object_leaves_its_node_without_figures() -> None:
    async with setup([figures("node-1", 20)]) as s:
        await s.until(lambda: s.free0("node-1") == 20)
        custom = s.api.custom
        await custom.delete_cluster_custom_object(
            "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies", "node-1"
        )
        await s.until(lambda: s.state.topology("node-1") is None)


async def test_an_unreadable_object_is_ignored_and_the_watch_goes_on() -> None:
    bad = figures("node-1", 20)
    bad["attributes"] = [{"name": "topologyManagerPolicy", "value": "x" * 2000}]
    async with setup([figures("node-1", 20)]) as s:
        await s.until(lambda: s.free0("node-1") == 20)
        await s.api.publish(bad)
        await s.until(lambda: s.state.topology("node-1") is None)
        registry = s.watch.metrics.registry
        assert sample(registry, "numafit_scheduler_topology_ignored_total") == 1
        await s.api.publish(figures("node-1", 12, T0 + 2))
        await s.until(lambda: s.free0("node-1") == 12)


async def test_an_expired_watch_relists() -> None:
    async with setup([figures("node-1", 20)]) as s:
        await s.until(lambda: s.free0("node-1") == 20)
        await wait_for(lambda: s.emulator.expire_watches("noderesourcetopologies") >= 1)
        await s.api.publish(figures("node-1", 2, T0 + 3))
        await s.until(lambda: s.free0("node-1") == 2)


async def test_a_prediction_is_judged_from_the_pod_once_the_figures_include_it() -> None:
    async with setup([figures("node-1", 32, T0)]) as s:
        await s.until(lambda: s.free0("node-1") == 32)
        spec = container("main", 1, 1000)
        spec["resources"]["limits"]["cpu"] = "4"
        manifest = pod("train", containers=[spec])
        del manifest["metadata"]["resourceVersion"], manifest["metadata"]["uid"]
        created = await s.kube.create_pod("default", manifest)
        row = (ContainerDevice("GPU-0", "NVIDIA", 1000, 0),)
        prediction = NodePrediction(
            NumaPlan(first=((0, 0),), names=((0, "main"),)),
            PodPrediction((KubeletChoice(Verdict.ALIGNED, 0),), cpus=((0, 4),)),
        )
        s.state.placed(pod_from_object(created), "node-1", [row], [0], prediction, T0 + 1)
        assert s.free0("node-1") == 28  # counted until figures taken after it arrive
        await s.kube.patch_pod_annotations(
            "default",
            "train",
            {keys.ALLOCATED: codec.encode_pod([row]), keys.BIND_PHASE: keys.PHASE_SUCCESS},
            "",
        )
        await s.api.publish(figures("node-1", 28, T0 + 2))  # taken after the placement
        registry = s.watch.metrics.registry

        def hits() -> float:
            return sample(registry, "numafit_scheduler_numa_predictions_total", result="hit")

        await s.until(lambda: hits() == 1)
        assert s.state.pending() == 0 and s.free0("node-1") == 28
        assert sample(registry, "numafit_scheduler_numa_predictions_total", result="miss") == 0
