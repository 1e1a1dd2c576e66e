"""Where the extender places a pod: the node policy's pick among the candidates, fitted
phase-aware on each node's snapshot (without the pod's own earlier reservation), on cached fits
where a node is unchanged, with each GPU container fitted first on the NUMA node kubelet is
predicted to give it, and nodes another pod is allocating on, or about to be, left to the last.
Used by the filter (which then reserves the pick) and by prioritize (which only scores)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from shared.core.nodes import FitCache, NodePolicy, Placement, place_pod, without_pod

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping

    from shared.core.accounting import TrackedPod
    from shared.core.fit import FitOptions
    from shared.core.model import NodeSnapshot
    from shared.core.pods import PodInfo
    from shared.core.quota import QuotaProbe
    from shared.core.requests import ContainerRequest
    from svc_scheduler.extender_locks import PendingBinds
    from svc_scheduler.metrics import SchedulerMetrics
    from svc_scheduler.read_model import NodeView, ReadModel
    from svc_scheduler.topology import NodePrediction, TopologyState

log = logging.getLogger("numafit.scheduler")

FIT_CACHE_PRUNE_EVERY = 1024
"""Placements between two prunes of the fit cache (of nodes the read model no longer has)."""


class Placer:
    """Places pods on the read model's nodes (see the module's docstring)."""

    def __init__(
        self,
        read_model: ReadModel,
        topology: TopologyState,
        pending_binds: PendingBinds,
        metrics: SchedulerMetrics,
    ) -> None:
        self.read_model = read_model
        self.topology = topology
        self.pending_binds = pending_binds
        self.metrics = metrics
        self.fit_cache = FitCache()
        """Per-node fit outcomes by (node revision, snapshot, pod shape): unchanged nodes are
        not fitted again by the next filter (shared/core/nodes.py)."""
        self._placements = 0

    def place(
        self,
        names: tuple[str, ...],
        views: Mapping[str, NodeView | None],
        tracked: TrackedPod | None,
        pod: PodInfo,
        requests: list[ContainerRequest | None],
        options: FitOptions,
        policy: NodePolicy,
        probe: QuotaProbe | None = None,
        *,
        assume: bool = True,
    ) -> Placement:
        """The node policy's pick among `names`, on cached fits where a node is unchanged,
        leaving out nodes another pod is still allocating on.

        Where a node publishes NodeResourceTopology, each GPU container is fitted first on the
        NUMA node kubelet is predicted to give it (svc_scheduler/topology.py). `assume`: this
        is the filter's decision, so the chosen node counts what the pod takes there until its
        figures show it (prioritize only scores)."""
        self._placements += 1
        if self._placements % FIT_CACHE_PRUNE_EVERY == 0:
            # Nodes deleted from the cluster leave the read model; their cached fits go too.
            self.fit_cache.prune(lambda name: self.read_model.view(name) is not None)
        snapshots, stamps = self._snapshots(names, views, tracked)
        predictions = self.topology.predict(snapshots, pod, requests)
        plans = {name: p.plan for name, p in predictions.items()}
        # A cached fit is only good for the same plan: the plan rides in the stamp (without
        # NodeResourceTopology there is no plan, and the stamps are used as they are).
        stamped: Mapping[str, Hashable] = stamps
        if plans:
            stamped = {
                name: (stamp, plans[name]) if name in plans else stamp
                for name, stamp in stamps.items()
            }
        # Nodes locked for another pod's allocation, or about to be (a reservation of this
        # extender's whose bind is to come), are left to the last: a pod goes where it is
        # bound at once whenever such a node fits, and waits in its bind otherwise.
        busy = {
            **self.pending_binds.busy(pod.uid),
            **locked_nodes(views, pod.uid, time.time()),
        }
        # A pod kube-scheduler already bound stays where it is: nothing there is busy for it.
        busy.pop(pod.node_name, None)
        placement = place_pod(
            snapshots,
            requests,
            pod.kinds,
            options,
            policy,
            probe,
            busy,
            cache=self.fit_cache,
            stamps=stamped,
            numa=plans or None,
        )
        waiting = [n for n in placement.refused if n in busy and busy[n] == placement.refused[n]]
        if placement.chosen is None and waiting:
            # Every node that fits is busy: the policy's pick among those with the fewest binds
            # to come (the bind waits for its lock, behind them) rather than a refusal
            # kube-scheduler would park the pod on.
            queued = self.pending_binds.queued(pod.uid)
            shortest = min(queued.get(n, 0) for n in waiting)
            among = place_pod(
                {n: snapshots[n] for n in waiting if queued.get(n, 0) == shortest},
                requests,
                pod.kinds,
                options,
                policy,
                probe,
                cache=self.fit_cache,
                stamps=stamped,
                numa=plans or None,
            )
            if among.chosen is not None:
                placement = Placement(
                    among.chosen,
                    among.rows,
                    {n: r for n, r in placement.refused.items() if n not in among.scores},
                    among.scores,
                )
        if assume and placement.chosen is not None:
            self._assume(pod, requests, placement, predictions.get(placement.chosen))
        return placement

    def _assume(
        self,
        pod: PodInfo,
        requests: list[ContainerRequest | None],
        placement: Placement,
        prediction: NodePrediction | None,
    ) -> None:
        assert placement.chosen is not None
        gpus = [p for p, r in enumerate(requests) if r is not None]
        counts = self.topology.placed(
            pod, placement.chosen, placement.rows, gpus, prediction, time.time()
        )
        for result, count in counts.items():
            self.metrics.numa_predictions.labels(result).inc(count)
        if prediction is not None:
            log.debug(
                "NUMA predicted",
                extra={
                    "pod": pod.key,
                    "node": placement.chosen,
                    "numa": dict(prediction.plan.first),
                    "lagging": self.topology.assumed(placement.chosen),
                },
            )

    def _snapshots(
        self,
        names: tuple[str, ...],
        views: Mapping[str, NodeView | None],
        tracked: TrackedPod | None,
    ) -> tuple[dict[str, NodeSnapshot | None], dict[str, tuple[str | None, int]]]:
        """The snapshot each candidate is fitted on, and the stamp (epoch, revision) its fit
        may be cached under: none for the node holding the pod's own earlier reservation (its
        snapshot is a copy without that reservation)."""
        # Comprehensions: this runs over every node of the cluster on every filter.
        present = [(name, view) for name in names if (view := views.get(name)) is not None]
        snapshots: dict[str, NodeSnapshot | None] = dict.fromkeys(names)
        snapshots.update((name, view.snapshot) for name, view in present)
        stamps: dict[str, tuple[str | None, int]] = {
            name: (view.epoch, view.revision) for name, view in present
        }
        own = tracked.node if tracked is not None else None
        if tracked is not None and own is not None:
            snapshot = snapshots.get(own)
            if snapshot is not None:
                snapshots[own] = without_pod(snapshot, tracked.usage)
                del stamps[own]
        return snapshots, stamps


def locked_nodes(views: Mapping[str, NodeView | None], uid: str, now: float) -> dict[str, str]:
    """Nodes whose lock another pod than `uid` holds (and has not let expire), with the reason
    a node that would fit is refused: accounting would refuse the bind there (HAMi's lock)."""
    return {
        name: view.lock.reason
        for name, view in views.items()
        if view is not None and view.lock is not None and view.lock.blocks(uid, now)
    }
