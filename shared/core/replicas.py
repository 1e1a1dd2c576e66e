"""Kubelet replica IDs <-> physical GPUs, and HAMi's selection algorithm (reference (h)).

The device plugin advertises each GPU as `count` replicas `<uuid>-<n>`. Given kubelet's
available and must-include replica IDs, the GPUs the ledger reserved for the container and the
allocation size, the selection claims one replica per reserved GPU; a reserved GPU without an
available replica is the *mismatch* that may trigger a refit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.codec import physical_id
from shared.core.errors import CoreError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


class SelectionError(CoreError):
    """The reservation cannot be turned into `allocation_size` replica IDs (not a mismatch)."""


class ReplicaMismatch(SelectionError):
    """A reserved GPU has no replica among the IDs kubelet can hand out (the refit trigger)."""

    def __init__(self, uuid: str) -> None:
        super().__init__(f"no available slice device found for annotated GPU {uuid}")
        self.uuid = uuid


def replica_ids(uuid: str, count: int) -> list[str]:
    return [f"{uuid}-{n}" for n in range(count)]


def select_replicas(
    available: Sequence[str],
    required: Sequence[str],
    desired: Sequence[str],
    size: int,
    known: frozenset[str] | None = None,
) -> list[str]:
    """Replica IDs for the `desired` physical GPUs, honouring kubelet's must-include IDs."""
    if len(desired) < size:
        raise SelectionError(
            f"annotated devices {len(desired)} smaller than requested allocation size {size}"
        )
    selection = list(required)
    unclaimed: dict[str, list[str]] = {}
    for replica in required:
        unclaimed.setdefault(physical_id(replica, known), []).append(replica)
    claimed = set(required)
    buckets: dict[str, list[str]] = {}
    for replica in available:
        if replica not in claimed:
            buckets.setdefault(physical_id(replica, known), []).append(replica)
    for uuid in desired[:size]:
        if unclaimed.get(uuid):
            unclaimed[uuid].pop(0)  # a must-include replica of this GPU serves it
            continue
        pool = buckets.get(uuid)
        if not pool:
            raise ReplicaMismatch(uuid)
        replica = pool.pop(0)
        selection.append(replica)
        claimed.add(replica)
    if len(selection) != size:
        raise SelectionError(f"selection has {len(selection)} devices, need {size}")
    return selection


def physical_ids(replicas: Iterable[str], known: frozenset[str] | None = None) -> list[str]:
    """Physical UUIDs of kubelet's replica IDs, in order (duplicates kept)."""
    return [physical_id(r, known) for r in replicas]


def distinct_selection(
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    known: frozenset[str] | None = None,
) -> list[str]:
    """`size` replica IDs naming distinct GPUs, kubelet's must-include IDs first, then one
    replica of each further GPU in GPU UUID order (a container given two replicas of one GPU
    would run on one GPU while asking for two, and accounting refuses such an allocation).
    `SelectionError` when the offered IDs do not name enough distinct GPUs."""
    selection = list(dict.fromkeys(required))
    gpus = {physical_id(r, known) for r in selection}
    if len(gpus) < len(selection):
        raise SelectionError(f"kubelet's must-include replicas name a GPU twice: {selection}")
    by_gpu: dict[str, str] = {}
    for replica in sorted(available):
        uuid = physical_id(replica, known)
        if uuid not in gpus:
            by_gpu.setdefault(uuid, replica)
    for uuid in sorted(by_gpu):
        if len(selection) >= size:
            break
        selection.append(by_gpu[uuid])
    if len(selection) != size:
        offered = len(gpus | set(by_gpu))
        raise SelectionError(
            f"kubelet offered replicas of {offered} GPU(s) for a container asking for {size} "
            "distinct GPUs"
        )
    return selection
