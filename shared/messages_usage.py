"""Usage updates (accounting -> every reader), published on `numafit.usage.v1.<node>` after
every change of a node, and the converters between a node's usage table and the core's
snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from shared.core.lock import Lock
from shared.core.model import DeviceUsage, NodeSnapshot
from shared.messages_base import Message, NonNegative, Shape

if TYPE_CHECKING:
    from collections.abc import Mapping


class UsageEntry(Shape, frozen=True, kw_only=True):
    """One GPU's usage as accounting counts it: slots, memory (MiB), cores (percent)."""

    used: NonNegative
    usedmem: NonNegative
    usedcores: NonNegative


class LockWire(Shape, frozen=True, kw_only=True):
    """A node's lock (HAMi's: one pod allocating at a time): the holder and its bind time."""

    pod: str
    """`namespace/name`."""
    uid: str
    since: NonNegative
    """Unix seconds of the bind (bind-time annotation); readers judge the expiry."""

    @classmethod
    def from_core(cls, lock: Lock) -> LockWire:
        return cls(pod=lock.pod_key, uid=lock.uid, since=lock.since)

    def to_core(self) -> Lock:
        return Lock(self.pod, self.uid, self.since)


class UsageUpdate(Message, frozen=True, kw_only=True):
    """Published on `numafit.usage.v1.<node>` after every change of the node: its revision and
    full per-device usage table. A deleted node is published once more with `deleted: true` and
    no devices. `allocating` names the pod holding the node's lock (omitted when none does)."""

    WHAT: ClassVar[str] = "usage update"

    epoch: str
    node: str
    revision: NonNegative
    devices: dict[str, UsageEntry]
    deleted: bool = False
    allocating: LockWire | None = None


def usage_entries(snapshot: NodeSnapshot | None) -> dict[str, UsageEntry]:
    """A node's usage table (empty for a node without inventory), as `usage_table()` has it."""
    if snapshot is None:
        return {}
    return {
        d.info.id: UsageEntry(used=d.used, usedmem=d.usedmem, usedcores=d.usedcores)
        for d in snapshot.devices
    }


def apply_usage(snapshot: NodeSnapshot, devices: Mapping[str, UsageEntry]) -> NodeSnapshot | None:
    """`snapshot`'s devices with the usage of a published table, or None when the table is for
    another device set (readers then take a snapshot instead)."""
    if set(devices) != {d.info.id for d in snapshot.devices}:
        return None
    updated = [
        DeviceUsage(d.info, u.used, u.usedmem, u.usedcores)
        for d in snapshot.devices
        for u in (devices[d.info.id],)
    ]
    return NodeSnapshot(snapshot.name, updated, snapshot.cordoned)
