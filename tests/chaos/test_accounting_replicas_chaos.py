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
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core import keys
from shared.core.partitions import partition_of
from shared.kube_emulator import KubeEmulator
from shared.messages import SnapshotReply, SnapshotRequest
from shared.nats_server import NatsCluster
from shared.service import natsconn
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


async def test_replicas_survive_kills_and_a_nats_server_loss_without_drift(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    with NatsCluster(3) as cluster:
        async with KubeEmulator() as emulator:
            kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
            kube = await kube_for(kubeconfig)
            names = [f"acc-{i}" for i in range(REPLICAS)]
            replicas = {n: accounting_replica(cluster.url, kubeconfig, tmp_path, n) for n in names}
            retired: list[ServiceProcess] = []
            refits = [
                service("refit", cluster.url, kubeconfig, tmp_path / f"refit-{i}") for i in range(2)
            ]
            for proc in refits:
                proc.log_dir.mkdir(exist_ok=True)
            connection = await natsconn.connect(cluster.url, "chaos-replicas")
            nc: Client = connection.client
            client = RawAccounting(nc)
            kills: list[tuple[str, float]] = []
            takeovers: list[float] = []
            after_loss: list[float] = []
            """Takeovers right after a NATS server was lost (its streams elect new leaders)."""
            broker_lost = False
            moved: dict[str, str] = {}
            errors: list[str] = []
            stop = asyncio.Event()
            try:
                pods = []
                for name in NODES:
                    await create(
                        kube, "node", node(name, [gpu(f"{name}-a", 0), gpu(f"{name}-b", 1)])
                    )
                    pods.append(
                        await create(
                            kube,
                            "pod",
                            reserved_pod(f"p-{name}", f"{name}-a", 4000, 10, node_name=name),
                        )
                    )
                for proc in [*replicas.values(), *refits]:
                    proc.start()
                for proc in [*replicas.values(), *refits]:
                    await proc.wait_ready()
                await wait_for(lambda: all_answer(client), within=3 * TTL)

                async def refit_loop(target: dict[str, Any]) -> None:
                    uid = target["metadata"]["uid"]
                    name = target["spec"]["nodeName"]
                    flip = False
                    while not stop.is_set():
                        flip = not flip
                        gpu_id = f"{name}-{'b' if flip else 'a'}"
                        body = orjson.dumps(refit_body(target, [gpu_id]))
                        try:
                            msg = await natsconn.request(nc, subjects.refit(name), body, 2.5)
                        except Exception as exc:  # a takeover or a lost broker: counted
                            errors.append(type(exc).__name__)
                            moved.pop(uid, None)  # it may or may not have landed
                            continue
                        code = str(orjson.loads(msg.data).get("code"))
                        if code == "moved":
                            moved[uid] = gpu_id  # the last answer for the pod: it must hold
                        else:
                            moved.pop(uid, None)
                            if code != "already_aligned":
                                errors.append(code)
                        await asyncio.sleep(0.02)  # a device plugin's pace, not a wait

                load = [asyncio.create_task(refit_loop(p)) for p in pods]
                for round_ in range(KILLS):
                    await asyncio.sleep(rng.uniform(0.2, 1.0))  # chaos timing
                    victim = rng.choice(sorted(replicas))
                    proc = replicas[victim]
                    killed_at = time.time()
                    proc.kill()
                    kills.append((victim, killed_at))
                    started = time.monotonic()
                    await wait_for(lambda: all_answer(client), within=6 * TTL)
                    took = time.monotonic() - started
                    (after_loss if broker_lost else takeovers).append(took)
                    # A new pod of the Deployment: a new name on odd rounds, the same (a
                    # container restart) on even ones.
                    if round_ % 2:
                        retired.append(proc)
                        fresh = f"acc-{REPLICAS + round_}"
                        del replicas[victim]
                        replicas[fresh] = accounting_replica(
                            cluster.url, kubeconfig, tmp_path, fresh
                        )
                        proc = replicas[fresh]
                    proc.start()
                    await proc.wait_ready()
                    broker_lost = False
                    if round_ == KILLS // 2:
                        cluster.kill(rng.randrange(3))  # one NATS server goes too
                        broker_lost = True  # the next takeover waits for JetStream too
                stop.set()
                await asyncio.gather(*load)
                # Everything served again; then the ledger must equal the annotations.
                await wait_for(lambda: all_answer(client), within=4 * TTL)

                async def consistent() -> bool:
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

                await wait_for(consistent, within=10)
                current = await list_pods(kube)

                async def exporters() -> dict[str, list[str]]:
                    """Per node, the scrapes of the replicas exporting its per-GPU gauges."""
                    found: dict[str, list[str]] = {name: [] for name in NODES}
                    for proc in replicas.values():
                        text = await proc.metrics()
                        for name in NODES:
                            series = f'numafit_accounting_device_memory_reserved_mib{{node="{name}"'
                            if series in text:
                                found[name].append(text)
                    return found

                async def exported_once() -> bool:
                    return all(len(texts) == 1 for texts in (await exporters()).values())

                # Exactly one replica, the one serving the node, exports its per-GPU gauges
                # (a rebalance after the last restart may still be handing partitions over),
                # and they equal the annotations.
                await wait_for(exported_once, within=10)
                for name, texts in (await exporters()).items():
                    assert len(texts) == 1, (name, len(texts))
                    gauges = nonzero(usage_from_metrics(texts[0], name))
                    k = partition_of(name, PARTITIONS)
                    assert gauges == nonzero(expected_usage(current, name)), (name, k)
            finally:
                stop.set()
                with contextlib.suppress(Exception):
                    await connection.close()
                stop_all([*refits, *replicas.values()])
                await kube.api.close()

    on_gpu = {
        p["metadata"]["uid"]: entry_devices(p["metadata"]["annotations"][keys.ALLOCATED])[0][0][0]
        for p in current
    }
    lost = {uid: (gpu_id, on_gpu[uid]) for uid, gpu_id in moved.items() if on_gpu[uid] != gpu_id}
    timeline = ownership([*replicas.values(), *retired], kills)
    print(
        f"\nkills {len(kills)}; takeover p50 {statistics.median(takeovers):.2f}s max "
        f"{max(takeovers):.2f}s (TTL {TTL}s); right after losing a NATS server "
        f"{[round(t, 2) for t in after_loss]}; refits moved {len(moved)} pods; failed refit "
        f"requests {len(errors)} ({sorted(set(errors))}); ownership changes "
        f"{timeline.changes()}, overlaps {len(timeline.overlaps())}"
    )
    assert lost == {}, f"moved replies that did not land: {lost}"
    assert timeline.overlaps() == []
    # A dead replica's keys expire a TTL after its last renewal (up to a third of a TTL before
    # the kill); the survivors take them at that moment and rebuild in milliseconds (measured:
    # p50 2.9 s, max 3.9 s over 20 kills). The bound leaves room for a loaded CI machine.
    assert max(takeovers) <= 2 * TTL
    assert all(t <= 3 * TTL for t in after_loss)
