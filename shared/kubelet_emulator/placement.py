"""kubelet's Topology Manager decision for one container, as a pure function.

Which NUMA node wins is the core's rule (``shared.core.numa_prediction.kubelet_choice``), the
same one the scheduler predicts with; this module adds what kubelet then offers the plugin.

Given the free exclusive CPUs per NUMA node and the free healthy device
replicas, :func:`place` answers which NUMA node the container is pinned to and
which replica IDs kubelet may hand out (the ``available_deviceIDs`` of
GetPreferredAllocation), or refuses like kubelet. :func:`choose_devices` then
applies the plugin's advice. Keeping this apart from gRPC makes the policy
rules testable on their own and keeps the emulator a thin driver.

Simplifications against the real kubelet, on purpose:

- a container is always placed on one NUMA node: ``restricted`` behaves like
  ``single-numa-node`` (multi-node preferred hints are not modelled), and
  exclusive CPUs are never spread over NUMA nodes;
- ``best-effort`` without a fitting NUMA node still admits: it pins to the NUMA
  node (among those with enough CPUs) with the most free replicas, lowest id on
  a tie, and offers that node's replicas first, then every other free replica;
- a resource none of whose devices report topology imposes no NUMA constraint
  (kubelet's nil hint), and devices without topology only serve such cases,
  policy ``none`` and the best-effort fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.numa_prediction import TopologyPolicy, Verdict, kubelet_choice
from shared.kubelet_emulator.errors import TopologyAffinityError, UnexpectedAdmissionError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["FreeDevice", "Placement", "choose_devices", "place"]


@dataclass(frozen=True, slots=True)
class FreeDevice:
    """A healthy, unallocated replica and the NUMA nodes it reports."""

    id: str
    numa_nodes: frozenset[int]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a container goes: its NUMA node and the replicas kubelet may give it."""

    numa: int | None
    """NUMA node of the container's CPUs (None only when no NUMA node is known at all)."""
    available: tuple[str, ...]
    """Replica IDs kubelet offers, most preferred first."""
    aligned: bool
    """False for a best-effort admission that had no NUMA node fitting CPUs and devices."""


@dataclass(frozen=True, slots=True)
class _Request:
    resource: str
    gpu_count: int
    cpu_count: int


def place(
    policy: TopologyPolicy,
    *,
    free_cpus: Mapping[int, int],
    free_devices: Sequence[FreeDevice],
    topology_aware: bool,
    resource: str,
    gpu_count: int,
    cpu_count: int,
) -> Placement:
    """Decide like kubelet's Topology Manager; raise its admission errors.

    The NUMA node comes from the rule the scheduler predicts with
    (shared/core/numa_prediction.py); this adds which replicas kubelet offers."""
    if gpu_count < 0 or cpu_count < 0:
        raise ValueError("gpu_count and cpu_count must be >= 0")
    request = _Request(resource, gpu_count, cpu_count)
    choice = kubelet_choice(
        policy,
        free_cpus=free_cpus,
        free_replicas=replicas_per_numa(free_devices),
        topology_aware=topology_aware,
        gpu_count=gpu_count,
        cpu_count=cpu_count,
    )
    every_id = tuple(device.id for device in free_devices)

    def on_node(numa: int) -> tuple[str, ...]:
        return tuple(device.id for device in free_devices if numa in device.numa_nodes)

    if choice.verdict is Verdict.TOPOLOGY_AFFINITY_ERROR:
        raise TopologyAffinityError()
    if choice.verdict is Verdict.NOT_ENOUGH_CPUS:
        raise _not_enough_cpus(request, free_cpus)
    if choice.verdict is Verdict.UNCONSTRAINED:
        return _checked(Placement(choice.numa, every_id, True), request)
    if choice.verdict is Verdict.ALIGNED:
        assert choice.numa is not None  # an aligned choice names its NUMA node
        return Placement(choice.numa, on_node(choice.numa), True)
    # best-effort without a fitting NUMA node: that node's replicas first, then every other.
    if choice.numa is None:
        return _checked(Placement(None, every_id, False), request)
    aligned_ids = on_node(choice.numa)
    others = tuple(i for i in every_id if i not in aligned_ids)
    return _checked(Placement(choice.numa, aligned_ids + others, False), request)


def replicas_per_numa(free_devices: Sequence[FreeDevice]) -> dict[int, int]:
    """Free replicas per NUMA node (a replica reporting two NUMA nodes counts on both)."""
    counts: dict[int, int] = {}
    for device in free_devices:
        for numa in device.numa_nodes:
            counts[numa] = counts.get(numa, 0) + 1
    return counts


def choose_devices(
    available: Sequence[str], preferred: Sequence[str] | None, count: int
) -> tuple[tuple[str, ...], bool]:
    """The replicas to allocate and whether the plugin's advice was taken.

    Advice is taken only when it names exactly ``count`` distinct available
    replicas; otherwise kubelet's own choice, the first ``count`` available, wins.
    """
    if (
        preferred is not None
        and len(preferred) == count
        and len(set(preferred)) == count
        and set(preferred) <= set(available)
    ):
        return tuple(preferred), True
    return tuple(available[:count]), False


def _not_enough_cpus(request: _Request, free_cpus: Mapping[int, int]) -> UnexpectedAdmissionError:
    largest = max(free_cpus.values(), default=0)
    return UnexpectedAdmissionError(
        f"not enough cpus available on a single NUMA node to satisfy request: "
        f"requested={request.cpu_count}, largest free={largest}"
    )


def _checked(placement: Placement, request: _Request) -> Placement:
    if len(placement.available) < request.gpu_count:
        raise UnexpectedAdmissionError(
            f"requested number of devices unavailable for {request.resource}. "
            f"Requested: {request.gpu_count}, Available: {len(placement.available)}"
        )
    return placement
