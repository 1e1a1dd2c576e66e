"""numafit on a real 3-server NATS cluster (three nats-server processes, routes on loopback,
JetStream on every one): the cluster forms with JetStream, a replicated KV bucket stays
writable when a server dies, clients fail over between the members, and the services (a
refit service, accounting, a scheduler-side read model, each on another server) keep working
when the server one of them is connected to is killed. Every component (`numafit run` of the
four services and sim-node) takes a comma-separated URL list from --nats-url or
NUMAFIT_NATS_URL, skips a dead first entry and moves to another member when its own dies."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
import pytest
from nats.js.api import KeyValueConfig

from shared.accounting_client import AccountingClient
from shared.core import keys
from shared.service import natsconn
from shared.service.wiring import InProcess
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.nats_server import NatsCluster
from svc_accounting import service as accounting_service
from svc_refit import service as refit_service
from svc_scheduler.read_model import ReadModel
from tests.builders import container, gpu, node, pod, refit_request
from tests.integration.harness import Harness, wait_for
from tests.integration.processes import NUMAFIT, free_port, kube_emulator_process
from tests.jetstream import create_bucket, put_within
from tests.scheduler.stack import for_create

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from nats.aio.client import Client

FAILOVER = 5.0
"""Seconds within which requests between two survivors must be answered again after a kill
(nats-py notices the closed socket at once and reconnects every 0.5 s through natsconn)."""
JETSTREAM_FAILOVER = 20.0
"""Seconds within which a replicated KV bucket must take writes again after its stream leader
is killed (measured 5 to 8 s on a 2-core machine: the survivors wait out nats-server's
randomized election timeout, 4 to 9 s, before electing a new leader)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    """One cluster for the tests that kill nothing."""
    with NatsCluster(3) as running:
        yield running


@pytest.fixture
async def fresh_cluster() -> AsyncIterator[NatsCluster]:
    """A cluster of its own for a test that kills members."""
    running = NatsCluster(3)
    await asyncio.to_thread(running.start)
    try:
        yield running
    finally:
        await asyncio.to_thread(running.close)


