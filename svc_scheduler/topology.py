"""NUMA predictions from NodeResourceTopology: what the scheduler knows of each node's NUMA
zones, the pods it placed that those figures do not show yet, and how its predictions turned
out. Pure bookkeeping, no I/O (topology_watch.py feeds it; the extender asks it).

Lag. An exporter publishes a node's figures some time after kubelet admitted a pod, and the
scheduler sees them later still, so the pods it placed since the figures were taken are
counted against them, as the NodeResourceTopology plugin's reserve cache does: each placement
is *assumed* (the exclusive CPUs each container will take, on the NUMA node predicted for it)
until figures taken after it arrive. numafit's publisher stamps when its figures were taken
(`numafit.io/sampled-at`); for other exporters the moment the scheduler saw the object, less
`FOREIGN_LAG`, stands in. Assumptions older than `ASSUMED_TTL` are dropped (a pod placed but
never admitted would otherwise hold its CPUs forever). Counting an assumed pod on its predicted
NUMA node only is optimistic when a prediction was wrong; the refit behind it repairs that.

Outcomes (`numafit_scheduler_numa_predictions_total{result}`), one per GPU container placed:
`none` when nothing was predicted (the node publishes no NodeResourceTopology, its policy is
`none`, its GPUs report no NUMA node), counted at placement; otherwise, once the node's figures
include the pod, the pod's own annotations decide (the scheduler reads the pod): `hit` when
the container runs on exactly the GPUs the scheduler reserved for it (`hami.io/vgpu-devices-
allocated`, which accounting keeps equal to what runs: after a refit moved it, or kubelet gave
other GPUs, it names those), `miss` when it needed a refit or kubelet gave it other GPUs, and
`miss` for every predicted container of a pod that failed admission. A pod still allocating is
read again at the node's next update (for at most `ASSUMED_TTL`); one deleted meanwhile is not
counted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.numa_prediction import (
    NodeNuma,
    NumaPlan,
    PodPrediction,
    TopologyPolicy,
    free_replicas,
    plan_for,
    pod_demands,
    predict_pod,
    topology_aware,
)
from shared.core.pods import Alignment, parse_alignment, pod_from_object

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from shared.core.model import ContainerEntry, NodeSnapshot
    from shared.core.nrt import NodeTopology
    from shared.core.pods import PodInfo
    from shared.core.requests import ContainerRequest

FOREIGN_LAG: Final = 1.0
"""Seconds an object without `numafit.io/sampled-at` is taken to be older than when seen."""
ASSUMED_TTL: Final = 600.0
"""Seconds a placement is counted against figures that never came to include it."""
MAX_ASSUMED: Final = 4096
"""Placements remembered per node (and outcomes pending overall); the oldest go first."""

HIT, MISS, NONE = "hit", "miss", "none"
RESULTS: Final = (HIT, MISS, NONE)


@dataclass(frozen=True, slots=True)
class Assumed:
    """A placement the node's figures may not show yet."""

    uid: str
    placed_at: float
    cpus: tuple[tuple[int, int], ...]
    """(NUMA node, exclusive CPUs) its containers will take."""


@dataclass(slots=True)
class _Node:
    topology: NodeTopology
    covers: float
    """Placements up to this moment (seconds since the epoch) are in the figures."""
    assumed: OrderedDict[str, Assumed] = field(default_factory=OrderedDict)


@dataclass(frozen=True, slots=True)
class Pending:
    """A placement with predictions whose outcome is not known yet."""

    uid: str
    namespace: str
    name: str
    node: str
    placed_at: float
    reserved: tuple[frozenset[str], ...]
    """GPU UUIDs reserved per container position."""
    predicted: tuple[int, ...]
    """Positions of the containers with a prediction."""


@dataclass(frozen=True, slots=True)
class NodePrediction:
    """One candidate's prediction: the fit's plan and what the pod would take there."""

    plan: NumaPlan
    prediction: PodPrediction


