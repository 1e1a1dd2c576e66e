"""Phase-aware accounting: collapse, steady state, effective usage, and the node ledger view.

A pod's containers do not all run at once: regular init containers run one after another
before the apps; sidecars (init containers with restartPolicy Always) run beside everything
declared after them. Counting every row additively would over-reserve (HAMi #2856), so each
pod is stored as its phase peak per GPU (collapse, e.2) until every regular init container has
exited 0, then as its steady state (sidecars + apps, e.3).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core import codec
from shared.core.errors import AnnotationError
from shared.core.keys import ALLOCATED, TO_ALLOCATE
from shared.core.model import (
    ContainerEntry,
    ContainerKind,
    DeviceInfo,
    NodeSnapshot,
    Usage,
    snapshot_of,
)

if TYPE_CHECKING:
    from shared.core.pods import PodInfo

Rows = Sequence[ContainerEntry] | Mapping[int, ContainerEntry]
"""Container rows by position: a positional list, or a sparse mapping position -> entry."""


def _positional(rows: Rows) -> Iterator[tuple[int, ContainerEntry]]:
    if isinstance(rows, Mapping):
        return iter(sorted(rows.items()))
    return iter(enumerate(rows))


def kind_at(kinds: Sequence[ContainerKind], position: int) -> ContainerKind:
    """Positions past the spec (the decoder's trailing entry) count as apps: conservative."""
    return kinds[position] if position < len(kinds) else ContainerKind.APP


_ZERO = Usage()
_ONE_SLOT = 1


def collapse(kinds: Sequence[ContainerKind], rows: Rows) -> dict[str, Usage]:
    """Reference e.2: per GPU, max(regular init + earlier sidecars, sidecars + apps)."""
    sidecars: dict[str, Usage] = {}
    peak: dict[str, Usage] = {}
    apps: dict[str, Usage] = {}
    for position, entry in _positional(rows):
        kind = kind_at(kinds, position)
        for device in entry:
            row = Usage(device.usedmem, device.usedcores, _ONE_SLOT)
            uuid = device.uuid
            if kind is ContainerKind.SIDECAR:
                sidecars[uuid] = sidecars.get(uuid, _ZERO) + row
                peak[uuid] = peak.get(uuid, _ZERO).max(sidecars[uuid])
            elif kind is ContainerKind.INIT:
                peak[uuid] = peak.get(uuid, _ZERO).max(sidecars.get(uuid, _ZERO) + row)
            else:
                apps[uuid] = apps.get(uuid, _ZERO) + row
    result: dict[str, Usage] = {}
    for uuid in sorted(peak.keys() | apps.keys() | sidecars.keys()):
        running = sidecars.get(uuid, _ZERO) + apps.get(uuid, _ZERO)
        top = peak.get(uuid, _ZERO).max(running)
        result[uuid] = Usage(top.mem, top.cores, max(top.slots, 1))
    return result


def steady_state(kinds: Sequence[ContainerKind], rows: Rows) -> dict[str, Usage]:
    """Reference e.3: sidecar and app rows summed; regular init rows ignored."""
    result: dict[str, Usage] = {}
    for position, entry in _positional(rows):
        if kind_at(kinds, position) is ContainerKind.INIT:
            continue
        for device in entry:
            row = Usage(device.usedmem, device.usedcores, _ONE_SLOT)
            result[device.uuid] = result.get(device.uuid, _ZERO) + row
    return dict(sorted(result.items()))


def effective(kinds: Sequence[ContainerKind], rows: Rows, released: bool) -> dict[str, Usage]:
    """The stored value of a pod: steady state once its init phase is released, else collapse."""
    return steady_state(kinds, rows) if released else collapse(kinds, rows)


def total(usage: Mapping[str, Usage]) -> Usage:
    """Sum over GPUs (what a namespace quota counts: memory and cores, slots ignored)."""
    result = _ZERO
    for value in usage.values():
        result = result + value
    return result


@dataclass(frozen=True, slots=True)
class TrackedPod:
    """A pod the ledger holds: its raw annotations, decoded rows and stored usage.

    `decode_error` is set (and `usage` empty) when an annotation does not decode; the pod stays
    tracked so that a refit can refuse it with the right reason.
    """

    pod: PodInfo
    node: str
    to_allocate: str | None
    allocated: str | None
    pending_rows: tuple[ContainerEntry, ...] | None
    rows: tuple[ContainerEntry, ...] | None
    released: bool
    usage: Mapping[str, Usage]
    decode_error: str | None = None

    @property
    def uid(self) -> str:
        return self.pod.uid


def track_pod(pod: PodInfo, released: bool | None = None) -> TrackedPod | None:
    """The ledger entry of a pod, or None when the scheduler never placed it (or it ended).

    `released` defaults to what the pod's init-container statuses say (e.4).
    """
    node = pod.scheduled_node
    allocated = pod.annotations.get(ALLOCATED)
    if not node or allocated is None or pod.terminal:
        return None
    to_allocate = pod.annotations.get(TO_ALLOCATE)
    flag = pod.init_released() if released is None else released
    try:
        rows = tuple(codec.decode_pod(allocated))
    except AnnotationError as exc:
        return TrackedPod(
            pod,
            node,
            to_allocate,
            allocated,
            None,
            None,
            flag,
            {},
            f"cannot decode allocated annotation: {exc}",
        )
    try:
        pending = tuple(codec.decode_pod(to_allocate)) if to_allocate is not None else None
    except AnnotationError as exc:
        return TrackedPod(
            pod,
            node,
            to_allocate,
            allocated,
            None,
            rows,
            flag,
            {},
            f"cannot decode pending allocation annotation: {exc}",
        )
    usage = effective(pod.kinds, rows, flag)
    return TrackedPod(pod, node, to_allocate, allocated, pending, rows, flag, usage)


def node_snapshot(
    name: str,
    devices: Iterable[DeviceInfo],
    cordoned: Iterable[str],
    pods: Iterable[TrackedPod],
) -> NodeSnapshot:
    """Registered devices of a node plus every tracked pod's stored usage on it (d.2)."""
    snapshot = snapshot_of(name, devices, cordoned)
    for tracked in pods:
        if tracked.node == name:
            snapshot.add_pod_usage(tracked.usage)
    return snapshot
