"""Requests reach only the replica that owns their node's partition (svc_accounting/routes.py),
on a real nats-server with JetStream: deliveries are counted per replica, and a handover
leaves no moment where two replicas are subscribed to one partition's subjects."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from shared import subjects
from shared.core.partitions import partition_of, partition_of_slot, targets
from shared.messages import PendingReply, PendingRequest, SnapshotReply, SnapshotRequest
from svc_accounting import service as accounting_service
from svc_accounting.routes import EVERY_SLOT, Routes
from svc_accounting.service import AccountingService
from tests.builders import gpu, node
from tests.integration.harness import Harness, harness, wait_for
from tests.ownership import Timeline

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    import pytest
    from nats.aio.msg import Msg

NODES = [f"node-{i:02d}" for i in range(24)]
PARTITIONS = 8


def cluster() -> list[tuple[str, dict[str, Any]]]:
    return [("node", node(name, [gpu(f"GPU-{name}", 0)])) for name in NODES]


@dataclasses.dataclass(frozen=True)
class Delivery:
    replica: str
    subject: str
    reply: str
    partition: int
    held: bool
    """The replica held the partition's key when the request reached it."""


class Deliveries:
    """Every request a replica's subscriptions hand it, seen before it is served."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[Delivery] = []
        real = AccountingService._deliver

        async def deliver(service: AccountingService, msg: Msg) -> None:
            addressed = subjects.parse_accounting(msg.subject)
            assert addressed is not None
            table = service.leases
            k = 0 if table is None else partition_of_slot(addressed.slot, table.partitions)
            held = table is None or k in table.held  # one replica holds everything
            self.seen.append(Delivery(service.replica, msg.subject, msg.reply, k, held))
            await real(service, msg)

        monkeypatch.setattr(AccountingService, "_deliver", deliver)

    def per_replica(self) -> Counter[str]:
        return Counter(d.replica for d in self.seen)

    def twice(self) -> list[str]:
        """Reply subjects delivered more than once (to one replica or two)."""
        return [r for r, n in Counter(d.reply for d in self.seen).items() if n > 1]


class Subscribed:
    """When each replica's subscriptions to a partition's slots began and ended: from the
    start of its subscribe to the end of its drain (the widest the window can be)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.timeline = Timeline()
        self.names: dict[int, str] = {}
        real_open, real_close = Routes.open, Routes.close

        async def opened(routes: Routes, partitions: Iterable[int]) -> None:
            wanted = set(partitions)
            for k in wanted:
                self.timeline.start(self.names.get(id(routes), "?"), k, time.monotonic())
            await real_open(routes, wanted)

        async def closed(routes: Routes, partitions: Iterable[int]) -> None:
            wanted = set(partitions)
            await real_close(routes, wanted)
            for k in wanted:
                self.timeline.end(self.names.get(id(routes), "?"), k, time.monotonic())

        monkeypatch.setattr(Routes, "open", opened)
        monkeypatch.setattr(Routes, "close", closed)

    def name(self, replica: AccountingService) -> None:
        self.names[id(replica.routes)] = replica.replica


async def start_replica(
    h: Harness, name: str, subscribed: Subscribed | None = None
) -> AccountingService:
    options = dataclasses.replace(h.accounting_options, replica_id=name, partitions=PARTITIONS)
    spec = accounting_service.spec(options)
    if subscribed is not None:
        build = spec.build

        def named(*args: Any) -> AccountingService:
            replica = build(*args)
            subscribed.name(replica)  # before it starts: its first subscribe is recorded
            return replica

        spec = dataclasses.replace(spec, build=named)
    replica: AccountingService = await h.wiring.start(spec, client_name=name)
    return replica


def served(replicas: list[AccountingService]) -> dict[int, list[str]]:
    owners: dict[int, list[str]] = {}
    for replica in replicas:
        for k in replica.ownership.served():
            owners.setdefault(k, []).append(replica.replica)
    return owners


