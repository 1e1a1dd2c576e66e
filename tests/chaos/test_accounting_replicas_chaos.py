"""Accounting replicas on a real 3-server NATS cluster (routes on loopback, JetStream on), under
continuous refit and snapshot load across many nodes, while replicas are SIGKILLed at seeded
random moments and one NATS server is killed.

After each kill every node is served again within the lease TTL (the takeover time is measured
from the kill to the last node answering); at the end the ledger equals what the pods'
annotations add up to (summed here, not by the code under test), every `moved` reply is in the
annotations, and the ownership timeline the replicas logged shows no partition served by two
replicas at once. `NUMAFIT_CHAOS_KILLS` sets the number of kills (default 4 in CI; the extended
tier runs 20).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core import keys
from shared.core.partitions import partition_of
from shared.messages import SnapshotReply, SnapshotRequest
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.nats_server import NatsCluster
from tests.builders import gpu, node
from tests.chaos.support import (
    ServiceProcess,
    create,
    entry_devices,
    expected_usage,
    kube_for,
    list_pods,
    nonzero,
    refit_body,
    reserved_pod,
    service,
    stop_all,
    usage_from_metrics,
)
from tests.integration.harness import wait_for
from tests.ownership import Timeline
from tests.raw_accounting import RawAccounting

if TYPE_CHECKING:
    from pathlib import Path

    from nats.aio.client import Client

    from shared.service.kube_io import Kube

SEED = 20261201
KILLS = int(os.environ.get("NUMAFIT_CHAOS_KILLS", "4"))
NODES = [f"node-{i:02d}" for i in range(12)]
PARTITIONS = 8
TTL = 3.0
REPLICAS = 3


def accounting_replica(url: str, kubeconfig: Path, tmp_path: Path, name: str) -> ServiceProcess:
    log_dir = tmp_path / name
    log_dir.mkdir(exist_ok=True)
    return service(
        "accounting",
        url,
        kubeconfig,
        log_dir,
        "--replica-id",
        name,
        "--partitions",
        str(PARTITIONS),
        "--lease-ttl",
        str(TTL),
        "--lease-bucket",
        "chaos-replicas",
    )


def ownership(replicas: list[ServiceProcess], kills: list[tuple[str, float]]) -> Timeline:
    """The serving intervals every replica logged; a killed one's end at its kill."""
    events: list[tuple[float, str, str, int]] = []
    for proc in replicas:
        for line in proc.log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if str(record.get("msg", "")).startswith("partition "):
                    change = record["msg"].split()[1]
                    events.append(
                        (float(record["at"]), change, record["replica"], int(record["partition"]))
                    )
    events += [(at, "killed", replica, -1) for replica, at in kills]
    timeline = Timeline()
    for at, change, replica, k in sorted(events):
        if change == "acquired":
            timeline.start(replica, k, at)
        elif change == "killed":
            timeline.end_all(replica, at)
        else:
            timeline.end(replica, k, at)
    return timeline


async def all_answer(client: RawAccounting) -> bool:
    """Every node's snapshot is answered now (asked all at once, each with a short budget)."""

    async def answered(name: str) -> bool:
        try:
            reply = await client.ask(SnapshotRequest(node=name), SnapshotReply, 0.25)
        except Exception:
            return False
        return reply.ok and bool(reply.nodes)

    return all(await asyncio.gather(*(answered(n) for n in NODES)))


@dataclass
class RefitLoad:
    """Refits flipping each pod between its node's two GPUs until `stop`; what they answered."""

    nc: Client
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    moved: dict[str, str] = field(default_factory=dict)
    """Pod UID -> the GPU the last `moved` answer for it named: it must hold at the end."""
    errors: list[str] = field(default_factory=list)

    async def run(self, target: dict[str, Any]) -> None:
        uid = target["metadata"]["uid"]
        name = target["spec"]["nodeName"]
        flip = False
        while not self.stop.is_set():
            flip = not flip
            gpu_id = f"{name}-{'b' if flip else 'a'}"
            body = orjson.dumps(refit_body(target, [gpu_id]))
            try:
                msg = await natsconn.request(self.nc, subjects.refit(name), body, 2.5)
            except Exception as exc:  # a takeover or a lost broker: counted
                self.errors.append(type(exc).__name__)
                self.moved.pop(uid, None)  # it may or may not have landed
                continue
            code = str(orjson.loads(msg.data).get("code"))
            if code == "moved":
                self.moved[uid] = gpu_id  # the last answer for the pod: it must hold
            else:
                self.moved.pop(uid, None)
                if code != "already_aligned":
                    self.errors.append(code)
            await asyncio.sleep(0.02)  # a device plugin's pace, not a wait


