"""kubelet's decisions for one container, as pure functions: its NUMA affinity and its devices.

Which NUMA node wins is the core's rule (``shared.core.numa_prediction.kubelet_choice``), the
same one the scheduler predicts with; :func:`place` adds how kubelet's device manager sorts the
free replicas by that affinity (``filterByAffinity``), and :class:`DeviceAllocation` is the
device manager's ``devicesToAllocate`` (kubelet v1.28), step by step around the one
GetPreferredAllocation call it may make:

1. replicas reusable from the pod's regular init containers are taken first; when they are
   enough, nothing is asked (the app container runs on its init container's replicas);
2. when more free replicas lie inside the affinity than are still needed, the plugin is asked
   (offered: those replicas and what was taken so far; must include: what was taken), and
   kubelet keeps the part of the answer inside the affinity, filling the rest itself;
3. otherwise every replica inside the affinity is taken (when they cover the request exactly,
   nothing is asked), then the plugin is asked about every free replica for the rest, and
   kubelet fills what the answer leaves from outside the affinity, then from replicas without
   a NUMA node.

kubelet hands the plugin Go sets (``UnsortedList``) and fills from them in Go's map order, which
is random: here a seeded ``random.Random`` plays that part, so a run is arbitrary but
reproducible. Keeping this apart from gRPC makes the rules testable on their own and keeps the
emulator a thin driver.

Simplifications against the real kubelet, on purpose:

- a container is always placed on one NUMA node: ``restricted`` behaves like
  ``single-numa-node`` (multi-node preferred hints are not modelled), and exclusive CPUs are
  never spread over NUMA nodes;
- ``best-effort`` without a NUMA node fitting CPUs and devices admits with every NUMA node as
  the affinity (what kubelet was seen to do): every free replica is offered; the exclusive CPUs
  go to the NUMA node (among those with enough CPUs) with the most free replicas;
- a resource none of whose devices report topology imposes no NUMA constraint (kubelet's nil
  hint), and devices without topology only serve such cases, policy ``none`` and the fill after
  the affinity's replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.numa_prediction import TopologyPolicy, Verdict, kubelet_choice
from shared.testing.kubelet_emulator.errors import TopologyAffinityError, UnexpectedAdmissionError

if TYPE_CHECKING:
    import random
    from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "DeviceAllocation",
    "FreeDevice",
    "Placement",
    "PreferenceAsk",
    "place",
    "replicas_per_numa",
]


@dataclass(frozen=True, slots=True)
class FreeDevice:
    """A healthy replica (free, or reusable by the container) and the NUMA nodes it reports."""

    id: str
    numa_nodes: frozenset[int]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a container goes: its NUMA affinity and the free replicas sorted by it."""

    numa: int | None
    """The single NUMA node of the container's affinity (None: no constraint, or every NUMA
    node after a best-effort admission without a fit)."""
    cpu_numa: int | None
    """NUMA node of the container's exclusive CPUs (None: it has none, or no NUMA node is
    known)."""
    in_affinity: tuple[str, ...]
    """Free replicas inside the affinity (kubelet's `aligned` set)."""
    outside: tuple[str, ...]
    """Free replicas on other NUMA nodes (`unaligned`)."""
    no_topology: tuple[str, ...]
    """Free replicas without a NUMA node, or every free replica without a hint
    (`noAffinity`)."""
    aligned: bool
    """False for a best-effort admission that had no NUMA node fitting CPUs and devices."""

    @property
    def free(self) -> tuple[str, ...]:
        """Every free replica kubelet may hand out."""
        return self.in_affinity + self.outside + self.no_topology


def place(
    policy: TopologyPolicy,
    *,
    free_cpus: Mapping[int, int],
    free_devices: Sequence[FreeDevice],
    topology_aware: bool,
    gpu_count: int,
    cpu_count: int,
    reusable_cpus: Mapping[int, int] | None = None,
    reusable_devices: Sequence[FreeDevice] = (),
) -> Placement:
    """Decide like kubelet's Topology Manager; raise its admission errors.

    `reusable_cpus` (per NUMA node) and `reusable_devices` are what the pod's regular init
    containers hold that this container may take first: kubelet's hints must include their
    NUMA nodes. The NUMA node comes from the rule the scheduler predicts with
    (shared/core/numa_prediction.py); this adds how the free replicas are sorted by it."""
    if gpu_count < 0 or cpu_count < 0:
        raise ValueError("gpu_count and cpu_count must be >= 0")
    choice = kubelet_choice(
        policy,
        free_cpus=free_cpus,
        free_replicas=replicas_per_numa(free_devices),
        topology_aware=topology_aware,
        gpu_count=gpu_count,
        cpu_count=cpu_count,
        reusable_cpus=reusable_cpus,
        reusable_replicas=replicas_per_numa(reusable_devices),
    )
    if choice.verdict is Verdict.TOPOLOGY_AFFINITY_ERROR:
        raise TopologyAffinityError()
    if choice.verdict is Verdict.NOT_ENOUGH_CPUS:
        largest = max(
            (free_cpus.get(n, 0) + (reusable_cpus or {}).get(n, 0) for n in free_cpus), default=0
        )
        raise UnexpectedAdmissionError(
            "not enough cpus available on a single NUMA node to satisfy request: "
            f"requested={cpu_count}, largest free={largest}"
        )
    cpu_numa = choice.numa if cpu_count > 0 else None
    every = tuple(d.id for d in free_devices)
    if choice.verdict is Verdict.UNCONSTRAINED:
        # No hint: kubelet's device manager puts every free replica in `noAffinity`.
        return Placement(None, cpu_numa, (), (), every, True)
    with_topology = tuple(d.id for d in free_devices if d.numa_nodes)
    without = tuple(d.id for d in free_devices if not d.numa_nodes)
    if choice.verdict is Verdict.UNALIGNED:
        # best-effort without a fit: the affinity is every NUMA node.
        return Placement(None, cpu_numa, with_topology, (), without, False)
    numa = choice.numa
    assert numa is not None  # an aligned choice names its NUMA node
    inside = tuple(d.id for d in free_devices if numa in d.numa_nodes)
    outside = tuple(d.id for d in free_devices if d.numa_nodes and numa not in d.numa_nodes)
    return Placement(numa, cpu_numa, inside, outside, without, True)


