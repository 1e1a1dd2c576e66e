"""Choosing a node for a pod: fit it on every candidate, score each node, rank by node policy.

HAMi's extender fits the whole pod (d.6) on every candidate node, computes each fitting node's
usage score *after* the pod is placed, and picks one node by the node policy
(`hami.io/node-scheduler-policy`, default `--node-scheduler-policy`): `binpack` prefers the most
used node (fill nodes up, keep others free for big pods), `spread` the least used one. The
score is HAMi's `ComputeDefaultScore`: 10 × (slots used/slots + cores used/cores + MiB
used/MiB) summed over the node's GPUs. Ties end on the node name so decisions are reproducible.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.fit import FitOptions, fit_pod
from shared.core.keys import NODE_POLICY, SCORE_WEIGHT_FACTOR

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

    from shared.core.config import CoreConfig
    from shared.core.model import ContainerEntry, ContainerKind, NodeSnapshot, PodUsage, Usage
    from shared.core.numa_prediction import NumaPlan
    from shared.core.quota import QuotaProbe
    from shared.core.requests import ContainerRequest

NODE_UNREGISTERED = "node unregistered"
"""HAMi's refusal text for a candidate node that carries no GPU inventory."""

MAX_NODE_SCORE = 3 * SCORE_WEIGHT_FACTOR
"""A node whose every GPU is fully used in slots, cores and memory."""
MAX_EXTENDER_PRIORITY = 10
"""kube-scheduler's `MaxExtenderPriority`: prioritize answers 0..10."""


class NodePolicy(enum.Enum):
    BINPACK = "binpack"
    SPREAD = "spread"


def parse_node_policy(annotations: Mapping[str, str], config: CoreConfig) -> NodePolicy:
    """The pod's annotation, else the configured default; anything but `spread` is binpack,
    as in HAMi (its node sort only distinguishes spread)."""
    value = annotations.get(NODE_POLICY) or config.node_scheduler_policy
    return NodePolicy.SPREAD if value.strip().lower() == "spread" else NodePolicy.BINPACK


def node_score(node: NodeSnapshot) -> float:
    """HAMi's node usage score (0 .. 30): slot, core and memory utilisation of the whole node.
    A node whose totals are zero in one dimension scores 0 in that dimension."""
    used = sum(d.used for d in node.devices)
    cores = sum(d.usedcores for d in node.devices)
    mem = sum(d.usedmem for d in node.devices)
    total = sum(d.info.count for d in node.devices)
    total_cores = sum(d.info.devcore for d in node.devices)
    total_mem = sum(d.info.devmem for d in node.devices)
    ratio = 0.0
    for part, whole in ((used, total), (cores, total_cores), (mem, total_mem)):
        if whole > 0:
            ratio += part / whole
    return SCORE_WEIGHT_FACTOR * ratio


def rank_nodes(scores: Mapping[str, float], policy: NodePolicy) -> list[str]:
    """Node names, most preferred first (binpack: highest score; spread: lowest)."""
    # Sorting (score, name) pairs compares in C; a key function is a Python call per node.
    if policy is NodePolicy.SPREAD:
        return [name for _, name in sorted([(score, name) for name, score in scores.items()])]
    return [name for _, name in sorted([(-score, name) for name, score in scores.items()])]


def extender_priority(score: float, policy: NodePolicy) -> int:
    """A node score mapped onto the extender's 0..10 scale, 10 = most preferred by the policy.

    The mapping is absolute (not relative to the other candidates) so the same node state
    always gets the same priority, whichever nodes are asked about together.
    """
    clamped = min(max(score, 0.0), float(MAX_NODE_SCORE))
    level = round(clamped * MAX_EXTENDER_PRIORITY / MAX_NODE_SCORE)
    return level if policy is NodePolicy.BINPACK else MAX_EXTENDER_PRIORITY - level


def without_pod(node: NodeSnapshot, usage: PodUsage) -> NodeSnapshot:
    """A copy of `node` with one pod's stored usage taken out (d.2 counted it as
    `Used += max(Slots,1)`), so a pod scheduled again is not counted against itself."""
    copy = node.copy()
    devices = copy.by_uuid()
    for uuid, u in usage.items():
        device = devices.get(uuid)
        if device is not None:
            device.subtract(u.counted)
    return copy


