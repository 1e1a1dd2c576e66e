"""The scheduler's watch of NodeResourceTopology objects, and the reads that judge predictions.

One eternal task lists the objects, then watches them (relisting after a 410, retrying every
failure with backoff; a cluster without the CRD is asked again every minute:
shared/service/follow.py) and feeds `TopologyState` (topology.py). An object that cannot be
read is logged (bounded) and its node is scheduled as if it published none. When a node's new
figures include pods placed with a prediction, each such pod is read once (finite tasks of the
service's supervisor, 2 s each) to count how the prediction turned out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from shared.core.errors import CoreError
from shared.core.nrt import PLURAL, parse_nrt
from shared.service import kube_io
from shared.service.follow import follow
from shared.service.kube_topology import TopologyApi
from shared.service.logs import log_field

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from shared.core.nrt import NodeTopology
    from shared.service.kube_io import Kube
    from shared.service.supervisor import Supervisor
    from svc_scheduler.metrics import SchedulerMetrics
    from svc_scheduler.topology import Pending, TopologyState

log = logging.getLogger("numafit.scheduler")

WATCH_TIMEOUT_SECONDS = 300
"""One watch request lasts this long before it is renewed (the API server's own limit)."""
READ_TIMEOUT = 2.0
"""Seconds one read of a pod (to judge a prediction) may take."""


class TopologyWatch:
    def __init__(
        self,
        kube: Kube | None,
        state: TopologyState,
        metrics: SchedulerMetrics,
        supervisor: Supervisor,
        *,
        clock: Callable[[], float] = time.time,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self.kube = kube
        self.api = TopologyApi(kube) if kube is not None else None
        self.state = state
        self.metrics = metrics
        self.supervisor = supervisor
        self.clock = clock
        self.watch_timeout_seconds = watch_timeout_seconds
        self.changed = asyncio.Condition()
        """Notified after every change of `state` (tests and `numafit simulate` wait on it)."""
        self._judging: set[str] = set()

    def start(self) -> None:
        """Follow the objects from now on (nothing to follow without an API client)."""
        if self.api is not None:
            self.supervisor.spawn(self._follow(), f"watch-{PLURAL}", eternal=True)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Until `predicate()` holds, checked after every change (bound it with a timeout)."""
        async with self.changed:
            await self.changed.wait_for(predicate)

    async def _follow(self) -> None:
        assert self.api is not None
        api = self.api
        await follow(
            PLURAL,
            self._relist,
            lambda version: api.watch(version, self.watch_timeout_seconds),
            self._on_event,
            log=log,
        )

    async def _relist(self) -> str:
        assert self.api is not None
        items, version = await self.api.list()
        readable = [t for t in (self._parse(obj) for obj in items) if t is not None]
        await self._changed(self.state.replace_all(readable, self.clock()))
        return version

    async def _on_event(self, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if event_type == "DELETED":
            if isinstance(name, str):
                self.state.drop(name)
            await self._changed(())
            return
        topology = self._parse(obj)
        if topology is None:
            if isinstance(name, str):
                self.state.drop(name)  # scheduled as without figures until a readable one
            await self._changed(())
            return
        await self._changed(self.state.apply(topology, self.clock()))

    def _parse(self, obj: object) -> NodeTopology | None:
        try:
            return parse_nrt(obj)
        except CoreError as exc:
            self.metrics.topology_ignored.inc()
            log.warning("NodeResourceTopology ignored", extra={"error": log_field(str(exc))})
            return None

    async def _changed(self, due: Iterable[Pending]) -> None:
        self.metrics.topology_nodes.set(len(self.state))
        for pending in due:
            if pending.uid not in self._judging and self.kube is not None:
                self._judging.add(pending.uid)
                self.supervisor.spawn(self._judge(pending), "judge-prediction")
        async with self.changed:
            self.changed.notify_all()

    async def settle(self) -> None:
        """Judge now every prediction whose pod the figures already include (`numafit
        simulate` does before it reports, so that the counts are final)."""
        for node in self.state.nodes():
            for pending in self.state.due(node):
                if pending.uid not in self._judging:
                    self._judging.add(pending.uid)
                    await self._judge(pending)

    async def _judge(self, pending: Pending) -> None:
        """Read the pod and count its outcomes (a pod still allocating waits for the node's
        next figures)."""
        assert self.kube is not None
        try:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    pod: object | None = await self.kube.get_pod(pending.namespace, pending.name)
            except kube_io.NotFound:
                pod = None
            except (kube_io.KubeError, TimeoutError) as exc:
                log.info("prediction not judged", extra={"error": log_field(str(exc))})
                return
            counts = self.state.resolve(pending, pod)
            for result, count in (counts or {}).items():
                self.metrics.numa_predictions.labels(result).inc(count)
        finally:
            self._judging.discard(pending.uid)
        async with self.changed:
            self.changed.notify_all()
