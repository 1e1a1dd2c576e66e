"""Which NUMA node kubelet's Topology Manager gives a container: one pure rule, two users.

The kubelet emulator (shared/testing/kubelet_emulator/placement.py) admits containers by it, and the
scheduler predicts kubelet's choice by it before fitting GPUs, so that the GPUs it reserves are
the ones kubelet will offer and no refit is needed. The rule, as the emulator models kubelet
v1.28 (static CPU manager, one NUMA node per container, container scope):

- the NUMA nodes that can hold the container's exclusive CPUs are the candidates for its CPUs
  (every NUMA node when it has none);
- policy `none`, a container without devices, or a device resource none of whose devices
  report a NUMA node: no device constraint; the CPUs go to the lowest candidate;
- otherwise the lowest candidate that also has enough free device replicas wins;
- none wins: `single-numa-node` and `restricted` refuse (`TopologyAffinityError`),
  `best-effort` admits anyway on the CPU candidate with the most free replicas (lowest on a tie);
- no NUMA node holds the CPUs at all: refused (the aligning policies with
  `TopologyAffinityError`, the others by the CPU manager).

Reuse within a pod (kubelet's device manager and static CPU manager alike): what a regular init
container was given (exclusive CPUs, device replicas) is *reusable* by the containers after it,
which take it first; a regular init container adds what it holds to the reusable set, a sidecar
(restartable init container) or an app container takes its share out. kubelet's hints only
allow NUMA nodes holding every reusable CPU (or replica) of the container's resource, so an app
container following an init container with exclusive CPUs lands on that init container's NUMA
node, counting the reusable CPUs as its own.

A container's CPUs are exclusive, as kubelet's static policy hands them out, only in a
*Guaranteed* pod (every container, init containers included, has CPU and memory limits, and the
requests equal the limits) and only when its CPU request is a whole number: a Burstable pod's
containers run on the shared pool, and only their devices follow the Topology Manager's hint.

`predict_pod` applies the rule to every container of a pod in kubelet's order (init containers
first), each one taking its CPUs and replicas before the next is decided, and turns the answer
into a `NumaPlan` for the fit: the NUMA node each GPU container is fitted on first, and whether
the pod may only be placed where kubelet's choice can hold its GPUs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from shared.core.errors import RequestError
from shared.core.keys import NVIDIA
from shared.core.model import ContainerKind
from shared.core.quantity import parse_quantity

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.core.model import NodeSnapshot
    from shared.core.pods import PodInfo
    from shared.core.requests import ContainerRequest

NUMA_ZONE_INSUFFICIENT = "NumaZoneInsufficient"
"""FailedNodes reason of a node where kubelet's NUMA choice cannot hold a pod."""


class TopologyPolicy(enum.StrEnum):
    """kubelet's `--topology-manager-policy` values."""

    NONE = "none"
    BEST_EFFORT = "best-effort"
    RESTRICTED = "restricted"
    SINGLE_NUMA_NODE = "single-numa-node"

    @property
    def aligning(self) -> bool:
        """Refuses a container without a single-NUMA placement (the emulator models
        `restricted` as `single-numa-node`: multi-node preferred hints are not modelled)."""
        return self in (TopologyPolicy.SINGLE_NUMA_NODE, TopologyPolicy.RESTRICTED)


class TopologyScope(enum.StrEnum):
    """kubelet's `--topology-manager-scope` values."""

    CONTAINER = "container"
    POD = "pod"


class Verdict(enum.Enum):
    ALIGNED = "aligned"
    """CPUs and devices on `numa`; kubelet offers only that node's replicas."""
    UNCONSTRAINED = "unconstrained"
    """No device constraint (policy none, no devices, no topology); CPUs on `numa`."""
    UNALIGNED = "unaligned"
    """best-effort without a node fitting both: CPUs on `numa`, its replicas offered first."""
    TOPOLOGY_AFFINITY_ERROR = "topology_affinity_error"
    """An aligning policy and no NUMA node fits: kubelet refuses the pod."""
    NOT_ENOUGH_CPUS = "not_enough_cpus"
    """No NUMA node has the CPUs (a non-aligning policy): the CPU manager refuses the pod."""

    @property
    def refused(self) -> bool:
        return self in (Verdict.TOPOLOGY_AFFINITY_ERROR, Verdict.NOT_ENOUGH_CPUS)


