"""What a replica does with a request its subscriptions delivered (svc_accounting/ownership.py):
serve it, refuse it quickly while only this replica can hold the key, or leave it to whoever
may own the partition now. No NATS: the lease table is set by hand, the clock is a variable."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest

from shared.core.partitions import SLOTS, slots_of
from svc_accounting.leases import Lease, Leases
from svc_accounting.ownership import Admission, Ownership

if TYPE_CHECKING:
    from nats.aio.client import Client

PARTITIONS = 4
TTL = 9.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def nothing(_: object) -> None:
    return None


def leases(clock: Clock) -> Leases:
    return Leases(
        cast("Client", object()),  # never used: no round runs here
        replica="replica-a",
        partitions=PARTITIONS,
        ttl=TTL,
        on_acquired=nothing,
        on_released=nothing,
        clock=clock,
    )


def hold(table: Leases, k: int, renewed_at: float) -> None:
    table.held[k] = Lease(k, revision=1, epoch=f"replica-a.{k}.1", renewed_at=renewed_at, since=0)


def test_one_replica_serves_every_slot() -> None:
    ownership = Ownership(None)
    assert all(ownership.admit(slot) is Admission.SERVE for slot in (0, 7, SLOTS - 1))


def test_a_served_partition_is_served_on_every_one_of_its_slots() -> None:
    clock = Clock()
    table = leases(clock)
    hold(table, 1, clock.now)
    table.serving.add(1)
    ownership = Ownership(table)
    assert {ownership.admit(slot) for slot in slots_of(1, PARTITIONS)} == {Admission.SERVE}
    assert {ownership.admit(slot) for slot in slots_of(2, PARTITIONS)} == {Admission.DROP}


def test_a_held_partition_not_served_is_refused_while_the_lease_is_fresh() -> None:
    """A handover under way (or a request that waited through one): nobody else can hold the
    key, so nobody else has the request, and the caller hears at once."""
    clock = Clock()
    table = leases(clock)
    hold(table, 3, clock.now)
    ownership = Ownership(table)
    assert ownership.admit(3) is Admission.REFUSE
    table.releasing.add(3)
    assert ownership.admit(3 + PARTITIONS) is Admission.REFUSE


@pytest.mark.parametrize("served", [True, False])
def test_a_lease_past_its_renew_deadline_drops_what_arrives(served: bool) -> None:
    """This process was frozen past its lease: another replica may own the partition, be
    subscribed and answer, so this one says nothing (and serves nothing)."""
    clock = Clock()
    table = leases(clock)
    hold(table, 2, clock.now)
    if served:
        table.serving.add(2)
    clock.now += TTL * 2 / 3  # the renew deadline
    assert Ownership(table).admit(2) is Admission.DROP
    assert Ownership(table).served() == ()