def monitoring(cluster: NatsCluster, member: int, endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{cluster.monitor_url(member)}/{endpoint}", timeout=5) as r:
        body: dict[str, Any] = json.loads(r.read())
        return body


def port_of(nc: Client) -> int:
    assert nc.connected_url is not None
    return int(nc.connected_url.port or 0)


async def connect(cluster: NatsCluster, member: int, name: str) -> Client:
    """A service-style connection given one member's URL only: it learns the others from
    the cluster and fails over to them."""
    nc = (await natsconn.connect(cluster.urls[member], name)).client
    assert cluster.member_of(port_of(nc)) == member
    return nc


def test_the_cluster_forms_with_a_jetstream_meta_leader(cluster: NatsCluster) -> None:
    names = {member.name for member in cluster.members}
    leaders = set()
    for i, member in enumerate(cluster.members):
        routes = monitoring(cluster, i, "routez")["routes"]
        assert {r["remote_name"] for r in routes} == names - {member.name}
        meta = monitoring(cluster, i, "jsz")["meta_cluster"]
        assert meta["name"] == "numafit" and meta["cluster_size"] == 3
        leaders.add(meta["leader"])
        assert monitoring(cluster, i, "healthz") == {"status": "ok"}
    (leader,) = leaders
    assert leader in names
    assert cluster.url == ",".join(cluster.urls) and len(set(cluster.urls)) == 3


async def test_a_replicated_bucket_is_shared_by_every_member(cluster: NatsCluster) -> None:
    writer = await connect(cluster, 0, "writer")
    readers = [await connect(cluster, i, f"reader-{i}") for i in (1, 2)]
    try:
        js = writer.jetstream(timeout=5)
        kv = await create_bucket(js, KeyValueConfig(bucket="shared", history=1, replicas=3))
        await put_within(kv, "partition.0", b"replica-a", 10)

        async def replicated() -> bool:
            info = await js.stream_info("KV_shared")
            peers = info.cluster.replicas if info.cluster is not None else None
            return peers is not None and len(peers) == 2 and all(p.current for p in peers)

        await wait_for(replicated, 10)  # the followers report themselves current
        for reader in readers:
            entry = await (await reader.jetstream(timeout=5).key_value("shared")).get("partition.0")
            assert entry.value == b"replica-a"
    finally:
        for nc in (writer, *readers):
            await nc.close()


async def test_a_url_list_gives_the_client_every_member(cluster: NatsCluster) -> None:
    """`--nats-url a,b,c` becomes nats-py's `servers=[a, b, c]` (natsconn splits the list;
    nats-py would not), and the cluster tells the client of the members it was not given."""
    listed = (await natsconn.connect(f" {cluster.urls[0]} , {cluster.urls[1]},", "listed")).client
    solo = (await natsconn.connect(cluster.urls[2], "solo")).client
    try:
        hosts = [f"127.0.0.1:{member.port}" for member in cluster.members]
        # The members a client was not given arrive in an INFO update of the server it is on.
        await wait_for(
            lambda: (
                {s.netloc for s in listed.servers} == set(hosts)
                and {s.netloc for s in solo.servers} == set(hosts)
            ),
            within=5,
        )
        assert {s.netloc for s in listed.servers} == set(hosts)
        assert [s.netloc for s in listed.discovered_servers] == [hosts[2]]
        assert {s.netloc for s in solo.servers} == set(hosts)
        assert {s.netloc for s in solo.discovered_servers} == {hosts[0], hosts[1]}
    finally:
        await listed.close()
        await solo.close()


async def test_a_replicated_bucket_stays_writable_when_its_leader_dies(
    fresh_cluster: NatsCluster,
) -> None:
    cluster = fresh_cluster
    clients = [await connect(cluster, i, f"client-{i}") for i in range(3)]
    try:
        js = clients[0].jetstream(timeout=2)
        kv = await create_bucket(js, KeyValueConfig(bucket="leases", history=1, replicas=3))
        await put_within(kv, "partition.0", b"1", 10)
        info = await js.stream_info("KV_leases")
        assert info.cluster is not None and info.cluster.leader is not None
        # The worst server to lose: the stream's leader (the others must elect a new one).
        victim = next(m.index for m in cluster.members if m.name == info.cluster.leader)
        survivor = next(c for c in clients if cluster.member_of(port_of(c)) != victim)
        survivor_kv = await survivor.jetstream(timeout=2).key_value("leases")
        cluster.kill(victim)
        started = time.monotonic()
        await put_within(survivor_kv, "partition.0", b"2", JETSTREAM_FAILOVER)
        took = time.monotonic() - started
        assert took < JETSTREAM_FAILOVER
        assert (await survivor_kv.get("partition.0")).value == b"2"
        # Compare-and-set works on the new leader as it did on the old one.
        current = (await survivor_kv.get("partition.0")).revision
        await survivor_kv.update("partition.0", b"3", last=current)
        with pytest.raises(nats.js.errors.KeyWrongLastSequenceError):
            await survivor_kv.update("partition.0", b"4", last=current)

        # The member comes back with its store and catches up before it is healthy again.
        await asyncio.to_thread(cluster.restart, victim)
        back = await connect(cluster, victim, "back")
        clients.append(back)
        entry = await (await back.jetstream(timeout=5).key_value("leases")).get("partition.0")
        assert entry.value == b"3"
    finally:
        for nc in clients:
            await nc.close()


class Traffic:
    """A requester asking a responder over and over (every 10 ms); when answers resumed."""

    def __init__(self, requester: Client, subject: str) -> None:
        self.requester = requester
        self.subject = subject
        self.answered = 0
        self.last_answer = 0.0
        self.answer = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        # Stopped by the flag, not by cancelling: on Python 3.11 asyncio.wait_for (inside
        # nats-py's request) can swallow a cancellation that lands as the reply arrives.
        while not self._stopping.is_set():
            try:
                reply = await natsconn.request(self.requester, self.subject, b"ping", 0.5)
            except (nats.errors.Error, TimeoutError):
                # Disconnected, no responder yet, or the request was lost with the server.
                await asyncio.sleep(0.02)
                continue
            assert reply.data == b"pong"
            self.answered += 1
            self.last_answer = time.monotonic()
            self.answer.set()
            await asyncio.sleep(0.01)  # a steady stream, not a busy loop on a 2-core machine

    async def answered_after(self, moment: float, within: float) -> float:
        """Seconds from `moment` to the first answer after it (fails after `within`)."""
        async with asyncio.timeout(within):
            while self.last_answer <= moment:
                self.answer.clear()
                await self.answer.wait()
        return self.last_answer - moment

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            async with asyncio.timeout(5):  # one request's budget, and its pause
                await self._task


async def test_requests_fail_over_when_the_responders_or_the_requesters_server_dies(
    fresh_cluster: NatsCluster,
) -> None:
    cluster = fresh_cluster
    responder = await connect(cluster, 0, "responder")
    requester = await connect(cluster, 1, "requester")
    listed = (
        await natsconn.connect(cluster.url, "listed")
    ).client  # the whole comma-separated list

    async def pong(msg: Any) -> None:
        await msg.respond(b"pong")

    await responder.subscribe("numafit.test.ping", cb=pong)
    await responder.flush()
    direct = Traffic(requester, "numafit.test.ping")
    via_list = Traffic(listed, "numafit.test.ping")
    try:
        direct.start()
        via_list.start()
        await direct.answered_after(0, FAILOVER)
        await via_list.answered_after(0, FAILOVER)

        # The responder's server dies: it reconnects to a member it learned from the cluster
        # and its subscription is replayed there.
        killed = time.monotonic()
        cluster.kill(0)
        assert await direct.answered_after(killed, FAILOVER) < FAILOVER
        assert await via_list.answered_after(killed, FAILOVER) < FAILOVER
        assert cluster.member_of(port_of(responder)) in (1, 2)

        # Then the requester's: both end up on the last member standing.
        killed = time.monotonic()
        cluster.kill(1)
        assert await direct.answered_after(killed, FAILOVER) < FAILOVER
        assert await via_list.answered_after(killed, FAILOVER) < FAILOVER
        assert cluster.member_of(port_of(requester)) == 2
        assert cluster.member_of(port_of(responder)) == 2
        assert responder.is_connected and requester.is_connected and listed.is_connected
    finally:
        await direct.stop()
        await via_list.stop()
        for nc in (responder, requester, listed):
            await nc.close()


# ---------------------------------------------------------------------------------------------
# the services


def refit_pod(name: str) -> dict[str, Any]:
    """An init container on GPU-b, the app on GPU-a (which kubelet will refuse)."""
    return pod(
        name,
        namespace="ml",
        init=[container("prep", 1, 10000, 20)],
        containers=[container("main", 1, 10000, 20)],
        allocated="GPU-b,NVIDIA,10000,20:;GPU-a,NVIDIA,10000,20:;",
        to_allocate=";GPU-a,NVIDIA,10000,20:;",
        annotations={keys.NUMA_ALIGNMENT: "best-effort", keys.BIND_PHASE: "allocating"},
    )


PODS = ("train-1", "train-2", "train-3")


class Stack:
    """Accounting on member 0, the refit service and a scheduler-side read model on member 1,
    the test's own client on member 2: each with one member's URL, failing over through the
    members the cluster tells it of."""

    def __init__(self, cluster: NatsCluster, emulator: KubeEmulator, kubeconfig: Path) -> None:
        self.cluster = cluster
        self.h = Harness(emulator, kubeconfig, cluster.urls[2])
        self.accounting_side = InProcess(cluster.urls[0], kubeconfig)
        self.refit_side = InProcess(cluster.urls[1], kubeconfig)
        self.read_model: ReadModel | None = None
        self.pods: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        h = self.h
        h.kube = await h.wiring.kube("test")
        await h.create("node", node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0)]))
        for name in PODS:
            self.pods[name] = await h.create("pod", for_create(refit_pod(name)))
        h.client_nc = (await h.wiring.nats("test-client")).client
        h.accounting = await self.accounting_side.start(
            accounting_service.spec(h.accounting_options), client_name="accounting"
        )
        h.refit = await self.refit_side.start(refit_service.spec(), client_name="refit")
        reader = await self.refit_side.nats("scheduler")
        self.read_model = ReadModel(reader.client, AccountingClient(reader.client))
        reader.on_reconnect(self.read_model.on_reconnect)  # as svc_scheduler wires it
        await self.read_model.start()
        async with asyncio.timeout(10):
            await self.read_model.ready.wait()
        assert self.member("accounting") == 0
        assert self.member("refit") == self.member("reader") == 1

    def member(self, who: str) -> int:
        h = self.h
        nc = {
            "accounting": h.accounting.nc if h.accounting else None,
            "refit": h.refit.nc if h.refit else None,
            "reader": self.read_model.nc if self.read_model else None,
        }[who]
        assert nc is not None
        return self.cluster.member_of(port_of(nc))

    async def stop(self) -> None:
        if self.read_model is not None:
            await self.read_model.stop()
        await self.refit_side.close(1.0)
        await self.accounting_side.close(1.0)
        await self.h.stop()

    async def refit_until_moved(self, name: str, within: float) -> dict[str, Any]:
        """Ask for the refit until it is answered `moved` (during a takeover accounting may
        refuse or not answer yet); the final answer."""
        body = refit_request(self.pods[name], 1, ["GPU-b"])
        async with asyncio.timeout(within):
            while True:
                try:
                    reply = await self.h.refit_request(body)
                except (nats.errors.Error, TimeoutError):
                    continue  # no answer within the request's own 5 s budget: ask again
                if reply["succeeded"]:
                    return reply
                await asyncio.sleep(0.1)

    async def read_model_sees(self, gpu_a_slots: int, within: float) -> None:
        """The read model's view of node-1 (kept by usage updates and reconnect refreshes)
        shows `gpu_a_slots` pods still counted on GPU-a."""
        model = self.read_model
        assert model is not None

        async def counted() -> bool:
            views = await model.views(["node-1"], 2.0)
            view = views["node-1"]
            if view is None or view.snapshot is None:
                return False
            return view.snapshot.by_uuid()["GPU-a"].used == gpu_a_slots

        await wait_for(counted, within)


