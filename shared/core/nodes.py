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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.fit import FitOptions, PodFit, fit_pod
from shared.core.keys import NODE_POLICY, SCORE_WEIGHT_FACTOR
from shared.core.model import ContainerEntry, ContainerKind, NodeSnapshot, PodUsage, Usage

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.core.config import CoreConfig
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
    if policy is NodePolicy.SPREAD:
        return sorted(scores, key=lambda name: (scores[name], name))
    return sorted(scores, key=lambda name: (-scores[name], name))


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
            device.subtract(Usage(u.mem, u.cores, max(u.slots, 1)))
    return copy


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
) -> Placement:
    """Fit the pod on every candidate (None = the node has no GPU inventory) and pick one.

    `refused` maps each node that cannot hold the pod to HAMi's reason text, e.g.
    `1/2 CardInsufficientMemory`; `scores` lists the fitting nodes best first. `locked` maps
    nodes whose lock another pod holds (shared/core/lock.py) to why: such a node that would fit
    is refused with that reason instead of being ranked, so the policy picks among free nodes.
    """
    refused: dict[str, str] = {}
    fits: dict[str, PodFit] = {}
    scores: dict[str, float] = {}
    for name, snapshot in nodes.items():
        if snapshot is None:
            refused[name] = NODE_UNREGISTERED
            continue
        fit = fit_pod(snapshot, requests, kinds, options, quota)
        if not fit.ok or fit.node is None:
            refused[name] = fit.failure.reason_text if fit.failure is not None else "NodeUnfitPod"
            continue
        if locked is not None and name in locked:
            refused[name] = locked[name]
            continue
        fits[name] = fit
        scores[name] = node_score(fit.node)
    ranked = rank_nodes(scores, policy)
    ordered = {name: scores[name] for name in ranked}
    if not ranked:
        return Placement(None, (), refused, ordered)
    best = ranked[0]
    return Placement(best, fits[best].rows, refused, ordered)