class TopologyState:
    """Every node's NUMA figures, the placements they lag behind, the pending outcomes."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._where: dict[str, str] = {}
        """Pod UID -> the node its assumption is on."""
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._counted: OrderedDict[str, None] = OrderedDict()
        """Pods whose outcomes were counted (a retried filter does not count them again)."""

    # --- figures ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._nodes)

    def nodes(self) -> list[str]:
        return list(self._nodes)

    def topology(self, node: str) -> NodeTopology | None:
        entry = self._nodes.get(node)
        return entry.topology if entry is not None else None

    def apply(self, topology: NodeTopology, seen_at: float) -> list[Pending]:
        """New figures for one node. Returns the pending outcomes they make due (placements
        the figures include)."""
        covers = topology.sampled_at if topology.sampled_at is not None else seen_at - FOREIGN_LAG
        entry = self._nodes.get(topology.node)
        if entry is None:
            entry = self._nodes[topology.node] = _Node(topology, covers)
        entry.topology, entry.covers = topology, covers
        for uid in [u for u, a in entry.assumed.items() if a.placed_at <= covers]:
            self._unassume(entry, uid)
        for uid in [u for u, a in entry.assumed.items() if a.placed_at < seen_at - ASSUMED_TTL]:
            self._unassume(entry, uid)
        # A placement never bound (or never finished) is not read again forever.
        for uid in [u for u, p in self._pending.items() if p.placed_at < seen_at - ASSUMED_TTL]:
            del self._pending[uid]
        return self.due(topology.node)

    def replace_all(self, topologies: Iterable[NodeTopology], seen_at: float) -> list[Pending]:
        """A relist: exactly these nodes have figures now."""
        listed = {t.node: t for t in topologies}
        for node in [n for n in self._nodes if n not in listed]:
            self.drop(node)
        due: list[Pending] = []
        for topology in listed.values():
            due += self.apply(topology, seen_at)
        return due

    def drop(self, node: str) -> None:
        """The node has no (readable) figures any more: it is scheduled as without them."""
        entry = self._nodes.pop(node, None)
        if entry is not None:
            for uid in entry.assumed:
                self._where.pop(uid, None)

    def free_cpus(self, node: str, exclude: str = "") -> dict[int, int] | None:
        """The node's free exclusive CPUs per NUMA node, less what placed pods the figures do
        not show yet will take (`exclude`: the pod being placed, never counted against
        itself); None without figures."""
        entry = self._nodes.get(node)
        if entry is None:
            return None
        free = dict(entry.topology.free_cpus)
        for uid, assumed in entry.assumed.items():
            if uid == exclude:
                continue
            for numa, cpus in assumed.cpus:
                free[numa] = free.get(numa, 0) - cpus
        return free

    def assumed(self, node: str) -> int:
        """Placements counted against the node's figures."""
        entry = self._nodes.get(node)
        return len(entry.assumed) if entry is not None else 0

    def _assume(self, node: str, uid: str, cpus: tuple[tuple[int, int], ...], now: float) -> None:
        self._forget_assumed(uid)
        entry = self._nodes.get(node)
        if entry is None or not cpus:
            return
        entry.assumed[uid] = Assumed(uid, now, cpus)
        self._where[uid] = node
        while len(entry.assumed) > MAX_ASSUMED:
            self._unassume(entry, next(iter(entry.assumed)))

    def _forget_assumed(self, uid: str) -> None:
        node = self._where.pop(uid, None)
        entry = self._nodes.get(node) if node is not None else None
        if entry is not None:
            entry.assumed.pop(uid, None)

    def _unassume(self, entry: _Node, uid: str) -> None:
        entry.assumed.pop(uid, None)
        if self._where.get(uid) == entry.topology.node:
            del self._where[uid]

    # --- predictions ------------------------------------------------------------------------

    def predict(
        self,
        snapshots: Mapping[str, NodeSnapshot | None],
        pod: PodInfo,
        requests: Sequence[ContainerRequest | None],
    ) -> dict[str, NodePrediction]:
        """Kubelet's NUMA choice on every candidate that has figures and GPUs (others: none).
        Under policy `none`, or on GPUs without NUMA nodes, nothing is predicted."""
        if not self._nodes:
            return {}
        try:
            mode = parse_alignment(pod.annotations.get(keys.NUMA_ALIGNMENT))
        except CoreError:
            mode = None  # the webhook refuses such a value; here it only means not opted in
        strict = mode is Alignment.STRICT
        demands = pod_demands(pod, requests)
        predictions: dict[str, NodePrediction] = {}
        for name, snapshot in snapshots.items():
            topology = self.topology(name)
            if topology is None or snapshot is None or topology.policy is TopologyPolicy.NONE:
                continue
            if not topology_aware(snapshot):
                continue
            free = self.free_cpus(name, exclude=pod.uid)
            assert free is not None  # the node has figures
            node = NodeNuma(
                topology.policy, topology.scope, free, free_replicas(snapshot), topology_aware=True
            )
            prediction = predict_pod(node, demands)
            predictions[name] = NodePrediction(
                plan_for(node, demands, prediction, strict, opted_in=mode is not None), prediction
            )
        return predictions

    def placed(
        self,
        pod: PodInfo,
        node: str,
        rows: Sequence[ContainerEntry],
        gpu_positions: Iterable[int],
        prediction: NodePrediction | None,
        now: float,
    ) -> dict[str, int]:
        """The filter placed `pod` on `node`: assume what it takes there and remember what to
        judge later. Returns the outcomes known at once (`none`), counted once per pod."""
        predicted = prediction.plan.numa_of if prediction is not None else {}
        self._assume(node, pod.uid, prediction.prediction.cpus if prediction else (), now)
        if pod.uid in self._counted:
            return {}
        unpredicted = [p for p in gpu_positions if p not in predicted]
        if predicted:
            self._pending[pod.uid] = Pending(
                pod.uid,
                pod.namespace,
                pod.name,
                node,
                now,
                tuple(frozenset(d.uuid for d in entry) for entry in rows),
                tuple(sorted(predicted)),
            )
            self._pending.move_to_end(pod.uid)
            while len(self._pending) > MAX_ASSUMED:
                self._pending.popitem(last=False)
        else:
            self._pending.pop(pod.uid, None)
            self._mark_counted(pod.uid)
        return {NONE: len(unpredicted)} if unpredicted else {}

    def due(self, node: str) -> list[Pending]:
        """Pending outcomes on `node` whose placement its figures include."""
        entry = self._nodes.get(node)
        if entry is None:
            return []
        return [p for p in self._pending.values() if p.node == node and p.placed_at <= entry.covers]

    def pending(self) -> int:
        return len(self._pending)

    def resolve(self, pending: Pending, pod: object | None) -> dict[str, int] | None:
        """The outcomes of `pending` from the pod as the API server has it now (None: the pod
        is gone). Returns None while the pod is still being allocated (ask again later)."""
        if self._pending.get(pending.uid) is not pending:
            return None  # replaced by a newer placement, or already counted
        counts = outcome(pending, pod)
        if counts is None:
            return None
        del self._pending[pending.uid]
        self._mark_counted(pending.uid)
        return counts

    def _mark_counted(self, uid: str) -> None:
        self._counted[uid] = None
        self._counted.move_to_end(uid)
        while len(self._counted) > MAX_ASSUMED:
            self._counted.popitem(last=False)


def outcome(pending: Pending, pod: object | None) -> dict[str, int] | None:
    """`hit`/`miss` per predicted container once the pod's allocation finished; None while it
    has not; `{}` for a pod that is gone or no longer the one placed (nothing to count)."""
    if pod is None:
        return {}
    try:
        info = pod_from_object(pod)
    except CoreError:
        return {}
    if info.uid != pending.uid:
        return {}
    phase = info.annotations.get(keys.BIND_PHASE)
    if info.phase == "Failed" or phase == keys.PHASE_FAILED:
        return {MISS: len(pending.predicted)}
    if phase != keys.PHASE_SUCCESS:
        return None
    try:
        runs = codec.decode_pod(info.annotations.get(keys.ALLOCATED, ""))
    except CoreError:
        return {}
    counts = {HIT: 0, MISS: 0}
    for position in pending.predicted:
        reserved = pending.reserved[position] if position < len(pending.reserved) else frozenset()
        actual = frozenset(d.uuid for d in runs[position]) if position < len(runs) else None
        counts[HIT if actual == reserved else MISS] += 1
    return {k: v for k, v in counts.items() if v}