@pytest.fixture
async def stack(fresh_cluster: NatsCluster, tmp_path: Path) -> AsyncIterator[Stack]:
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        running = Stack(fresh_cluster, emulator, kubeconfig)
        try:
            await running.start()
            yield running
        finally:
            await running.stop()


async def test_the_services_keep_working_when_a_nats_server_dies(stack: Stack) -> None:
    cluster = stack.cluster
    # Before anything dies: the refit moves train-1's app to GPU-b.
    first = await stack.refit_until_moved("train-1", 10)
    assert first["code"] == "moved" and first["containerDevices"] == "GPU-b,NVIDIA,10000,20:"
    await stack.read_model_sees(gpu_a_slots=2, within=10)

    # Accounting's server dies: accounting reconnects to another member (its lease bucket is
    # replicated on all three), and the refit service and the read model, on another server,
    # never lose their connection.
    cluster.kill(0)
    second = await stack.refit_until_moved("train-2", 30)
    assert second["code"] == "moved"
    await stack.read_model_sees(gpu_a_slots=1, within=10)
    assert stack.member("accounting") in (1, 2)

    # Back to three; then the refit service's and the read model's server dies.
    await asyncio.to_thread(cluster.restart, 0)
    cluster.kill(1)
    third = await stack.refit_until_moved("train-3", 30)
    assert third["code"] == "moved"
    await stack.read_model_sees(gpu_a_slots=0, within=10)
    assert stack.member("refit") in (0, 2) and stack.member("reader") in (0, 2)

    # What the pods say is what the read model counts: every app moved to GPU-b.
    for name in PODS:
        annotations = (await stack.h.pod("ml", name))["metadata"]["annotations"]
        assert annotations[keys.TO_ALLOCATE] == ";GPU-b,NVIDIA,10000,20:;", name
    view = (await stack.read_model.views(["node-1"], 2.0))["node-1"] if stack.read_model else None
    assert view is not None and view.snapshot is not None
    usage = view.snapshot.by_uuid()
    assert (usage["GPU-a"].used, usage["GPU-a"].usedmem) == (0, 0)
    assert usage["GPU-b"].used == 3


