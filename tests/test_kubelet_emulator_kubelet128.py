"""The kubelet emulator where it once differed from a real kubelet v1.28.7 (observed, see
../shared/k8s/README.md): reuse of init containers' devices and exclusive CPUs, Burstable pods,
kubelet's status fields, and the init-container resource rejection of kubelets before v1.31.

Driven over real gRPC against the sample device plugin of tests/test_kubelet_emulator.py.
Nothing sleeps: every wait is on a condition, bounded by asyncio.timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shared.core.model import ContainerKind
from shared.testing.kubelet_emulator import (
    ContainerAsk,
    KubeletConfig,
    KubeletEmulator,
    OutOfResourceError,
    TopologyAffinityError,
    TopologyPolicy,
    UnexpectedAdmissionError,
    container_asks,
    rejected_status,
)
from tests.test_kubelet_emulator import RESOURCE, WAIT, SampleDevicePlugin, numa_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

INIT, SIDECAR, APP = ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def node(
    directory: Path,
    *,
    cpus: dict[int, int] | None = None,
    policy: TopologyPolicy = TopologyPolicy.SINGLE_NUMA_NODE,
    version: str = "v1.31.0",
) -> AsyncIterator[tuple[KubeletEmulator, SampleDevicePlugin]]:
    config = KubeletConfig(
        directory=directory,
        topology_policy=policy,
        cpus={0: 8, 1: 8} if cpus is None else cpus,
        dial_timeout=1.0,
        version=version,
    )
    plugin = SampleDevicePlugin(directory)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(plugin.stop)
        kubelet = await stack.enter_async_context(KubeletEmulator(config))
        await plugin.start()
        await plugin.register()
        async with asyncio.timeout(WAIT):
            await kubelet.wait_for_devices(RESOURCE, len(plugin.devices))
        yield kubelet, plugin


def manifest(
    *,
    init: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "uid": "uid-1"},
        "spec": {"initContainers": init or [], "containers": containers},
    }


def spec(name: str, *, gpus: int = 1, cpu: str = "2", memory: str | None = "1Gi") -> dict[str, Any]:
    """A container; with CPU and memory limits (the default) its pod is Guaranteed."""
    limits: dict[str, Any] = {"nvidia.com/gpu": str(gpus), "cpu": cpu}
    if memory is not None:
        limits["memory"] = memory
    return {"name": name, "image": "x", "resources": {"limits": limits}}


# --- reuse of an init container's devices and CPUs ------------------------------------------


async def test_the_app_container_runs_on_its_init_containers_replica_without_being_asked(
    sock_dir: Path,
) -> None:
    async with node(sock_dir) as (kubelet, plugin):
        result = await kubelet.admit_pod(
            "pod-1", [ContainerAsk("prep", 1, 2, kind=INIT), ContainerAsk("main", 1, 2)]
        )

        assert result.error is None
        prep, main = result.admitted
        # One GetPreferredAllocation (the init container's); the app container's Allocate
        # names the very replica its init container had.
        assert len(plugin.preferred_requests) == 1
        assert main.device_ids == prep.device_ids and main.reused == prep.device_ids
        assert not main.asked and prep.asked
        assert plugin.allocate_requests == [list(prep.device_ids), list(prep.device_ids)]
        # Held once, by the pod.
        assert list(kubelet.allocations(RESOURCE)) == list(prep.device_ids)


async def test_an_app_container_reuses_its_init_containers_only_exclusive_cpu(
    sock_dir: Path,
) -> None:
    # One exclusive CPU on the node (as with reservedSystemCPUs: "0" on a 2-CPU machine): the
    # static policy hands the init container's CPU to the app container, and kubelet runs the
    # pod (the emulator once refused it with TopologyAffinityError).
    async with node(sock_dir, cpus={0: 0, 1: 1}) as (kubelet, _plugin):
        result = await kubelet.admit_pod(
            "pod-1", [ContainerAsk("prep", 1, 1, kind=INIT), ContainerAsk("main", 1, 1)]
        )

        assert result.error is None
        assert [a.cpu_numa for a in result.admitted] == [1, 1]
        assert kubelet.free_cpus() == {0: 0, 1: 0}
        await kubelet.release_pod("pod-1")
        assert kubelet.free_cpus() == {0: 0, 1: 1}


async def test_a_sidecars_devices_and_cpus_are_not_reused(sock_dir: Path) -> None:
    async with node(sock_dir, cpus={0: 0, 1: 1}) as (kubelet, _plugin):
        result = await kubelet.admit_pod(
            "pod-1", [ContainerAsk("proxy", 1, 1, kind=SIDECAR), ContainerAsk("main", 1, 1)]
        )

        assert isinstance(result.error, TopologyAffinityError)  # main has no CPU of its own
        assert result.failed_index == 1
        assert kubelet.allocations(RESOURCE) == {} and kubelet.free_cpus() == {0: 0, 1: 1}
    async with node(sock_dir) as (kubelet, _plugin):
        result = await kubelet.admit_pod(
            "pod-2", [ContainerAsk("proxy", 1, 0, kind=SIDECAR), ContainerAsk("main", 1, 0)]
        )
        proxy, main = result.admitted
        assert not main.reused
        assert set(main.device_ids).isdisjoint(proxy.device_ids)


async def test_an_app_needing_more_than_its_init_container_held_is_asked_for_the_rest(
    sock_dir: Path,
) -> None:
    async with node(sock_dir, cpus={0: 0, 1: 8}) as (kubelet, plugin):
        result = await kubelet.admit_pod(
            "pod-1", [ContainerAsk("prep", 1, 2, kind=INIT), ContainerAsk("main", 2, 2)]
        )

        prep, main = result.admitted
        second = plugin.preferred_requests[1]
        assert list(second.must_include_deviceIDs) == list(prep.device_ids)
        assert set(prep.device_ids) < set(second.available_deviceIDs)
        assert set(prep.device_ids) < set(main.device_ids) and len(main.device_ids) == 2
        assert {numa_of(d) for d in main.device_ids} == {1}


# --- Burstable pods ------------------------------------------------------------------------


async def test_a_burstable_pod_gets_no_exclusive_cpus_only_its_gpus_follow_the_hint(
    sock_dir: Path,
) -> None:
    burstable = manifest(containers=[spec("main", cpu="4", memory=None)])
    guaranteed = manifest(containers=[spec("main", cpu="4")])
    assert [a.exclusive_cpus for a in container_asks(burstable)] == [0]
    assert [a.exclusive_cpus for a in container_asks(guaranteed)] == [4]
    async with node(sock_dir, cpus={0: 8, 1: 8}) as (kubelet, _plugin):
        result = await kubelet.admit_pod("pod-1", container_asks(burstable))

        (main,) = result.admitted
        assert main.cpu_numa is None and main.exclusive_cpus == 0  # Cpus_allowed: all
        assert main.numa == 0 and numa_of(main.device_ids[0]) == 0
        assert kubelet.free_cpus() == {0: 8, 1: 8}


def test_container_asks_follow_kubelets_order_and_kinds() -> None:
    pod = manifest(
        init=[spec("prep"), {**spec("proxy"), "restartPolicy": "Always"}],
        containers=[spec("main", gpus=2)],
    )
    asks = container_asks(pod)
    assert [(a.name, a.kind, a.gpu_count, a.exclusive_cpus) for a in asks] == [
        ("prep", INIT, 1, 2),
        ("proxy", SIDECAR, 1, 2),
        ("main", APP, 2, 2),
    ]


# --- what kubelet writes -------------------------------------------------------------------


async def test_a_refused_preference_is_reported_as_kubelet_reports_it(sock_dir: Path) -> None:
    async with node(sock_dir) as (kubelet, plugin):
        plugin.preferred_error = "numa-alignment strict: no allowed device fits"
        pod = manifest(containers=[spec("main", cpu="2")])
        result = await kubelet.admit_pod("uid-1", container_asks(pod))

    error = result.error
    assert isinstance(error, UnexpectedAdmissionError)
    assert error.message == (
        "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: "
        "rpc error: code = FailedPrecondition desc = numa-alignment strict: no allowed device "
        "fits, which is unexpected"
    )
    status = rejected_status(pod, error)
    assert status["phase"] == "Failed" and status["reason"] == "UnexpectedAdmissionError"
    assert status["message"] == "Pod was rejected: " + error.message
    assert status["containerStatuses"] == [
        {
            "name": "main",
            "image": "x",
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "lastState": {},
            "state": {
                "terminated": {
                    "exitCode": 137,
                    "reason": "ContainerStatusUnknown",
                    "message": "The container could not be located when the pod was terminated",
                }
            },
        }
    ]


def test_a_topology_affinity_error_writes_no_container_statuses() -> None:
    status = rejected_status(manifest(containers=[spec("main")]), TopologyAffinityError())
    assert status == {
        "phase": "Failed",
        "reason": "TopologyAffinityError",
        "message": "Pod was rejected: Resources cannot be allocated with Topology locality",
    }


# --- init containers asking for extended resources no plugin advertises --------------------


def gpumem_init_pod() -> dict[str, Any]:
    prep = spec("prep", cpu="2")
    prep["resources"]["limits"].update({"nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"})
    main = spec("main", cpu="2")
    main["resources"]["limits"].update({"nvidia.com/gpumem": "10000"})
    return manifest(init=[prep], containers=[main])


async def test_kubelet_1_28_rejects_init_containers_asking_for_gpumem_after_the_plugin_ran(
    sock_dir: Path,
) -> None:
    pod = gpumem_init_pod()
    async with node(sock_dir, version="v1.28.7") as (kubelet, plugin):
        result = await kubelet.admit_pod("uid-1", container_asks(pod))

        error = result.error
        assert isinstance(error, OutOfResourceError)
        assert error.reason == "OutOfnvidia.com/gpucores"
        assert error.message == (
            "Node didn't have enough resource: nvidia.com/gpucores, requested: 30, used: 0, "
            "capacity: 0"
        )
        # The device plugin had been called for both containers already; nothing is held now.
        assert len(plugin.allocate_requests) == 2 and len(result.admitted) == 2
        assert result.failed_index is None
        assert kubelet.allocations(RESOURCE) == {} and kubelet.free_cpus() == {0: 8, 1: 8}
        status = rejected_status(pod, error)
        assert status["reason"] == "OutOfnvidia.com/gpucores"
        assert status["message"].startswith("Pod was rejected: Node didn't have enough resource")
        assert "containerStatuses" not in status


@pytest.mark.parametrize("version", ["v1.31.0", "v1.33.2", "v1.31.0-eks-1"])
async def test_kubelet_1_31_strips_them_from_init_containers_too(
    sock_dir: Path, version: str
) -> None:
    async with node(sock_dir, version=version) as (kubelet, _plugin):
        result = await kubelet.admit_pod("uid-1", container_asks(gpumem_init_pod()))
    assert result.error is None and len(result.admitted) == 2