@dataclass
class Replicas:
    """The accounting replicas, as a Deployment replaces them, and what their kills took."""

    url: str
    kubeconfig: Path
    tmp_path: Path
    live: dict[str, ServiceProcess] = field(default_factory=dict)
    retired: list[ServiceProcess] = field(default_factory=list)
    kills: list[tuple[str, float]] = field(default_factory=list)
    takeovers: list[float] = field(default_factory=list)
    after_loss: list[float] = field(default_factory=list)
    """Takeovers right after a NATS server was lost (its streams elect new leaders)."""

    def add(self, name: str) -> ServiceProcess:
        self.live[name] = accounting_replica(self.url, self.kubeconfig, self.tmp_path, name)
        return self.live[name]

    async def kill_rounds(
        self, client: RawAccounting, cluster: NatsCluster, rng: random.Random
    ) -> None:
        """KILLS rounds: a seeded replica is killed, every node is awaited served again (the
        takeover time), and the replica comes back; half-way one NATS server goes too."""
        broker_lost = False
        for round_ in range(KILLS):
            await asyncio.sleep(rng.uniform(0.2, 1.0))  # chaos timing
            victim = rng.choice(sorted(self.live))
            proc = self.live[victim]
            killed_at = time.time()
            proc.kill()
            self.kills.append((victim, killed_at))
            started = time.monotonic()
            await wait_for(lambda: all_answer(client), within=6 * TTL)
            took = time.monotonic() - started
            (self.after_loss if broker_lost else self.takeovers).append(took)
            # A new pod of the Deployment: a new name on odd rounds, the same (a container
            # restart) on even ones.
            if round_ % 2:
                self.retired.append(proc)
                del self.live[victim]
                proc = self.add(f"acc-{REPLICAS + round_}")
            proc.start()
            await proc.wait_ready()
            broker_lost = False
            if round_ == KILLS // 2:
                cluster.kill(rng.randrange(3))  # one NATS server goes too
                broker_lost = True  # the next takeover waits for JetStream too

    async def exporters(self) -> dict[str, list[str]]:
        """Per node, the scrapes of the replicas exporting its per-GPU gauges."""
        found: dict[str, list[str]] = {name: [] for name in NODES}
        for proc in self.live.values():
            text = await proc.metrics()
            for name in NODES:
                series = f'numafit_accounting_device_memory_reserved_mib{{node="{name}"'
                if series in text:
                    found[name].append(text)
        return found

    async def exported_once(self) -> bool:
        return all(len(texts) == 1 for texts in (await self.exporters()).values())


async def seed_pods(kube: Kube) -> list[dict[str, Any]]:
    """Each node with two GPUs on two NUMA nodes, and one reserved pod on its first GPU."""
    pods = []
    for name in NODES:
        await create(kube, "node", node(name, [gpu(f"{name}-a", 0), gpu(f"{name}-b", 1)]))
        pods.append(
            await create(
                kube, "pod", reserved_pod(f"p-{name}", f"{name}-a", 4000, 10, node_name=name)
            )
        )
    return pods


