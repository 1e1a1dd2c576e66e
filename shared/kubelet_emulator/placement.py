"""kubelet's Topology Manager decision for one container, as a pure function.

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

from shared.kubelet_emulator.config import TopologyPolicy
from shared.kubelet_emulator.errors import TopologyAffinityError, UnexpectedAdmissionError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["FreeDevice", "Placement", "choose_devices", "place"]

_ALIGNING = (TopologyPolicy.SINGLE_NUMA_NODE, TopologyPolicy.RESTRICTED)
"""Policies that refuse a container without a single-NUMA placement."""


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
    """Decide like kubelet's Topology Manager; raise its admission errors."""
    if gpu_count < 0 or cpu_count < 0:
        raise ValueError("gpu_count and cpu_count must be >= 0")
    request = _Request(resource, gpu_count, cpu_count)
    numa_nodes = sorted(
        {n for n in free_cpus if n >= 0}
        | {n for device in free_devices for n in device.numa_nodes if n >= 0}
    )
    cpu_nodes = [n for n in numa_nodes if free_cpus.get(n, 0) >= cpu_count]
    every_id = tuple(device.id for device in free_devices)

    if cpu_count > 0 and not cpu_nodes:
        if policy in _ALIGNING:
            raise TopologyAffinityError()
        raise _not_enough_cpus(request, free_cpus)

    if policy is TopologyPolicy.NONE or gpu_count == 0 or not topology_aware:
        return _checked(Placement(_first(cpu_nodes), every_id, True), request)

    def on_node(numa: int) -> tuple[str, ...]:
        return tuple(device.id for device in free_devices if numa in device.numa_nodes)

    candidates = [n for n in cpu_nodes if len(on_node(n)) >= gpu_count]
    if candidates:
        return Placement(candidates[0], on_node(candidates[0]), True)
    if policy in _ALIGNING:
        raise TopologyAffinityError()
    # best-effort: admit anyway, on the CPU-fitting node with the most free replicas.
    if not cpu_nodes:
        return _checked(Placement(None, every_id, False), request)
    numa = max(cpu_nodes, key=lambda n: (len(on_node(n)), -n))
    aligned_ids = on_node(numa)
    others = tuple(i for i in every_id if i not in aligned_ids)
    return _checked(Placement(numa, aligned_ids + others, False), request)


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


def _first(nodes: Sequence[int]) -> int | None:
    return nodes[0] if nodes else None


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