# ---------------------------------------------------------------------------------------------
# every component takes the list, from the flag or the environment

TOPOLOGY = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "topology.yaml"


def launch(line: list[str], log: Path, environment: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:  # the child keeps its own descriptor
        return subprocess.Popen(line, stdout=handle, stderr=subprocess.STDOUT, env=environment)


def client_names(cluster: NatsCluster, members: list[int]) -> dict[str, int]:
    """The named client connections on `members`: name -> member."""
    found = {}
    for i in members:
        for connection in monitoring(cluster, i, "connz?limit=1024")["connections"] or []:
            if connection.get("name"):
                found[connection["name"]] = i
    return found


async def test_every_component_takes_a_url_list_and_fails_over(
    fresh_cluster: NatsCluster, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """The four services, the device plugin's node and sim-node, as `numafit run` processes,
    given a list whose first server is down (half by --nats-url, half by NUMAFIT_NATS_URL):
    each connects to the cluster, and moves to another member when its own dies."""
    cluster = fresh_cluster
    kubeconfig = await kube_emulator_process(processes, tmp_path)
    urls = f"nats://127.0.0.1:{free_port()}, {cluster.url}"  # nothing listens on the first
    common = ["--kubeconfig", str(kubeconfig), "--metrics-host", "127.0.0.1"]
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    components: dict[str, tuple[list[str], bool]] = {
        "numafit-accounting": (["accounting", *common], True),
        "numafit-refit": (["refit", *common], False),
        "numafit-scheduler": (
            ["scheduler", *common, "--listen-host", "127.0.0.1", "--listen-port", "0"],
            True,
        ),
        "numafit-deviceplugin": (
            [
                "deviceplugin",
                "--node",
                "node-1",
                "--topology",
                str(TOPOLOGY),
                "--device-plugin-dir",
                str(plugin_dir),
                "--metrics-host",
                "127.0.0.1",
            ],
            False,
        ),
        "sim-node": (
            [
                "sim-node",
                "--node",
                "sim-1",
                "--dir",
                str(plugin_dir / "sim"),
                "--topology",
                str(TOPOLOGY),
                "--kubeconfig",
                str(kubeconfig),
                "--interval",
                "3600",
            ],
            True,
        ),
    }
    (plugin_dir / "sim").mkdir()
    for name, (args, by_env) in components.items():
        environment = {k: v for k, v in os.environ.items() if k != "NUMAFIT_NATS_URL"}
        if by_env:
            environment["NUMAFIT_NATS_URL"] = urls
            line = [NUMAFIT, "run", *args]
        else:
            line = [NUMAFIT, "run", *args, "--nats-url", urls]
        line += ["--metrics-port", str(free_port())]
        processes.append(launch(line, tmp_path / f"{name}.log", environment))

    everyone = [0, 1, 2]

    def connected() -> bool:
        return set(components) <= set(client_names(cluster, everyone))

    await wait_for(connected, 60)  # Python processes starting on a loaded machine
    where = client_names(cluster, everyone)
    # Kill the member most of them are on; each moves to a survivor.
    victim = max(everyone, key=lambda i: sum(1 for m in where.values() if m == i))
    moved = [name for name in components if where[name] == victim]
    cluster.kill(victim)
    survivors = [i for i in everyone if i != victim]

    def reconnected() -> bool:
        return set(components) <= set(client_names(cluster, survivors))

    await wait_for(reconnected, 15)
    assert moved, where
    for process in processes:
        assert process.poll() is None, "a component exited"
