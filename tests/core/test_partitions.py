"""Partitions of nodes and their owners: stable, spread, and moved minimally on membership
changes."""

from __future__ import annotations

from collections import Counter

import pytest

from shared.core.partitions import assignment, fnv1a_32, owner_of, partition_of, targets


def test_fnv1a_32_matches_the_published_test_vectors() -> None:
    # From the FNV reference (Fowler/Noll/Vo): "" and "a" and "foobar".
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


def test_a_node_always_lands_in_the_same_partition_and_nodes_spread() -> None:
    assert partition_of("node-1", 16) == partition_of("node-1", 16)
    counts = Counter(partition_of(f"node-{i}", 16) for i in range(1600))
    assert set(counts) == set(range(16))
    assert max(counts.values()) < 2 * min(counts.values())


def test_there_is_at_least_one_partition() -> None:
    with pytest.raises(ValueError, match="at least one"):
        partition_of("node-1", 0)


def test_every_partition_has_one_owner_and_the_share_is_fair() -> None:
    owners = assignment(64, ["accounting-0", "accounting-1", "accounting-2"])
    assert sorted(owners) == list(range(64))
    shares = Counter(owners.values())
    assert set(shares) == {"accounting-0", "accounting-1", "accounting-2"}
    assert min(shares.values()) >= 10  # 64/3 ~ 21 each; rendezvous hashing is not exact
    assert assignment(8, []) == {}
    assert owner_of(3, []) is None


def test_a_joining_replica_takes_only_partitions_it_wins() -> None:
    before = assignment(64, ["a", "b"])
    after = assignment(64, ["a", "b", "c"])
    moved = {k for k in before if before[k] != after[k]}
    assert moved and all(after[k] == "c" for k in moved)  # nothing moves between a and b
    assert targets("c", 64, ["a", "b"]) == frozenset(moved)


def test_a_leaving_replica_gives_only_its_own_partitions_away() -> None:
    before = assignment(64, ["a", "b", "c"])
    after = assignment(64, ["a", "b"])
    assert {k for k in before if before[k] != after[k]} == {
        k for k, owner in before.items() if owner == "c"
    }


def test_a_partition_is_the_slots_of_one_residue_and_keeps_the_old_assignment() -> None:
    from shared.core.partitions import SLOTS, partition_of_slot, slot_of, slots_of

    assert SLOTS == 256
    for partitions in (1, 3, 16, 256):
        owned = [set(slots_of(k, partitions)) for k in range(partitions)]
        assert set().union(*owned) == set(range(SLOTS))
        assert sum(len(s) for s in owned) == SLOTS  # disjoint
        assert all(partition_of_slot(s, partitions) == k for k, o in enumerate(owned) for s in o)
    # A count dividing 256 puts every node where FNV-1a mod the count did before slots.
    for i in range(200):
        name = f"node-{i}"
        assert partition_of(name, 16) == fnv1a_32(name.encode()) % 16
        assert slot_of(name) == fnv1a_32(name.encode()) % 256


def test_there_are_at_most_as_many_partitions_as_slots() -> None:
    with pytest.raises(ValueError, match="at most 256"):
        partition_of("node-1", 257)
