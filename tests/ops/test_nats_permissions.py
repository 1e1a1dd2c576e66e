"""The sample NATS configuration (deploy/nats/nats-server.conf) on a real 3-server cluster with
JetStream: a GPU node's credentials reach only its own node's subjects, replies stay private,
and the accounting user may keep its partition leases in the KV bucket `numafit-accounting`
(and nobody else may touch it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig, StorageType

from shared import subjects
from shared.core.partitions import SLOTS, slot_of
from shared.service import natsconn
from shared.testing.nats_server import NatsCluster, find_binary
from svc_accounting.leases import Leases
from tests.jetstream import create_bucket, put_within

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from nats.aio.client import Client
    from nats.js.kv import KeyValue

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats-server.conf"
PASSWORDS = {
    f"NUMAFIT_{who}_PASSWORD": f"pw-{who.lower()}"
    for who in ("ACCOUNTING", "REFIT", "SCHEDULER", "NODE_1", "NODE_2")
}
BUCKET = "numafit-accounting"
WATCH_CATCH_UP = 30.0
"""Seconds a KV watch may take to deliver what was written (see its use)."""
INBOX = {
    "accounting": "_INBOX_accounting",
    "refit": "_INBOX_refit",
    "scheduler": "_INBOX_scheduler",
}

NODE_OPS = ("pending", "consume", "bind-phase", "register", "snapshot")
"""The accounting operations svc_deviceplugin calls (allocator.py, judge.py, consume.py,
bind_failed.py and service.py)."""


def password(user: str) -> str:
    return PASSWORDS[f"NUMAFIT_{user.upper().replace('-', '_')}_PASSWORD"]


def url(cluster: NatsCluster, user: str) -> str:
    """Every member's URL, each with the credentials (as the Helm charts splice them in):
    servers a client only discovers from the cluster are tried without them."""
    return ",".join(u.replace("nats://", f"nats://{user}:{password(user)}@") for u in cluster.urls)


def inbox(user: str) -> str:
    return INBOX.get(user, f"_INBOX_{user}")


class Connection:
    """A client as the services connect (every URL, the user's inbox prefix), keeping the
    permission violations the server reports (they arrive asynchronously, at error_cb)."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.violated = asyncio.Event()
        self.nc: Client | None = None

    async def open(self, cluster: NatsCluster, user: str, member: int | None = None) -> Client:
        """Connected to any member, or first to `member` (then to the others)."""

        async def error(exc: Exception) -> None:
            if "permissions violation" in str(exc):
                self.violations.append(str(exc))
                self.violated.set()

        servers = url(cluster, user).split(",")
        if member is not None:
            servers = servers[member:] + servers[:member]
        self.nc = await nats.connect(
            servers=servers,
            dont_randomize=member is not None,
            name=user,
            inbox_prefix=inbox(user),
            error_cb=error,
            reconnect_time_wait=0.2,
            max_reconnect_attempts=-1,
        )
        return self.nc


@contextlib.asynccontextmanager
async def connected(
    cluster: NatsCluster, *users: str, spread: bool = False
) -> AsyncIterator[list[Connection]]:
    """One connection per user; `spread`: the i-th to member i first."""
    connections = [Connection() for _ in users]
    try:
        for i, (connection, user) in enumerate(zip(connections, users, strict=True)):
            await connection.open(cluster, user, i % cluster.size if spread else None)
        yield connections
    finally:
        for connection in connections:
            if connection.nc is not None:
                await connection.nc.close()


def start_cluster() -> NatsCluster:
    cluster = NatsCluster(3, config=CONFIG, env=PASSWORDS)
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    """For the tests that leave JetStream alone."""
    running = start_cluster()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
async def fresh_cluster() -> AsyncIterator[NatsCluster]:
    """Its own cluster, so that each test starts without a lease bucket."""
    running = await asyncio.to_thread(start_cluster)
    try:
        yield running
    finally:
        await asyncio.to_thread(running.close)


def test_the_sample_is_one_server_of_a_three_server_jetstream_cluster() -> None:
    def check(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        environment = {**os.environ, **PASSWORDS, **extra}
        return subprocess.run(
            [find_binary(), "-t", "-c", str(CONFIG)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    assert check({"NATS_SERVER_NAME": "nats-0"}).returncode == 0
    # Each server must be given its own name (JetStream's clustering needs one).
    unnamed = check({})
    assert unnamed.returncode != 0 and "NATS_SERVER_NAME" in unnamed.stdout + unnamed.stderr

    text = CONFIG.read_text()
    cluster = re.search(r"^cluster \{(.*?)^\}", text, re.M | re.S)
    assert cluster is not None
    assert re.search(r"^\s*name: numafit$", cluster.group(1), re.M)
    routes = re.findall(r"nats://(nats-\d)\.nats\.nats\.svc:6222", cluster.group(1))
    assert routes == ["nats-0", "nats-1", "nats-2"]
    jetstream = re.search(r"^jetstream \{(.*?)^\}", text, re.M | re.S)
    assert jetstream is not None
    for key in ("store_dir", "max_memory_store", "max_file_store"):
        assert re.search(rf"^\s*{key}: \S+", jetstream.group(1), re.M), key


async def answer(msg: Any) -> None:
    await msg.respond(b'{"ok": true}')


async def served_request(nc: Any, subject: str, within: float = 5.0) -> Any:
    """A request that must be answered, once the responders' interest has reached the
    requester's server: in a cluster, a subscription made on one server reaches the others
    over the routes a moment later (nothing to await; retried within `within` seconds)."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await natsconn.request(nc, subject, b"{}", 2)
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.02)


async def test_a_node_reaches_only_its_own_subjects(cluster: NatsCluster) -> None:
    clients: list[Client] = []
    try:
        accounting = (
            await natsconn.connect(
                url(cluster, "accounting"), "accounting", inbox_prefix=inbox("accounting")
            )
        ).client
        refit = (
            await natsconn.connect(url(cluster, "refit"), "refit", inbox_prefix="_INBOX_refit")
        ).client
        node1 = (
            await natsconn.connect(url(cluster, "node-1"), "node-1", inbox_prefix="_INBOX_node-1")
        ).client
        clients = [accounting, refit, node1]

        for op in subjects.ACCOUNTING_OPS:
            await accounting.subscribe(subjects.accounting_wildcard(op), queue="q", cb=answer)
        await refit.subscribe(subjects.REFIT_WILDCARD, queue=subjects.REFIT_QUEUE, cb=answer)
        await accounting.flush()
        await refit.flush()

        # Its own node's subjects: answered (responders reply through allow_responses).
        reply = await served_request(node1, subjects.accounting("pending", "node-1"))
        assert reply.data == b'{"ok": true}'
        assert (await served_request(node1, subjects.refit("node-1"))).data

        # Every operation a device plugin uses, for its own node: answered.
        for op in NODE_OPS:
            reply = await served_request(node1, subjects.accounting(op, "node-1"))
            assert reply.data == b'{"ok": true}', op
        # The commits of the scheduler and the refit service, even for its own node: dropped.
        for op in sorted(set(subjects.ACCOUNTING_OPS) - set(NODE_OPS)):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await node1.request(subjects.accounting(op, "node-1"), b"{}", timeout=0.3)
        # ... which the refit service may still send (move), as its credentials allow.
        moved = await served_request(refit, subjects.accounting("move", "node-1"))
        assert moved.data == b'{"ok": true}'

        # Another node's subjects: the server drops the publish, nothing answers.
        for subject in (subjects.accounting("pending", "node-2"), subjects.refit("node-2")):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await node1.request(subject, b"{}", timeout=0.3)
        # Nor may a node listen to the usage stream or other nodes' replies.
        sub = await node1.subscribe(subjects.USAGE_WILDCARD)
        await accounting.publish(subjects.usage("node-2"), b"{}")
        await accounting.flush()
        with pytest.raises(nats.errors.TimeoutError):
            await sub.next_msg(timeout=0.3)
    finally:
        for client in clients:
            await client.close()


async def test_a_request_reaches_only_the_replica_subscribed_to_its_slot(
    cluster: NatsCluster,
) -> None:
    """Replicas subscribe to the slots of their partitions (svc_accounting/routes.py), on
    different servers: a node's request reaches the one subscribed to the node's slot, and
    the other replica sees nothing of it. A node may name another slot for its own node (its
    grant is `<op>.*.<node>`): that reaches the other slot's owner, never another node's."""
    users = ("accounting", "accounting", "node-1")
    async with connected(cluster, *users, spread=True) as (owner, other, node):
        assert owner.nc is not None and other.nc is not None and node.nc is not None
        ports = {c.connected_url.port for c in (owner.nc, other.nc, node.nc) if c.connected_url}
        assert ports == {member.port for member in cluster.members}
        mine, elsewhere = slot_of("node-1"), (slot_of("node-1") + 1) % SLOTS
        seen: dict[str, list[str]] = {"owner": [], "other": []}

        def replica(name: str) -> Any:
            async def handle(msg: Any) -> None:
                seen[name].append(msg.subject)
                await msg.respond(name.encode())

            return handle

        await owner.nc.subscribe(subjects.accounting_slot(mine), cb=replica("owner"))
        await other.nc.subscribe(subjects.accounting_slot(elsewhere), cb=replica("other"))
        await owner.nc.flush()
        await other.nc.flush()

        for op in NODE_OPS:
            reply = await served_request(node.nc, subjects.accounting(op, "node-1"))
            assert reply.data == b"owner", op
        wrong_slot = f"{subjects.ACCOUNTING_PREFIX}.pending.{elsewhere}.node-1"
        assert (await served_request(node.nc, wrong_slot)).data == b"other"
        assert seen == {
            "owner": [subjects.accounting(op, "node-1") for op in NODE_OPS],
            "other": [wrong_slot],
        }
        assert owner.violations == other.violations == node.violations == []


async def next_update(watcher: KeyValue.KeyWatcher, within: float = 5.0) -> KeyValue.Entry | None:
    """The watch's next entry (None: the end of the initial values)."""
    entry: KeyValue.Entry | None = await watcher.updates(timeout=within)  # type: ignore[no-untyped-call]  # untyped in nats-py
    return entry


async def stop_watch(watcher: KeyValue.KeyWatcher) -> None:
    await watcher.stop()  # type: ignore[no-untyped-call]  # untyped in nats-py


async def refused_create(kv: KeyValue, key: str, value: bytes, within: float = 15.0) -> None:
    """`create` of a key that exists must fail with a wrong last sequence, once the stream
    answers from this connection's server (a fresh R3 stream may not, for a moment)."""
    async with asyncio.timeout(within):
        while True:
            try:
                await kv.create(key, value)
            except nats.js.errors.KeyWrongLastSequenceError:
                return
            except (nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError):
                await asyncio.sleep(0.05)
                continue
            raise AssertionError(f"{key} was created twice")


@pytest.mark.parametrize("direct", [False, True], ids=["msg-get", "direct-get"])
async def test_accounting_keeps_its_leases_in_the_bucket(
    fresh_cluster: NatsCluster, direct: bool
) -> None:
    """Everything the lease code does (svc_accounting/leases.py), with the accounting
    credentials: the bucket is created if missing, keys are created, compare-and-set updated,
    read, listed and deleted, and the bucket is watched, with no permission violated. Reads
    go through $JS.API.STREAM.MSG.GET, or $JS.API.DIRECT.GET when the bucket allows direct
    gets (as one made by `nats kv add` does)."""
    async with connected(fresh_cluster, "accounting", "accounting") as (owner, other):
        assert owner.nc is not None and other.nc is not None
        js = owner.nc.jetstream(timeout=5)
        with pytest.raises(nats.js.errors.BucketNotFoundError):
            await js.key_value(BUCKET)
        config = KeyValueConfig(
            bucket=BUCKET, history=1, ttl=60, storage=StorageType.MEMORY, replicas=3, direct=direct
        )
        kv = await create_bucket(js, config)
        # A second replica binds the existing bucket and watches it.
        watched = await other.nc.jetstream(timeout=5).key_value(BUCKET)
        watcher = await watched.watchall()
        assert await next_update(watcher) is None  # nothing yet

        await put_within(kv, "member.replica-a", b"replica-a")
        revision = await kv.create("partition.3", b'{"replica": "replica-a"}')
        await refused_create(watched, "partition.3", b'{"replica": "replica-b"}')
        renewed = await kv.update("partition.3", b'{"replica": "replica-a", "n": 2}', last=revision)
        with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
            await watched.update("partition.3", b'{"replica": "replica-b"}', last=revision)
        entry = await watched.get("partition.3")
        assert (entry.value, entry.revision) == (b'{"replica": "replica-a", "n": 2}', renewed)
        assert sorted(await watched.keys()) == ["member.replica-a", "partition.3"]
        assert (await kv.status()).stream_info.config.max_age == 60
        await kv.delete("partition.3", last=renewed)  # handed over
        with pytest.raises((nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError)):
            await watched.get("partition.3")
        taken = await watched.create(
            "partition.3", b'{"replica": "replica-b"}'
        )  # over the tombstone
        assert taken > renewed

        updates: list[tuple[str, str | None]] = []
        # Bounded generously: a watch made while the fresh R3 stream settles its leader can
        # stall until nats-py notices two missed heartbeats and recreates its consumer.
        async with asyncio.timeout(WATCH_CATCH_UP):
            while len(updates) < 5:
                update = await next_update(watcher, WATCH_CATCH_UP)
                if update is not None:
                    updates.append((update.key, update.operation))
        assert updates == [
            ("member.replica-a", None),
            ("partition.3", None),
            ("partition.3", None),
            ("partition.3", "DEL"),
            ("partition.3", None),
        ]
        await stop_watch(watcher)
        assert owner.violations == other.violations == []


async def test_a_watch_keeps_up_under_flow_control(fresh_cluster: NatsCluster) -> None:
    """A KV watch is an ordered consumer with flow control: past about 2 MB in flight the
    server waits for the client's answer on $JS.FC.KV_numafit-accounting.>, which the
    accounting user may send (granted explicitly, and as a reply through allow_responses;
    with neither, measured, the watch stalls after about 100 of these 200 updates)."""
    async with connected(fresh_cluster, "accounting") as (accounting,):
        assert accounting.nc is not None
        js = accounting.nc.jetstream(timeout=5)
        config = KeyValueConfig(bucket=BUCKET, history=1, ttl=60, replicas=3)
        kv = await create_bucket(js, config)
        watcher = await kv.watchall()
        assert await next_update(watcher) is None
        count, value = 200, b"x" * 20_000  # 4 MB: flow control asks several times
        await put_within(kv, "member.0", value)
        await asyncio.gather(*(kv.put(f"member.{i}", value) for i in range(1, count)))
        received = 0
        async with asyncio.timeout(30):
            while received < count:
                if await next_update(watcher, 10) is not None:
                    received += 1
        await stop_watch(watcher)
        assert accounting.violations == []


async def test_the_lease_code_runs_with_the_accounting_credentials(
    fresh_cluster: NatsCluster,
) -> None:
    """Two replicas of the real lease code share the partitions under these permissions."""
    partitions = 8
    async with connected(fresh_cluster, "accounting", "accounting") as connections:
        replicas = []
        for name, connection in zip(("replica-a", "replica-b"), connections, strict=True):
            assert connection.nc is not None

            async def nothing(_: object) -> None:
                return None

            leases = Leases(
                connection.nc,
                replica=name,
                partitions=partitions,
                ttl=3.0,
                on_acquired=nothing,
                on_released=nothing,
            )
            await leases.open()
            replicas.append(leases)
        tasks = [asyncio.create_task(leases.run()) for leases in replicas]
        try:
            async with asyncio.timeout(15):
                while True:
                    held = [set(leases.serving) for leases in replicas]
                    if (
                        all(held)
                        and not held[0] & held[1]
                        and held[0] | held[1] == set(range(partitions))
                    ):
                        break
                    await asyncio.sleep(0.05)  # the rounds run on their own timers
        finally:
            for leases in replicas:
                await leases.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert [c.violations for c in connections] == [[], []]


@pytest.mark.parametrize("user", ["node-1", "scheduler", "refit"])
async def test_nobody_else_touches_the_lease_bucket(fresh_cluster: NatsCluster, user: str) -> None:
    async with connected(fresh_cluster, "accounting", user) as (accounting, intruder):
        assert accounting.nc is not None and intruder.nc is not None
        config = KeyValueConfig(bucket=BUCKET, history=1, ttl=60, replicas=3)
        kv = await create_bucket(accounting.nc.jetstream(timeout=5), config)
        revision = await put_within(kv, "partition.0", b"replica-a")

        nc = intruder.nc
        js = nc.jetstream(timeout=0.5)
        denied = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.Error)
        with pytest.raises(denied):
            await js.key_value(BUCKET)
        with pytest.raises(denied):
            await js.create_key_value(KeyValueConfig(bucket="numafit-accounting-2"))
        with pytest.raises(denied):
            await nc.request(f"$JS.API.STREAM.MSG.GET.KV_{BUCKET}", b'{"seq": 1}', timeout=0.5)
        with pytest.raises(denied):
            await nc.request(f"$KV.{BUCKET}.partition.0", b"intruder", timeout=0.5)
        watch = await nc.subscribe(f"$KV.{BUCKET}.>")
        await nc.flush()
        await kv.put("partition.1", b"replica-a")
        with pytest.raises(nats.errors.TimeoutError):
            await watch.next_msg(timeout=0.3)

        # Nothing changed, and the server said why.
        entry = await kv.get("partition.0")
        assert (entry.value, entry.revision) == (b"replica-a", revision)
        async with asyncio.timeout(5):
            while not any("subscription" in v for v in intruder.violations):
                intruder.violated.clear()  # reported asynchronously by the server
                await intruder.violated.wait()
        for subject in (
            "$js.api.stream.info.kv_numafit-accounting",
            "$js.api.stream.create.kv_numafit-accounting-2",
            "$js.api.stream.msg.get.kv_numafit-accounting",
            "$kv.numafit-accounting.partition.0",
        ):
            assert any(subject in v.lower() for v in intruder.violations), subject
        assert accounting.violations == []


async def test_only_the_service_asked_answers(cluster: NatsCluster) -> None:
    """Plain request-reply: the refit answers the device plugin through allow_responses, after
    its own move request was answered by accounting; accounting has no grant to publish into
    a node's inbox (the server refuses it and says so)."""
    async with connected(cluster, "accounting", "refit", "node-1") as (accounting, refit, node):
        assert accounting.nc is not None and refit.nc is not None and node.nc is not None
        answering, forwarding = accounting.nc, refit.nc

        async def refit_moves(msg: Any) -> None:
            async with asyncio.timeout(5):
                while True:
                    try:
                        moved = await natsconn.request(
                            forwarding, subjects.accounting("move", "node-1"), b"{}", 2
                        )
                        break
                    except nats.errors.NoRespondersError:
                        await asyncio.sleep(0.02)  # accounting's interest still on its way
            await msg.respond(b'{"refit": ' + moved.data + b"}")

        async def accounting_answers(msg: Any) -> None:
            await msg.respond(b'{"ok": true}')

        await forwarding.subscribe(
            subjects.REFIT_WILDCARD, queue=subjects.REFIT_QUEUE, cb=refit_moves
        )
        await answering.subscribe(subjects.accounting_wildcard("move"), cb=accounting_answers)
        await forwarding.flush()
        await answering.flush()
        reply = await served_request(node.nc, subjects.refit("node-1"))
        assert reply.data == b'{"refit": {"ok": true}}'
        assert accounting.violations == [] and refit.violations == []

        await answering.publish("_INBOX_node-1.probe.1", b'{"answered": "accounting"}')
        await answering.flush()
        async with asyncio.timeout(5):
            while not accounting.violations:
                accounting.violated.clear()  # reported asynchronously by the server
                await accounting.violated.wait()
        assert "_inbox_node-1.probe.1" in accounting.violations[0].lower()