async def ledger_matches_annotations(kube: Kube, client: RawAccounting) -> bool:
    """Every node's ledger, as accounting answers its snapshot, equals the pods' annotations."""
    current = await list_pods(kube)
    for name in NODES:
        reply = await client.ask(SnapshotRequest(node=name), SnapshotReply, 1.0)
        assert reply.nodes
        ledger = {
            p.pod.metadata.uid: p.pod.metadata.annotations.get(keys.ALLOCATED)
            for p in reply.nodes[0].pods
        }
        annotated = {
            p["metadata"]["uid"]: p["metadata"]["annotations"].get(keys.ALLOCATED)
            for p in current
            if p["spec"]["nodeName"] == name
        }
        if ledger != annotated:
            return False
    return True


async def test_replicas_survive_kills_and_a_nats_server_loss_without_drift(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    with NatsCluster(3) as cluster:
        async with KubeEmulator() as emulator:
            kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
            kube = await kube_for(kubeconfig)
            replicas = Replicas(cluster.url, kubeconfig, tmp_path)
            for i in range(REPLICAS):
                replicas.add(f"acc-{i}")
            refits = [
                service("refit", cluster.url, kubeconfig, tmp_path / f"refit-{i}") for i in range(2)
            ]
            for proc in refits:
                proc.log_dir.mkdir(exist_ok=True)
            connection = await natsconn.connect(cluster.url, "chaos-replicas")
            client = RawAccounting(connection.client)
            load = RefitLoad(connection.client)
            try:
                pods = await seed_pods(kube)
                for proc in [*replicas.live.values(), *refits]:
                    proc.start()
                for proc in [*replicas.live.values(), *refits]:
                    await proc.wait_ready()
                await wait_for(lambda: all_answer(client), within=3 * TTL)

                tasks = [asyncio.create_task(load.run(p)) for p in pods]
                await replicas.kill_rounds(client, cluster, rng)
                load.stop.set()
                await asyncio.gather(*tasks)
                # Everything served again; then the ledger must equal the annotations.
                await wait_for(lambda: all_answer(client), within=4 * TTL)
                await wait_for(lambda: ledger_matches_annotations(kube, client), within=10)
                current = await list_pods(kube)

                # Exactly one replica, the one serving the node, exports its per-GPU gauges
                # (a rebalance after the last restart may still be handing partitions over),
                # and they equal the annotations.
                await wait_for(replicas.exported_once, within=10)
                for name, texts in (await replicas.exporters()).items():
                    assert len(texts) == 1, (name, len(texts))
                    gauges = nonzero(usage_from_metrics(texts[0], name))
                    k = partition_of(name, PARTITIONS)
                    assert gauges == nonzero(expected_usage(current, name)), (name, k)
            finally:
                load.stop.set()
                with contextlib.suppress(Exception):
                    await connection.close()
                stop_all([*refits, *replicas.live.values()])
                await kube.api.close()

    on_gpu = {
        p["metadata"]["uid"]: entry_devices(p["metadata"]["annotations"][keys.ALLOCATED])[0][0][0]
        for p in current
    }
    moved, errors, kills, takeovers = load.moved, load.errors, replicas.kills, replicas.takeovers
    lost = {uid: (gpu_id, on_gpu[uid]) for uid, gpu_id in moved.items() if on_gpu[uid] != gpu_id}
    timeline = ownership([*replicas.live.values(), *replicas.retired], kills)
    print(
        f"\nkills {len(kills)}; takeover p50 {statistics.median(takeovers):.2f}s max "
        f"{max(takeovers):.2f}s (TTL {TTL}s); right after losing a NATS server "
        f"{[round(t, 2) for t in replicas.after_loss]}; refits moved {len(moved)} pods; failed "
        f"refit requests {len(errors)} ({sorted(set(errors))}); ownership changes "
        f"{timeline.changes()}, overlaps {len(timeline.overlaps())}"
    )
    assert lost == {}, f"moved replies that did not land: {lost}"
    assert timeline.overlaps() == []
    # A dead replica's keys expire a TTL after its last renewal (up to a third of a TTL before
    # the kill); the survivors take them at that moment and rebuild in milliseconds (measured:
    # p50 2.9 s, max 3.9 s over 20 kills). The bound leaves room for a loaded CI machine.
    assert max(takeovers) <= 2 * TTL
    assert all(t <= 3 * TTL for t in replicas.after_loss)