@dataclass(frozen=True, slots=True)
class KubeletChoice:
    verdict: Verdict
    numa: int | None
    """NUMA node of the container's CPUs (None when refused, or when no NUMA node is known)."""


def kubelet_choice(
    policy: TopologyPolicy,
    *,
    free_cpus: Mapping[int, int],
    free_replicas: Mapping[int, int],
    topology_aware: bool,
    gpu_count: int,
    cpu_count: int,
    reusable_cpus: Mapping[int, int] | None = None,
    reusable_replicas: Mapping[int, int] | None = None,
) -> KubeletChoice:
    """kubelet's decision for one container (the module's rule).

    `free_cpus`: free exclusive CPUs per NUMA node; `free_replicas`: free healthy replicas of
    the container's device resource per NUMA node (a replica reporting two NUMA nodes counts on
    both); negative NUMA ids (no topology) are not NUMA nodes. `reusable_cpus` and
    `reusable_replicas`: what earlier regular init containers of the pod hold, per NUMA node,
    and the container may take first (its hint must then include their NUMA nodes)."""
    reusable_c = {n: c for n, c in (reusable_cpus or {}).items() if c > 0 and n >= 0}
    reusable_r = {n: c for n, c in (reusable_replicas or {}).items() if c > 0 and n >= 0}
    numa_nodes = sorted(
        {n for n in free_cpus if n >= 0}
        | {n for n, c in free_replicas.items() if n >= 0 and c > 0}
        | set(reusable_c)
        | set(reusable_r)
    )

    def holds(n: int, wanted: int, free: Mapping[int, int], reusable: Mapping[int, int]) -> bool:
        # kubelet's hint generation: every reusable item inside the mask, and reusable plus
        # free on the mask at least the request.
        return set(reusable) <= {n} and reusable.get(n, 0) + free.get(n, 0) >= wanted

    cpu_nodes = (
        [n for n in numa_nodes if holds(n, cpu_count, free_cpus, reusable_c)]
        if cpu_count > 0
        else numa_nodes
    )
    if cpu_count > 0 and not cpu_nodes:
        verdict = Verdict.TOPOLOGY_AFFINITY_ERROR if policy.aligning else Verdict.NOT_ENOUGH_CPUS
        return KubeletChoice(verdict, None)
    first = cpu_nodes[0] if cpu_nodes and cpu_count > 0 else None
    if policy is TopologyPolicy.NONE or gpu_count == 0 or not topology_aware:
        return KubeletChoice(Verdict.UNCONSTRAINED, first)
    candidates = [n for n in cpu_nodes if holds(n, gpu_count, free_replicas, reusable_r)]
    if candidates:
        return KubeletChoice(Verdict.ALIGNED, candidates[0])
    if policy.aligning:
        return KubeletChoice(Verdict.TOPOLOGY_AFFINITY_ERROR, None)
    if cpu_count == 0 or not cpu_nodes:
        # No CPU hint to narrow it: the affinity is every NUMA node (kubelet offers every
        # free replica).
        return KubeletChoice(Verdict.UNALIGNED, None)
    return KubeletChoice(
        Verdict.UNALIGNED, max(cpu_nodes, key=lambda n: (free_replicas.get(n, 0), -n))
    )


def exclusive_cpus(
    limits: Mapping[str, object], requests: Mapping[str, object], guaranteed: bool = True
) -> int:
    """A container's exclusive CPUs under kubelet's static policy: its CPU request (absent: the
    limit) when the pod is Guaranteed (`guaranteed`, see `pod_guaranteed`), that request is a
    positive whole number and equals the limit; else 0 (it runs on the shared pool)."""
    limit = limits.get("cpu")
    if limit is None or not guaranteed:
        return 0
    try:
        value, wanted = parse_quantity(limit), parse_quantity(requests.get("cpu", limit))
    except RequestError:
        return 0
    if value != wanted or value.denominator != 1 or value <= 0:
        return 0
    return int(value)


QOS_RESOURCES = ("cpu", "memory")
"""The resources kubelet's QoS class is computed from (extended resources do not count)."""