def usage_growth(old: PodUsage, new: PodUsage) -> dict[str, Usage]:
    """What replacing a pod's stored usage `old` by `new` adds on each device, as a snapshot
    counts it; devices where it does not grow are left out (what it frees is not given back)."""
    grown: dict[str, Usage] = {}
    for uuid, after in new.items():
        before = old.get(uuid)
        extra = after.counted if before is None else after.counted.clamp_sub(before.counted)
        if not extra.is_zero:
            grown[uuid] = extra
    return grown


def with_added(node: NodeSnapshot, additions: Iterable[PodUsage]) -> NodeSnapshot:
    """A copy of `node` with each of `additions` (already counted per device) added."""
    copy = node.copy()
    devices = copy.by_uuid()
    for added in additions:
        for uuid, u in added.items():
            device = devices.get(uuid)
            if device is not None:
                device.add(u)
    return copy


@dataclass(frozen=True, slots=True)
class NodeFit:
    """One node's outcome for one pod: HAMi's refusal reason, or the pod's container rows and
    the node's score after placing it."""

    reason: str | None
    rows: tuple[ContainerEntry, ...] = ()
    score: float = 0.0
    local: bool = True
    """Every GPU container fits on the NUMA node kubelet is predicted to give it (or nothing
    was predicted): such nodes are chosen first (`NumaPlan.prefer`)."""

    @property
    def ok(self) -> bool:
        return self.reason is None


def fit_node(
    snapshot: NodeSnapshot | None,
    requests: Sequence[ContainerRequest | None],
    kinds: Sequence[ContainerKind],
    options: FitOptions,
    quota: QuotaProbe | None = None,
    numa: NumaPlan | None = None,
) -> NodeFit:
    """Fit the whole pod on one node (None = no GPU inventory) and score the node after it.
    `numa`: kubelet's predicted NUMA choice on this node (its GPUs are tried first)."""
    if snapshot is None:
        return NodeFit(NODE_UNREGISTERED)
    if numa is not None and numa.refusal is not None:
        return NodeFit(numa.refusal)
    first = numa.numa_of if numa is not None else None
    only = numa is not None and numa.only
    if numa is not None and numa.prefer and first:
        local = fit_pod(snapshot, requests, kinds, options, quota, numa_first=first, numa_only=True)
        if local.ok and local.node is not None:
            return NodeFit(None, local.rows, node_score(local.node))
    fit = fit_pod(snapshot, requests, kinds, options, quota, numa_first=first, numa_only=only)
    if not fit.ok or fit.node is None:
        reason = fit.failure.reason_text if fit.failure is not None else "NodeUnfitPod"
        if numa is not None and only and first and fit.failed_position in first:
            reason = numa.refused_at(fit.failed_position, reason)
        return NodeFit(reason)
    return NodeFit(
        None, fit.rows, node_score(fit.node), local=not (numa is not None and numa.prefer and first)
    )


FIT_CACHE_SHAPES = 32
"""Pod request shapes whose per-node outcomes a `FitCache` keeps (least recently used go)."""


class FitCache:
    """Per-node fit outcomes, reused while neither the node nor the pod's request shape changed.

    An entry is keyed by the pod's shape (requests, container kinds, fit options) and the node
    name, and holds the node's *stamp* (what the caller read it at, e.g. its revision) and the
    very snapshot object it was computed on: a new revision or another snapshot object is a
    miss, and the node is fitted again. The outcome is a pure function of (snapshot, shape), so
    a hit is exactly what the fit would say, reasons included. Fits against a quota are never
    cached (the namespace's usage moves independently of the node).
    """

    def __init__(self, shapes: int = FIT_CACHE_SHAPES) -> None:
        self.shapes = shapes
        self._by_shape: OrderedDict[
            Hashable, dict[str, tuple[Hashable, NodeSnapshot | None, NodeFit]]
        ] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def shape(
        requests: Sequence[ContainerRequest | None],
        kinds: Sequence[ContainerKind],
        options: FitOptions,
    ) -> Hashable:
        return (tuple(requests), tuple(kinds), options)

    def entries(self, shape: Hashable) -> dict[str, tuple[Hashable, NodeSnapshot | None, NodeFit]]:
        """The per-node entries of one shape (created, and marked recently used)."""
        entries = self._by_shape.get(shape)
        if entries is None:
            entries = {}
            self._by_shape[shape] = entries
            while len(self._by_shape) > self.shapes:
                self._by_shape.popitem(last=False)
        else:
            self._by_shape.move_to_end(shape)
        return entries

    def forget(self, node: str) -> None:
        """Drop every outcome computed on `node` (e.g. the node was deleted)."""
        for entries in self._by_shape.values():
            entries.pop(node, None)

    def prune(self, keep: Callable[[str], bool]) -> int:
        """Drop the outcomes of every node `keep` refuses (nodes that left the cluster: their
        names would otherwise stay until their shape is evicted). Returns how many went."""
        dropped = 0
        for entries in self._by_shape.values():
            for node in [n for n in entries if not keep(n)]:
                del entries[node]
                dropped += 1
        return dropped

    def __len__(self) -> int:
        return sum(len(e) for e in self._by_shape.values())


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a pod goes: the chosen node and its container rows, why the others were refused,
    and every fitting node's score after placing the pod."""

    chosen: str | None
    rows: tuple[ContainerEntry, ...]
    refused: Mapping[str, str]
    scores: Mapping[str, float]

    @property
    def ranked(self) -> list[str]:
        return list(self.scores)