def replicas_per_numa(devices: Iterable[FreeDevice]) -> dict[int, int]:
    """Replicas per NUMA node (a replica reporting two NUMA nodes counts on both)."""
    counts: dict[int, int] = {}
    for device in devices:
        for numa in device.numa_nodes:
            counts[numa] = counts.get(numa, 0) + 1
    return counts


@dataclass(frozen=True, slots=True)
class PreferenceAsk:
    """One GetPreferredAllocation container request, as kubelet sends it: unordered IDs."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class DeviceAllocation:
    """kubelet's ``devicesToAllocate`` for one container, around its one preference call.

    Build it, send :attr:`ask` to the plugin when it is not None (and the plugin offers
    GetPreferredAllocation), then :meth:`finish` with the answer (None: no call, or no
    answer for the container). Raises kubelet's errors (`UnexpectedAdmissionError`)."""

    def __init__(
        self,
        resource: str,
        required: int,
        reusable: Iterable[str],
        placement: Placement,
        rng: random.Random,
    ) -> None:
        self.resource = resource
        self.required = required
        self.placement = placement
        self._rng = rng
        self.allocated: list[str] = []
        self.reused: tuple[str, ...] = ()
        """The replicas taken from the pod's init containers."""
        self.ask: PreferenceAsk | None = None
        self._inside_first = False
        if self._take(reusable):
            self.reused = tuple(self.allocated)
            return
        self.reused = tuple(self.allocated)
        needed = required - len(self.allocated)
        free = [d for d in placement.free if d not in self.allocated]
        if len(free) < needed:
            raise UnexpectedAdmissionError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(free)}"
            )
        inside = [d for d in placement.in_affinity if d not in self.allocated]
        if needed < len(inside):
            self._inside_first = True
            self.ask = self._ask([*inside, *self.allocated])
            return
        if self._take(inside):
            return  # the affinity's replicas cover the request exactly: nothing to ask
        self.ask = self._ask([*free, *self.allocated])

    @property
    def done(self) -> bool:
        return len(self.allocated) == self.required

    def finish(self, preferred: Sequence[str] | None) -> tuple[tuple[str, ...], bool]:
        """The replicas to allocate, and whether the plugin's answer chose every one kubelet
        took after asking."""
        if self.done:
            return tuple(self.allocated), False
        before = len(self.allocated)
        wanted = set(preferred or ())
        placement = self.placement
        if self._inside_first:
            self._take(wanted & set(placement.in_affinity))
            honoured = self.done and preferred is not None
            self._take(placement.in_affinity)
        else:
            self._take(wanted & set(placement.free))
            honoured = self.done and preferred is not None
            self._take(placement.outside) or self._take(placement.no_topology)
        if not self.done:
            raise UnexpectedAdmissionError(
                "unexpectedly allocated less resources than required. "
                f"Requested: {self.required}, Got: {len(self.allocated)}"
            )
        return tuple(self.allocated), honoured and len(self.allocated) > before

    def _ask(self, available: Sequence[str]) -> PreferenceAsk:
        offered = list(dict.fromkeys(available))
        self._rng.shuffle(offered)  # Go's UnsortedList of a set
        must = list(self.allocated)
        self._rng.shuffle(must)
        return PreferenceAsk(tuple(offered), tuple(must), self.required)

    def _take(self, devices: Iterable[str]) -> bool:
        """kubelet's `allocateRemainingFrom`: replicas not taken yet, in Go's (random) set
        order, until the request is met; True once it is."""
        if self.done:
            return True
        pool = sorted(set(devices) - set(self.allocated))
        self._rng.shuffle(pool)
        for device in pool:
            self.allocated.append(device)
            if self.done:
                return True
        return self.done
