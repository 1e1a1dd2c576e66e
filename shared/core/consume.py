"""Allocate's bookkeeping: consuming one pending entry with the GPUs kubelet actually gave.

The entry is blanked in the to-allocate annotation (its separator stays). When kubelet handed
out other GPUs than the reservation names (a best-effort fallback, or a pod that did not opt
in to the refit), the allocated annotation is rewritten to what runs, keeping the reserved
amounts per device, so accounting never drifts from reality. Once no entry is left pending,
the bind phase becomes `success`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.model import ContainerDevice, ContainerEntry

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shared.core.accounting import TrackedPod


class ConsumeError(CoreError):
    """The allocation does not match what the ledger holds for the pod."""


@dataclass(frozen=True, slots=True)
class ConsumePlan:
    index: int
    reserved: ContainerEntry
    allocated_entry: ContainerEntry
    annotations: dict[str, str]
    drifted: bool


def plan_consume(
    tracked: TrackedPod,
    devices: Sequence[str],
    index: int | None = None,
    known_devices: frozenset[str] | None = None,
) -> ConsumePlan:
    """Consume entry `index` (default: the first non-empty one, as HAMi's Allocate pops it)."""
    pending = tracked.pending_rows
    if pending is None or tracked.rows is None:
        raise ConsumeError(f"pod {tracked.pod.key} has no pending allocation")
    containers = len(tracked.pod.containers)
    if index is None:
        index = next((i for i, e in enumerate(pending) if e and i < containers), -1)
        if index < 0:
            raise ConsumeError(f"pod {tracked.pod.key} has no pending entry left")
    if not 0 <= index < min(len(pending), containers) or not pending[index]:
        raise ConsumeError(f"container {index} of pod {tracked.pod.key} has no pending entry")
    reserved = pending[index]
    if len(devices) != len(reserved):
        raise ConsumeError(
            f"allocation of {len(devices)} device(s) does not match the pending entry of "
            f"{len(reserved)} for container {index} of pod {tracked.pod.key}"
        )
    if len(set(devices)) != len(devices):
        raise ConsumeError(f"allocation names a GPU twice: {list(devices)}")
    if known_devices is not None:
        unknown = [d for d in devices if d not in known_devices]
        if unknown:
            raise ConsumeError(f"allocation names GPUs the node does not have: {unknown}")
    drifted = {d.uuid for d in reserved} != set(devices)
    if drifted:
        # Keep each reserved amount, in order, on the GPU kubelet actually gave.
        kept = {d.uuid: d for d in reserved}
        spare = iter([d for d in reserved if d.uuid not in devices])
        actual: ContainerEntry = tuple(
            kept[uuid] if uuid in kept else _moved(next(spare), uuid) for uuid in devices
        )
    else:
        actual = reserved
    to_allocate = codec.blank_entry(tracked.to_allocate or "", index)
    annotations = {keys.TO_ALLOCATE: to_allocate}
    if drifted:
        annotations[keys.ALLOCATED] = codec.rewrite_entry(tracked.allocated or "", index, actual)
    remaining = codec.decode_pod(to_allocate)
    if not any(entry for i, entry in enumerate(remaining) if i < containers):
        annotations[keys.BIND_PHASE] = keys.PHASE_SUCCESS
    return ConsumePlan(index, reserved, actual, annotations, drifted)


def consumed_entry(
    tracked: TrackedPod, devices: Sequence[str], index: int | None
) -> ContainerEntry | None:
    """The entry of container `index` when that container is consumed already, on exactly
    `devices` (its pending entry blank, its allocated one on those GPUs): the same consume
    again, resent by a device plugin that never got the first answer. None otherwise."""
    rows, pending = tracked.rows, tracked.pending_rows
    if index is None or rows is None:
        return None
    if not 0 <= index < min(len(rows), len(tracked.pod.containers)):
        return None
    if pending is not None and index < len(pending) and pending[index]:
        return None
    entry = rows[index]
    return entry if entry and sorted(d.uuid for d in entry) == sorted(devices) else None


def _moved(device: ContainerDevice, uuid: str) -> ContainerDevice:
    return ContainerDevice(uuid, device.type, device.usedmem, device.usedcores)