def pod_guaranteed(
    containers: Sequence[tuple[Mapping[str, object], Mapping[str, object]]],
) -> bool:
    """Whether the pod's QoS class is Guaranteed, as kubelet computes it (`GetPodQOS`): every
    container, init containers included, has positive CPU and memory limits, and the pod's
    summed requests (a missing request defaults to its limit, as the API server defaults it)
    equal its summed limits. `containers`: (limits, requests) of each container."""
    requested: dict[str, Fraction] = {}
    limited: dict[str, Fraction] = {}
    every_limit = True
    for limits, requests in containers:
        found = set()
        for name in QOS_RESOURCES:
            limit, request = limits.get(name), requests.get(name, limits.get(name))
            try:
                lim = parse_quantity(limit) if limit is not None else Fraction(0)
                req = parse_quantity(request) if request is not None else Fraction(0)
            except RequestError:
                return False
            if req > 0:
                requested[name] = requested.get(name, Fraction(0)) + req
            if lim > 0:
                limited[name] = limited.get(name, Fraction(0)) + lim
                found.add(name)
        every_limit = every_limit and found == set(QOS_RESOURCES)
    if not requested and not limited:
        return False  # BestEffort
    return (
        every_limit
        and all(limited.get(name) == value for name, value in requested.items())
        and len(requested) == len(limited)
    )


# --- predicting a pod ---------------------------------------------------------------------


def pod_demands(
    pod: PodInfo, requests: Sequence[ContainerRequest | None]
) -> tuple[ContainerDemand, ...]:
    """Every container's demand in kubelet's order (HAMi's positions: init containers first,
    the same order kubelet admits them in). Only NVIDIA GPUs are aligned by numafit's plugin;
    exclusive CPUs only in a Guaranteed pod."""
    guaranteed = pod_guaranteed([(c.limits, c.requests) for c in pod.containers])
    return tuple(
        ContainerDemand(
            c.name,
            c.kind,
            exclusive_cpus(c.limits, c.requests, guaranteed),
            r.nums if r is not None and r.type == NVIDIA else 0,
        )
        for c, r in zip(pod.containers, requests, strict=True)
    )


def free_replicas(snapshot: NodeSnapshot, vendor: str = NVIDIA) -> dict[int, int]:
    """Free replicas per NUMA node, as kubelet counts the plugin's: every healthy GPU offers
    `count` replicas, one per container sharing it (accounting's `used`)."""
    free: dict[int, int] = {}
    for device in snapshot.devices:
        info = device.info
        if info.health and info.numa >= 0 and info.matches_vendor(vendor):
            free[info.numa] = free.get(info.numa, 0) + max(info.count - device.used, 0)
    return free


def topology_aware(snapshot: NodeSnapshot, vendor: str = NVIDIA) -> bool:
    """kubelet has a device hint only when some GPU reports a NUMA node."""
    return any(d.info.numa >= 0 for d in snapshot.devices if d.info.matches_vendor(vendor))


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """What kubelet's managers see of one container, at its position in the pod."""

    name: str
    kind: ContainerKind
    cpus: int
    """Exclusive CPUs."""
    gpus: int
    """Replicas of the GPU resource (0: none, or a device kubelet does not align)."""


@dataclass(frozen=True, slots=True)
class NodeNuma:
    """What the prediction needs to know about one node."""

    policy: TopologyPolicy
    scope: TopologyScope
    free_cpus: Mapping[int, int]
    """Free exclusive CPUs per NUMA node (the node's report less what it does not show yet)."""
    free_replicas: Mapping[int, int]
    """Free GPU replicas per NUMA node."""
    topology_aware: bool
    """Some GPU reports a NUMA node (else kubelet has no device hint)."""


@dataclass(frozen=True, slots=True)
class NumaPlan:
    """How the fit uses a prediction on one node.

    `first` pairs each GPU container's position with the NUMA node kubelet will give it: the
    fit tries that node's GPUs before the others. `only`: the pod is placed on this node only if
    every such container fits there (a strict pod under an aligning policy, whose refit could
    not repair anything else). `prefer`: any other pod with a prediction; a node where every
    such container fits on its predicted NUMA node is chosen over one where they do not,
    whenever one exists (a best-effort pod's refit, and the fallback after it, then stay rare).
    `refusal`: kubelet would refuse the pod here whatever the GPUs."""

    first: tuple[tuple[int, int], ...] = ()
    only: bool = False
    refusal: str | None = None
    prefer: bool = False
    names: tuple[tuple[int, str], ...] = ()
    """Container names by position, for the reasons."""

    @property
    def numa_of(self) -> dict[int, int]:
        return dict(self.first)

    def refused_at(self, position: int, reason: str) -> str:
        """The reason for a node where the container at `position` does not fit on its NUMA
        node (`reason`: the fit's, counted over that NUMA node's GPUs)."""
        name = dict(self.names).get(position, str(position))
        numa = self.numa_of.get(position)
        return (
            f"{NUMA_ZONE_INSUFFICIENT}: kubelet would pin container {name} to NUMA {numa}, "
            f"whose GPUs cannot hold it: {reason}"
        )


