"""The emulated node's NodeResourceTopology, published as NFD's topology-updater would.

After every pod admission and release (and once at start) the emulator describes its NUMA
nodes: per zone the exclusive CPUs (capacity and allocatable: the configured ones; available:
those no container holds) and the replicas of every device resource (capacity: advertised,
allocatable: healthy, available: healthy and free), plus the Topology Manager policy and scope.
It stamps the moment the figures were taken (`numafit.io/sampled-at`), so the scheduler knows
which of the pods it placed they include.

A failed write is logged and otherwise ignored: the scheduler then works on the previous
object (or on none), exactly as with a lagging exporter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from shared.core.nrt import ZoneResource, nrt_object, parse_nrt
from shared.core.numa_prediction import TopologyScope
from shared.service import kube_io
from shared.service.logs import log_field

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from shared.core.numa_prediction import TopologyPolicy
    from shared.testing.kubelet_emulator.ledger import ContainerKey, PluginDevice

__all__ = ["TopologyPublisher", "TopologySink", "zones"]

logger = logging.getLogger(__name__)

CPU = "cpu"
WRITE_TIMEOUT = 2.0
"""Seconds one write may take (admissions wait for it)."""


class TopologySink(Protocol):
    """Where the object goes (`shared.service.kube_topology.TopologyApi` in a cluster)."""

    async def publish(self, obj: Mapping[str, Any]) -> object: ...


def zones(
    cpus: Mapping[int, int],
    free_cpus: Mapping[int, int],
    devices: Mapping[str, tuple[PluginDevice, ...]],
    allocated: Mapping[str, Mapping[str, ContainerKey]],
) -> dict[int, list[ZoneResource]]:
    """Per NUMA node: its CPUs and the replicas of each resource that report it."""
    numa_ids = {n for n in cpus if n >= 0}
    for listed in devices.values():
        numa_ids |= {n for d in listed for n in d.numa_nodes if n >= 0}
    result: dict[int, list[ZoneResource]] = {}
    for numa in sorted(numa_ids):
        resources = [
            ZoneResource(CPU, cpus.get(numa, 0), cpus.get(numa, 0), max(free_cpus.get(numa, 0), 0))
        ]
        for resource, listed in sorted(devices.items()):
            here = [d for d in listed if numa in d.numa_nodes]
            healthy = [d for d in here if d.healthy]
            taken = allocated.get(resource, {})
            free = [d for d in healthy if d.id not in taken]
            resources.append(ZoneResource(resource, len(here), len(healthy), len(free)))
        result[numa] = resources
    return result


class TopologyPublisher:
    """Writes one node's NodeResourceTopology to a sink."""

    def __init__(
        self,
        sink: TopologySink,
        node: str,
        policy: TopologyPolicy,
        *,
        scope: TopologyScope = TopologyScope.CONTAINER,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.node = node
        self.policy = policy
        self.scope = scope
        self.clock = clock
        self.paused = False
        """While set nothing is written (tests make the object lag behind on purpose)."""
        self.published = 0
        self.last_sampled_at: float | None = None
        """When the figures of the last object written were taken."""
        self._failed_before = False

    async def publish(self, figures: Mapping[int, list[ZoneResource]]) -> None:
        if self.paused:
            return
        sampled_at = self.clock()
        obj = nrt_object(self.node, self.policy, self.scope, figures, sampled_at)
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await self.sink.publish(obj)
        except (kube_io.KubeError, TimeoutError) as exc:
            # An API server without the CRD answers 404 on every write: say it once.
            level = logging.DEBUG if self._failed_before else logging.WARNING
            logger.log(
                level,
                "NodeResourceTopology not published",
                extra={"node": self.node, "error": log_field(str(exc) or type(exc).__name__)},
            )
            self._failed_before = True
            return
        self.published += 1
        # As readers see it: the annotation keeps microseconds, not the clock's full float.
        self.last_sampled_at = parse_nrt(obj).sampled_at