async def test_no_replica_receives_a_request_for_a_partition_it_does_not_own(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deliveries = Deliveries(monkeypatch)
    async with harness(nats_url, tmp_path, cluster(), with_refit=False) as h:
        if h.accounting is not None:
            await h.accounting.stop(1.0)
        replicas = [await start_replica(h, f"replica-{name}") for name in "abc"]
        names = [r.replica for r in replicas]
        # Settled: each replica serves what rendezvous hashing gives it among all three.
        await wait_for(
            lambda: all(
                set(r.ownership.served()) == targets(r.replica, PARTITIONS, names) for r in replicas
            ),
            15,
        )
        before = served(replicas)
        owner = {name: before[partition_of(name, PARTITIONS)][0] for name in NODES}
        deliveries.seen.clear()
        for name in NODES:
            snapshot = await h.client.ask(SnapshotRequest(node=name), SnapshotReply, 2.0)
            assert snapshot.ok and snapshot.nodes, (name, snapshot)
            pending = await h.client.ask(PendingRequest(node=name), PendingReply, 2.0)
            assert pending.ok, (name, pending)
        assert served(replicas) == before  # nothing moved meanwhile

        # Each request reached one replica: the owner of its node's partition.
        assert len(deliveries.seen) == 2 * len(NODES)
        assert deliveries.twice() == []
        for delivery in deliveries.seen:
            addressed = subjects.parse_accounting(delivery.subject)
            assert addressed is not None
            assert delivery.replica == owner[addressed.node], delivery
            assert delivery.held, delivery
        expected = Counter(owner[name] for name in NODES for _ in range(2))
        assert deliveries.per_replica() == expected
        assert len(expected) == 3  # every replica served some of it

        # A snapshot of every node: one request to each answerer, each answering its own.
        deliveries.seen.clear()
        _, nodes = await h.client.every_node(budget=3.0)
        assert sorted(n.node for n in nodes) == NODES
        assert sorted(deliveries.per_replica()) == sorted(r.replica for r in replicas)
        assert all(count == 1 for count in deliveries.per_replica().values())


async def test_a_handover_never_has_two_replicas_subscribed_to_one_partition(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under continuous requests, b joins (half the partitions move to it), then a stops
    (the rest move): each partition's subscription windows never overlap across replicas,
    no request reaches two replicas or one that lacks its key, and every request is
    answered (the caller's retry rides over the moment nobody is subscribed)."""
    deliveries = Deliveries(monkeypatch)
    subscribed = Subscribed(monkeypatch)
    async with harness(nats_url, tmp_path, cluster(), with_refit=False) as h:
        if h.accounting is not None:
            await h.accounting.stop(1.0)
        a = await start_replica(h, "replica-a", subscribed)
        assert len(a.ownership.served()) == PARTITIONS
        failures: list[str] = []
        asked = 0
        stop = asyncio.Event()

        async def load() -> None:
            nonlocal asked
            while not stop.is_set():
                for name in NODES:
                    asked += 1
                    reply = await h.client.ask(SnapshotRequest(node=name), SnapshotReply, 2.0)
                    if not reply.ok:
                        failures.append(f"{name}: {reply.code} {reply.error}")

        traffic = asyncio.create_task(load())
        try:
            b = await start_replica(h, "replica-b", subscribed)
            await wait_for(lambda: len(served([a, b])) == PARTITIONS and b.ownership.served(), 10)
            moved_at_join = len(b.ownership.served())
            await h.wiring.stop(a, 2.0)
            await wait_for(lambda: len(b.ownership.served()) == PARTITIONS, 5)
            seen = asked
            await wait_for(lambda: asked > seen + len(NODES), 5)  # a round on b alone
        finally:
            stop.set()
            await traffic
        assert 0 < moved_at_join < PARTITIONS
        assert failures == []
        assert subscribed.timeline.overlaps() == []
        assert subscribed.timeline.changes() >= PARTITIONS + 2 * moved_at_join
        assert deliveries.twice() == []
        assert [d for d in deliveries.seen if not d.held] == []
        assert len(deliveries.seen) == asked
        assert set(deliveries.per_replica()) == {"replica-a", "replica-b"}


async def test_one_replica_subscribes_to_every_slot_and_answers_every_node(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--partitions 0`: no JetStream, one subscription to every slot (in the queue group),
    every node answered, a snapshot of every node in one request."""
    deliveries = Deliveries(monkeypatch)
    async with harness(nats_url, tmp_path, cluster(), with_refit=False) as h:
        if h.accounting is not None:
            await h.accounting.stop(1.0)
        options = dataclasses.replace(h.accounting_options, replica_id="alone", partitions=0)
        alone: AccountingService = await h.wiring.start(
            accounting_service.spec(options), client_name="alone"
        )
        assert alone.leases is None
        assert alone.routes.slots() == {EVERY_SLOT}  # one subscription, not one per slot
        for name in NODES:
            reply = await h.client.ask(SnapshotRequest(node=name), SnapshotReply, 2.0)
            assert reply.ok and reply.nodes, (name, reply)
        deliveries.seen.clear()
        _, nodes = await h.client.every_node(budget=3.0)
        assert sorted(n.node for n in nodes) == NODES
        assert len(deliveries.seen) == 1
