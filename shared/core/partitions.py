"""Accounting's partitions: which partition a node belongs to, and which replica should own it.

Every node has a *slot*, one of `SLOTS`, from a hash of its name (FNV-1a, 32 bit: stable across
processes and Python versions, unlike `hash`). The slot travels in the node's accounting
subjects, so any caller computes it from the node name alone, whatever partition count the
accounting replicas run with. A partition is a residue class of slots (partition k holds the
slots s with s % partitions == k), so a replica subscribes to exactly its partitions' slots.

Replicas share the partitions by rendezvous (highest random weight) hashing: each partition
goes to the live replica with the highest weight for it, so a replica joining or leaving moves
only the partitions it wins or held, about 1/N of them, and every replica computes the same
assignment from the same member list without talking to the others.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

_FNV32_OFFSET = 0x811C9DC5
_FNV32_PRIME = 0x01000193
_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3


def fnv1a_32(data: bytes) -> int:
    value = _FNV32_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return value


def fnv1a_64(data: bytes) -> int:
    value = _FNV64_OFFSET
    for byte in data:
        value = ((value ^ byte) * _FNV64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


SLOTS = 256
"""Slots of the subject space: the most partitions accounting can run with. A power of two, so
that any partition count dividing it (16, the default) puts each node in the partition
`fnv1a_32(node) % partitions`, as before slots existed (a rolling upgrade agrees on owners)."""


def slot_of(node: str) -> int:
    """The slot of `node` (its accounting subjects carry it)."""
    return fnv1a_32(node.encode()) % SLOTS


def check_partitions(partitions: int) -> None:
    if partitions < 1:
        raise ValueError("there is at least one partition")
    if partitions > SLOTS:
        raise ValueError(f"at most {SLOTS} partitions (the slots of the subjects)")


def partition_of_slot(slot: int, partitions: int) -> int:
    """The partition holding `slot` among `partitions` (1 to SLOTS)."""
    check_partitions(partitions)
    return slot % partitions


def partition_of(node: str, partitions: int) -> int:
    """The partition of `node` among `partitions` (1 to SLOTS)."""
    return partition_of_slot(slot_of(node), partitions)


def slots_of(partition: int, partitions: int) -> range:
    """The slots of `partition` among `partitions`: what its owner subscribes to."""
    check_partitions(partitions)
    if not 0 <= partition < partitions:
        raise ValueError(f"no partition {partition} among {partitions}")
    return range(partition, SLOTS, partitions)


def _weight(member: str, partition: int) -> int:
    # A 64-bit mix of member and partition; the avalanche step keeps weights of similar
    # member names (accounting-0, accounting-1) unrelated.
    value = fnv1a_64(f"{member}\x00{partition}".encode())
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & 0xFFFFFFFFFFFFFFFF
    value ^= value >> 33
    return value


def owner_of(partition: int, members: Iterable[str]) -> str | None:
    """The member that should own `partition` (None without members); ties by name."""
    best: tuple[int, str] | None = None
    for member in members:
        candidate = (_weight(member, partition), member)
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[1]


def assignment(partitions: int, members: Iterable[str]) -> dict[int, str]:
    """Every partition's owner by rendezvous hashing (empty without members)."""
    live = sorted(set(members))
    if not live:
        return {}
    return {k: owner for k in range(partitions) if (owner := owner_of(k, live)) is not None}


def targets(member: str, partitions: int, members: Iterable[str]) -> frozenset[int]:
    """The partitions `member` should own among `members` (itself included)."""
    live = {*members, member}
    return frozenset(k for k, owner in assignment(partitions, live).items() if owner == member)
