"""The chart's two accounting replicas on the real API server, one SIGKILLed while pods are
being scheduled: a pod was reserved and bound through the replica that dies, and is admitted
(consumed) through the survivor, which took the dead replica's partitions over and rebuilt them
from the annotations; every pod is bound and admitted, and the ledger equals the pods'
annotations, also after the replica comes back and takes its partitions again.

Pods arrive one at a time, each once the previous one was admitted, and none is created while
partitions change hands: kube-scheduler 1.28 parks a pod whose extender call failed (an Error,
or a refusal with no plugin named) until its five-minute flush or a node or pod-deletion event,
where 1.29 and later retry it with backoff (docs/development.md, "The real tier": what the real kube-scheduler does).
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from shared.accounting_client import AccountingUnavailable
from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()
NODES = 4
GPU_MIB = 30000
PODS = 12
MIB = 10000
KILL_AT = 4
RESTART_AT = 8
TAKEOVER_WITHIN = 60.0
"""Seconds for the survivor to serve the dead replica's partitions: their leases live 10 s."""
KEPT = ("hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated", "hami.io/bind-phase")


def exporter_of(numafit: NumafitStack, node: str) -> str | None:
    """The accounting replica exporting `node`'s per-GPU series (the one serving it)."""
    series = f'numafit_accounting_device_memory_reserved_mib{{node="{node}"'
    owners = [n for n in numafit.accounting_replicas() if series in numafit.metrics(n)]
    return owners[0] if len(owners) == 1 else None


def pods_of(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = plane.kubectl_json("get", "pods", "-n", namespace)["items"]
    return listed


def ledger_mismatch(
    plane: ControlPlane, numafit: NumafitStack, namespace: str, nodes: list[str]
) -> str | None:
    """Where accounting's ledger differs from the pods' annotations (None: nowhere): the pods
    it holds per node with their hami.io values, and the MiB its gauges count per GPU against
    the sum of the annotations' shares (summed here)."""
    pods = pods_of(plane, namespace)
    for node in nodes:
        here = [p for p in pods if p["spec"].get("nodeName") == node]
        held = cluster.ledger_pods(numafit, node)
        expected = {
            p["metadata"]["uid"]: {k: p["metadata"]["annotations"].get(k) for k in KEPT}
            for p in here
        }
        ledger = None if held is None else {u: {k: a.get(k) for k in KEPT} for u, a in held.items()}
        if ledger != expected:
            return f"{node}: ledger {ledger} != annotations {expected}"
        per_gpu: dict[str, float] = defaultdict(float)
        for p in here:
            for uuid, mib, _ in cluster.reserved_gpus(p, cluster.ALLOCATED):
                per_gpu[uuid] += mib
        gauges = {u: m for u, m in cluster.reserved_memory(numafit, node).items() if m}
        if gauges != per_gpu:
            return f"{node}: gauges {gauges} != annotations {dict(per_gpu)}"
    return None


def admit(numafit: NumafitStack, placed: dict[str, Any]) -> None:
    """kubelet's part (tests/real/cluster.py: allocate), again until accounting answers, as
    the device plugin retries a consume during a takeover."""

    def consumed() -> bool:
        try:
            cluster.allocate(numafit, placed)
        except (AccountingUnavailable, AssertionError):
            return False
        return True

    poll(consumed, within=TAKEOVER_WITHIN, what=f"{placed['metadata']['name']} admitted")


def test_a_replica_killed_while_pods_are_scheduled(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    group = cluster.unique("replicas")
    nodes = [f"{group}-{i}" for i in range(NODES)]
    for node in nodes:
        cluster.create_gpu_node(plane, numafit, node, group, [Gpu(f"GPU-{node}-0", 0, GPU_MIB)])
    namespace = cluster.new_namespace(plane, "replicas")
    killed = ""
    for i in range(PODS):
        name = f"p{i}"
        cluster.create(plane, cluster.gpu_pod(name, namespace, group, memory=MIB, cores=5))
        placed = cluster.bound(plane, namespace, name)
        if i == KILL_AT:
            # Reserved and bound through the replica serving its node; it dies before the
            # pod is admitted.
            owner = exporter_of(numafit, placed["spec"]["nodeName"])
            assert owner is not None
            killed = owner
            victim = numafit.children[killed]
            victim.signal(signal.SIGKILL)
            poll(lambda: not victim.alive(), within=10, what="replica dead")  # noqa: B023 - polled here, at once
        admit(numafit, placed)
        if i == KILL_AT:
            numafit.wait_settled(TAKEOVER_WITHIN)  # the survivor serves every partition
        if i == RESTART_AT:
            numafit.accounting_replica(int(killed.rsplit("-", 1)[1]))
            numafit.wait_settled()

    pods = pods_of(plane, namespace)
    assert len(pods) == PODS and all(p["spec"].get("nodeName") in nodes for p in pods)
    # Binpack filled the nodes in turn: three 10000 MiB shares per 30000 MiB GPU.
    assert sorted(Counter(p["spec"]["nodeName"] for p in pods).values()) == [3] * NODES
    poll(
        lambda: ledger_mismatch(plane, numafit, namespace, nodes) is None,
        within=30,
        what="the ledger equals the annotations",
        last=lambda: ledger_mismatch(plane, numafit, namespace, nodes),
    )
    total = sum(sum(cluster.reserved_memory(numafit, node).values()) for node in nodes)
    assert total == PODS * MIB