@dataclass(frozen=True, slots=True)
class PodPrediction:
    """kubelet's expected choice per container position (None: no GPU request, or not
    predicted), and what kubelet would refuse, if anything."""

    choices: tuple[KubeletChoice | None, ...]
    refused: ContainerDemand | None = None
    """The container (or, under pod scope, the whole pod) no NUMA node can hold."""
    cpus: tuple[tuple[int, int], ...] = ()
    """(NUMA node, exclusive CPUs) the pod's containers will take, in order."""

    def predicted(self, position: int) -> int | None:
        """The NUMA node the container's GPUs should come from (None: no prediction)."""
        choice = self.choices[position] if position < len(self.choices) else None
        if choice is None or choice.verdict not in (Verdict.ALIGNED, Verdict.UNALIGNED):
            return None
        return choice.numa


def predict_pod(node: NodeNuma, demands: Sequence[ContainerDemand]) -> PodPrediction:
    """kubelet's choice for every container in admission order; each takes its CPUs and
    replicas before the next is decided, as kubelet allocates them one after the other, and
    what regular init containers hold is reused by the containers after them."""
    if node.scope is TopologyScope.POD:
        return _predict_pod_scope(node, demands)
    cpus = dict(node.free_cpus)
    replicas = dict(node.free_replicas)
    reuse = Reuse()
    choices: list[KubeletChoice | None] = []
    taken: list[tuple[int, int]] = []
    for position, demand in enumerate(demands):
        choice = kubelet_choice(
            node.policy,
            free_cpus=cpus,
            free_replicas=replicas,
            topology_aware=node.topology_aware,
            gpu_count=demand.gpus,
            cpu_count=demand.cpus,
            reusable_cpus=reuse.cpus,
            reusable_replicas=reuse.replicas,
        )
        if choice.verdict.refused:
            choices.append(choice)
            choices.extend(None for _ in demands[position + 1 :])
            return PodPrediction(tuple(choices), demand)
        fresh_cpus, fresh_gpus = reuse.admit(demand, choice)
        _take(cpus, replicas, choice, fresh_cpus, fresh_gpus)
        if choice.numa is not None and fresh_cpus:
            taken.append((choice.numa, fresh_cpus))
        choices.append(choice if demand.gpus > 0 else None)
    return PodPrediction(tuple(choices), cpus=tuple(taken))


@dataclass(slots=True)
class Reuse:
    """What a pod's regular init containers hold that the containers after them take first
    (kubelet's `devicesToReuse` and the static policy's `cpusToReuse`), counted per NUMA node."""

    cpus: dict[int, int] = field(default_factory=dict)
    replicas: dict[int, int] = field(default_factory=dict)

    def admit(self, demand: ContainerDemand, choice: KubeletChoice) -> tuple[int, int]:
        """The container is admitted with `choice`: it takes reusable CPUs (on its NUMA node)
        and replicas first. A regular init container then adds what it took afresh to the
        reusable set; any other container takes out what it reused. Returns what it needs
        afresh from the node (CPUs, replicas)."""
        numa = choice.numa
        reused_cpus = min(demand.cpus, self.cpus.get(numa, 0)) if numa is not None else 0
        reused_gpus = min(demand.gpus, sum(self.replicas.values()))
        fresh_cpus, fresh_gpus = demand.cpus - reused_cpus, demand.gpus - reused_gpus
        if demand.kind is ContainerKind.INIT:
            if numa is not None and fresh_cpus:
                self.cpus[numa] = self.cpus.get(numa, 0) + fresh_cpus
            if fresh_gpus:
                # Replicas of an unconstrained container are on no NUMA node the hint knows.
                where = numa if numa is not None else -1
                self.replicas[where] = self.replicas.get(where, 0) + fresh_gpus
            return fresh_cpus, fresh_gpus
        if numa is not None and reused_cpus:
            self.cpus[numa] -= reused_cpus
        for n in sorted(self.replicas, key=lambda k: (k != numa, k)):
            here = min(reused_gpus, self.replicas[n])
            self.replicas[n] -= here
            reused_gpus -= here
        return fresh_cpus, fresh_gpus


