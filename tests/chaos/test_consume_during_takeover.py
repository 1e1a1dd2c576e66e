"""Pods being admitted while the accounting replica serving their node is SIGKILLed (issue 20,
defect 5): two `numafit run accounting` processes share the node's one partition; kubelet's
GetPreferredAllocation is answered, then the owner dies and Allocate runs during the takeover.

Before, Allocate failed for good (`cannot record the allocation: accounting did not answer
...consume...`, or `node_unavailable`), since kubelet does not retry it. Now Allocate is answered
from the entry GetPreferredAllocation fetched, the consumption is journalled, and the surviving
replica records it once it serves the node. Two rounds: the owner killed before the consume
reached it, and killed while the consume's PATCH was held by the API server (the write commits
anyway, as a real API server's does when its client dies), so the consume sent again finds the
entry already consumed and must be acknowledged, not refused. Afterwards the ledger (snapshot
and gauges) equals what the pods' annotations add up to, summed here.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpc import aio

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared.core import keys
from shared.core.partitions import owner_of
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.kubelet_emulator import KubeletConfig, KubeletEmulator, TopologyPolicy
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import SimulatedBackend
from svc_deviceplugin.service import DevicePluginService
from svc_deviceplugin.settings import PluginOptions
from tests.chaos.support import (
    ServiceProcess,
    allocated_by_uid,
    create,
    expected_usage,
    gauges,
    kube_for,
    ledger_allocated,
    list_pods,
    nonzero,
    service,
    stop_all,
    usage_from_metrics,
)
from tests.deviceplugin.stack import DEFAULT_GPUS, RESOURCE, bare_node, gpu_pod
from tests.integration.harness import wait_for
from tests.metrics import sample
from tests.raw_accounting import RawAccounting

if TYPE_CHECKING:
    from nats.aio.client import Client

TTL = 3.0
REPLICAS = ("acc-0", "acc-1")
ENTRY = "GPU-b,NVIDIA,20000,30:;"
OWNED = "numafit_accounting_partitions_owned"


def replica(url: str, kubeconfig: Path, tmp_path: Path, name: str) -> ServiceProcess:
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
        "1",
        "--lease-ttl",
        str(TTL),
        "--lease-bucket",
        f"takeover-{tmp_path.name[-30:]}",
    )


async def owns(proc: ServiceProcess) -> bool:
    """`proc` serves the one partition (its gauge says so)."""
    try:
        text = await proc.metrics()
    except (OSError, AssertionError):
        return False
    return sum(gauges(text, OWNED).values()) == 1


def preference_request() -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=[f"GPU-b-{n}" for n in range(10)], allocation_size=1
            )
        ]
    )


def allocate_request(ids: list[str]) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )


async def test_pods_being_admitted_survive_an_accounting_takeover(
    nats_url: str, tmp_path: Path
) -> None:
    owner_name = owner_of(0, REPLICAS)
    assert owner_name is not None
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))  # unix socket paths are short
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        replicas = {n: replica(nats_url, kubeconfig, tmp_path, n) for n in REPLICAS}
        owner, survivor = (
            replicas[owner_name],
            next(p for n, p in replicas.items() if n != owner_name),
        )
        connection = await natsconn.connect(nats_url, "chaos-takeover")
        nc: Client = connection.client
        plugin_connection = await natsconn.connect(nats_url, "deviceplugin")
        plugin_nc: Client = plugin_connection.client
        client = RawAccounting(nc)
        kubelet = KubeletEmulator(
            KubeletConfig(
                directory=directory, topology_policy=TopologyPolicy.SINGLE_NUMA_NODE, cpus={0: 8}
            )
        )
        plugin = DevicePluginService(
            plugin_nc,
            PluginOptions(
                PluginConfig(
                    node="node-1",
                    directory=directory,
                    watch_interval=0.05,
                    state_dir=tmp_path / "plugin-state",
                ),
                SimulatedBackend(DEFAULT_GPUS),
            ),
        )
        registry = plugin.metrics.registry
        answers: dict[str, dict[str, str]] = {}
        try:
            await create(kube, "node", bare_node())
            first = await create(kube, "pod", gpu_pod("first", ENTRY, bind_time=1))
            second = await create(kube, "pod", gpu_pod("second", ENTRY, bind_time=2))
            for proc in replicas.values():
                proc.start()
            for proc in replicas.values():
                await proc.wait_ready()
            await wait_for(lambda: owns(owner), within=4 * TTL)
            await kubelet.start()
            await plugin.start()
            async with asyncio.timeout(15):
                await kubelet.wait_for_devices(RESOURCE, 20)
                await plugin.inventory_registered.wait()

            async with aio.insecure_channel(f"unix://{plugin.config.socket_path}") as channel:
                stub: Any = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]

                # Round 1: the owner dies between GetPreferredAllocation and Allocate.
                preferred = await stub.GetPreferredAllocation(preference_request())
                ids = list(preferred.container_responses[0].deviceIDs)
                assert ids and ids[0].startswith("GPU-b-")
                owner.kill()
                response = await stub.Allocate(allocate_request(ids))
                answers["first"] = dict(response.container_responses[0].envs)

                await wait_for(lambda: journal_entries(registry) == 0, within=10 * TTL)
                await wait_for(lambda: owns(survivor), within=4 * TTL)

                # The owner comes back (a container restart) and takes its partition back.
                owner.start()
                await owner.wait_ready()
                await wait_for(lambda: owns(owner), within=4 * TTL)
                await wait_for(lambda: not_owned_by(survivor), within=4 * TTL)

                # Round 2: the consume reaches the owner, whose PATCH the API server holds
                # (and commits although the owner is killed meanwhile).
                held = emulator.faults.add(
                    method="PATCH",
                    path_regex=r"/namespaces/ml/pods/second",
                    delay_s=1.0,
                    outlive_client=True,
                )
                preferred = await stub.GetPreferredAllocation(preference_request())
                ids = list(preferred.container_responses[0].deviceIDs)
                assert ids and ids[0].startswith("GPU-b-")
                allocating = asyncio.ensure_future(stub.Allocate(allocate_request(ids)))
                await wait_for(lambda: held.hits > 0 or allocating.done(), within=5)
                owner.kill()
                response = await allocating
                answers["second"] = dict(response.container_responses[0].envs)
                await wait_for(lambda: emulator.faults.in_flight == 0, within=5)
                await wait_for(lambda: journal_entries(registry) == 0, within=10 * TTL)

            async def view() -> tuple[Any, ...]:
                current = await list_pods(kube)
                return (
                    await ledger_allocated(client, "node-1"),
                    allocated_by_uid(current, "node-1"),
                    nonzero(usage_from_metrics(await survivor.metrics(), "node-1")),
                    nonzero(expected_usage(current, "node-1")),
                    current,
                )

            async def consistent() -> bool:
                ledger, annotated, exported, summed, _ = await view()
                return bool(ledger == annotated and exported == summed)

            await wait_for(consistent, within=10)
            ledger, annotated, exported, summed, current = await view()
        finally:
            await plugin.stop(1.0)
            await kubelet.stop()
            await plugin_connection.close()
            await connection.close()
            stop_all(replicas.values())
            await kube.api.close()
            shutil.rmtree(directory, ignore_errors=True)

    context = f"\n{owner.tail()}\n{survivor.tail()}"
    for name in ("first", "second"):
        envs = answers[name]
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b", (name, envs)
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
        assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    deferred = sum(
        sample(registry, "numafit_deviceplugin_consume_deferred_total", reason=reason)
        for reason in ("accounting_unavailable", "node_unavailable", "deadline_exceeded")
    )
    assert deferred == 2, context
    replays = "numafit_deviceplugin_consume_replays_total"
    # The second round's consume had landed: sent again, it is acknowledged, not refused.
    assert sample(registry, replays, result="recorded") == 2, context
    assert sample(registry, replays, result="dropped") == 0, context
    assert sample(registry, "numafit_deviceplugin_allocations_total", result="ok") == 2
    by_uid = {p["metadata"]["uid"]: p["metadata"]["annotations"] for p in current}
    for created in (first, second):
        notes = by_uid[created["metadata"]["uid"]]
        assert notes[keys.TO_ALLOCATE] == ";", notes  # consumed, once
        assert notes[keys.ALLOCATED] == ENTRY
        assert notes[keys.BIND_PHASE] == keys.PHASE_SUCCESS
    assert ledger == annotated, context
    assert exported == summed, context


def journal_entries(registry: Any) -> float:
    return sample(registry, "numafit_deviceplugin_consume_journal_entries")


async def not_owned_by(proc: ServiceProcess) -> bool:
    text = await proc.metrics()
    return sum(gauges(text, OWNED).values()) == 0