def place_pod(
    nodes: Mapping[str, NodeSnapshot | None],
    requests: Sequence[ContainerRequest | None],
    kinds: Sequence[ContainerKind],
    options: FitOptions,
    policy: NodePolicy,
    quota: QuotaProbe | None = None,
    locked: Mapping[str, str] | None = None,
    *,
    cache: FitCache | None = None,
    stamps: Mapping[str, Hashable] | None = None,
    numa: Mapping[str, NumaPlan] | None = None,
) -> Placement:
    """Fit the pod on every candidate (None = the node has no GPU inventory) and pick one.

    `refused` maps each node that cannot hold the pod to HAMi's reason text, e.g.
    `1/2 CardInsufficientMemory`; `scores` lists the fitting nodes best first. `locked` maps
    nodes whose lock another pod holds (shared/core/lock.py) to why: such a node that would fit
    is refused with that reason instead of being ranked, so the policy picks among free nodes.

    With a `cache`, a node that has a stamp in `stamps` reuses the outcome computed on the same
    snapshot at the same stamp for the same pod shape (no cache is used with a quota probe);
    a node with a NUMA plan in `numa` must carry that plan in its stamp.
    """
    refused: dict[str, str] = {}
    rows: dict[str, tuple[ContainerEntry, ...]] = {}
    scores: dict[str, float] = {}
    elsewhere: set[str] = set()
    """Fitting nodes where kubelet's predicted NUMA node cannot hold the pod's GPUs."""
    entries = None
    if cache is not None and stamps is not None and quota is None:
        entries = cache.entries(cache.shape(requests, kinds, options))
    # This loop runs over every node of the cluster on every filter: names looked up once.
    stamp_of = stamps.get if entries is not None and stamps is not None else None
    entry_of = entries.get if entries is not None else None
    locked = locked or {}
    hits = misses = 0
    for name, snapshot in nodes.items():
        outcome = None
        stamp = None
        if stamp_of is not None and entry_of is not None:
            stamp = stamp_of(name)
            if stamp is not None:
                entry = entry_of(name)
                if entry is not None and entry[1] is snapshot and entry[0] == stamp:
                    outcome = entry[2]
                    hits += 1
        if outcome is None:
            plan = numa.get(name) if numa is not None else None
            outcome = fit_node(snapshot, requests, kinds, options, quota, plan)
            if entries is not None and stamp is not None:
                entries[name] = (stamp, snapshot, outcome)
                misses += 1
        if outcome.reason is not None:
            refused[name] = outcome.reason
        elif name in locked:
            refused[name] = locked[name]
        else:
            rows[name] = outcome.rows
            scores[name] = outcome.score
            if not outcome.local:
                elsewhere.add(name)
    if cache is not None:
        cache.hits += hits
        cache.misses += misses
    return _choose(rows, refused, scores, elsewhere, policy)


def _choose(
    rows: Mapping[str, tuple[ContainerEntry, ...]],
    refused: Mapping[str, str],
    scores: Mapping[str, float],
    elsewhere: set[str],
    policy: NodePolicy,
) -> Placement:
    """Rank the fitting nodes by the policy, those where kubelet's NUMA choice holds the pod's
    GPUs first, and pick the best."""
    ranked = rank_nodes(scores, policy)
    if elsewhere and len(elsewhere) < len(ranked):
        # A node where kubelet's NUMA choice holds the GPUs wins whenever there is one.
        ranked = [n for n in ranked if n not in elsewhere] + [n for n in ranked if n in elsewhere]
    ordered = {name: scores[name] for name in ranked}
    if not ranked:
        return Placement(None, (), refused, ordered)
    best = ranked[0]
    return Placement(best, rows[best], refused, ordered)