def _take(
    cpus: dict[int, int], replicas: dict[int, int], choice: KubeletChoice, cpu: int, gpu: int
) -> None:
    """What one admitted container holds from then on: its CPUs on its NUMA node, and its
    replicas there (an unaligned best-effort container: the rest from the other NUMA nodes,
    lowest first, as the replicas are offered; unconstrained ones: no telling, not counted)."""
    if choice.numa is not None and cpu:
        cpus[choice.numa] = cpus.get(choice.numa, 0) - cpu
    if not gpu or choice.verdict not in (Verdict.ALIGNED, Verdict.UNALIGNED):
        return
    order = [choice.numa] if choice.numa is not None else []
    if choice.verdict is Verdict.UNALIGNED:
        order += sorted(n for n in replicas if n != choice.numa)
    for numa in order:
        here = min(gpu, max(replicas.get(numa, 0), 0))
        replicas[numa] = replicas.get(numa, 0) - here
        gpu -= here


def _predict_pod_scope(node: NodeNuma, demands: Sequence[ContainerDemand]) -> PodPrediction:
    """Pod scope: one NUMA node for the whole pod, sized as kubelet sizes a pod (the largest
    regular init container, or the sidecars and apps together, whichever is more)."""
    inits = [d for d in demands if d.kind is ContainerKind.INIT]
    running = [d for d in demands if d.kind is not ContainerKind.INIT]
    cpu = max([d.cpus for d in inits] + [sum(d.cpus for d in running)])
    gpu = max([d.gpus for d in inits] + [sum(d.gpus for d in running)])
    choice = kubelet_choice(
        node.policy,
        free_cpus=node.free_cpus,
        free_replicas=node.free_replicas,
        topology_aware=node.topology_aware,
        gpu_count=gpu,
        cpu_count=cpu,
    )
    if choice.verdict.refused:
        whole = ContainerDemand("", ContainerKind.APP, cpu, gpu)
        return PodPrediction(tuple(None for _ in demands), whole)
    taken = ((choice.numa, cpu),) if choice.numa is not None and cpu else ()
    return PodPrediction(tuple(choice if d.gpus > 0 else None for d in demands), cpus=taken)


def plan_for(
    node: NodeNuma,
    demands: Sequence[ContainerDemand],
    prediction: PodPrediction,
    strict: bool,
    *,
    opted_in: bool = False,
) -> NumaPlan:
    """The fit's plan from a prediction. A pod kubelet would refuse under an aligning policy
    is refused here (it would fail admission whatever the GPUs); under the other policies it
    is left to kubelet, as without a prediction. `strict`: the pod opted in to strict
    alignment, so a node where its GPUs cannot follow kubelet's choice is refused. `opted_in`:
    the pod opted in at all (`hami.io/numa-alignment`): under an aligning policy a best-effort
    pod is refused there too, since kubelet offers only that NUMA node's GPUs and its fallback
    never over-commits one (shared/core/fallback.py): it could only fail admission. Any other
    pod with a prediction prefers nodes where its GPUs can follow kubelet's choice."""
    names = tuple((p, d.name) for p, d in enumerate(demands))
    if prediction.refused is not None:
        if not node.policy.aligning:
            return NumaPlan(names=names)
        demand = prediction.refused
        what = "the pod" if node.scope is TopologyScope.POD else f"container {demand.name}"
        return NumaPlan(
            names=names,
            refusal=(
                f"{NUMA_ZONE_INSUFFICIENT}: no NUMA node has {demand.cpus} free CPUs and "
                f"{demand.gpus} free GPU slot(s) for {what} "
                f"({node.policy.value}, {node.scope.value} scope)"
            ),
        )
    first = tuple(
        (p, numa) for p in range(len(demands)) if (numa := prediction.predicted(p)) is not None
    )
    only = (strict or opted_in) and node.policy.aligning
    return NumaPlan(first, only=only, names=names, prefer=bool(first) and not only)
