"""The kubelet emulator against a small but real device plugin over gRPC unix sockets.

The plugin below is a genuine ``grpc.aio`` DevicePlugin server (ListAndWatch
streaming replicas ``<uuid>-<n>`` with NUMA topology, GetPreferredAllocation,
Allocate), so these tests exercise the same wire path the numafit device plugin
uses. Nothing sleeps: every wait is on a condition, bounded by asyncio.timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import grpc  # type: ignore[import-untyped, unused-ignore]
import pytest
from grpc import aio  # type: ignore[import-untyped, unused-ignore]

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared.core.model import ContainerKind
from shared.core.nrt import parse_nrt
from shared.core.numa_prediction import (
    ContainerDemand,
    NodeNuma,
    TopologyScope,
    predict_pod,
)
from shared.service.kube_io import KubeError
from shared.testing.kubelet_emulator import (
    ContainerAsk,
    DeviceAllocation,
    FreeDevice,
    KubeletConfig,
    KubeletEmulator,
    TopologyAffinityError,
    TopologyPolicy,
    TopologyPublisher,
    UnexpectedAdmissionError,
    is_extended_resource_name,
    main,
    parse_cpus,
    place,
)
from shared.testing.kubelet_emulator.ledger import ContainerKey, CpuLedger
from shared.testing.kubelet_emulator.placement import Placement, replicas_per_numa

RESOURCE = "nvidia.com/gpu"
GPUS = {"GPU-a": 0, "GPU-b": 1, "GPU-c": 1}  # uuid -> NUMA node
REPLICAS = 2  # replicas per GPU: NUMA 0 has 2, NUMA 1 has 4
WAIT = 5.0  # seconds; an upper bound for conditions, never a sleep

Advice = Callable[[api_pb2.ContainerPreferredAllocationRequest], Sequence[str]]


def last_available(request: api_pb2.ContainerPreferredAllocationRequest) -> Sequence[str]:
    """Default advice: the last replicas offered, so that honoured advice is visible."""
    return list(request.available_deviceIDs)[-request.allocation_size :]


class SampleDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """A minimal GPU-sharing device plugin serving ``<dir>/<endpoint>``."""

    def __init__(
        self,
        directory: Path,
        *,
        gpus: dict[str, int] = GPUS,
        endpoint: str = "sample.sock",
        preferred_allocation: bool = True,
    ) -> None:
        self.directory = directory
        self.endpoint = endpoint
        self.preferred_allocation = preferred_allocation
        self.advice: Advice = last_available
        self.allocate_error: str | None = None
        self.preferred_error: str | None = None
        self.preferred_requests: list[api_pb2.ContainerPreferredAllocationRequest] = []
        self.allocate_requests: list[list[str]] = []
        self.devices = [
            api_pb2.Device(
                ID=f"{uuid}-{n}",
                health="Healthy",
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]),
            )
            for uuid, numa in gpus.items()
            for n in range(REPLICAS)
        ]
        self._version = 0
        self._updated = asyncio.Condition()
        self._server: aio.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.directory / self.endpoint

    async def start(self) -> None:
        server = aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)

    async def register(self, *, version: str = "v1beta1", resource: str = RESOURCE) -> None:
        async with aio.insecure_channel(f"unix://{self.directory / 'kubelet.sock'}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=version, endpoint=self.endpoint, resource_name=resource
                )
            )

    async def restart(self) -> None:
        """What a plugin does when kubelet.sock is recreated: serve anew, register again."""
        await self.stop()
        await self.start()
        await self.register()

    async def publish(self, devices: list[api_pb2.Device]) -> None:
        async with self._updated:
            self.devices = devices
            self._version += 1
            self._updated.notify_all()

    def _newer_than(self, version: int) -> bool:
        return self._version != version

    # DevicePlugin service

    async def GetDevicePluginOptions(
        self,
        request: api_pb2.Empty,
        context: aio.ServicerContext[api_pb2.Empty, api_pb2.DevicePluginOptions],
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=self.preferred_allocation
        )

    async def ListAndWatch(
        self,
        request: api_pb2.Empty,
        context: aio.ServicerContext[api_pb2.Empty, api_pb2.ListAndWatchResponse],
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        while True:
            async with self._updated:
                await self._updated.wait_for(functools.partial(self._newer_than, sent))
                sent, devices = self._version, list(self.devices)
            yield api_pb2.ListAndWatchResponse(devices=devices)

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: aio.ServicerContext[
            api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse
        ],
    ) -> api_pb2.PreferredAllocationResponse:
        container = request.container_requests[0]
        self.preferred_requests.append(container)
        if self.preferred_error is not None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.preferred_error)
        advice = api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self.advice(container))
        return api_pb2.PreferredAllocationResponse(container_responses=[advice])

    async def Allocate(
        self,
        request: api_pb2.AllocateRequest,
        context: aio.ServicerContext[api_pb2.AllocateRequest, api_pb2.AllocateResponse],
    ) -> api_pb2.AllocateResponse:
        ids = list(request.container_requests[0].devices_ids)
        self.allocate_requests.append(ids)
        if self.allocate_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self.allocate_error)
        uuids = sorted({replica.rsplit("-", 1)[0] for replica in ids})
        container = api_pb2.ContainerAllocateResponse(
            envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)},
            mounts=[api_pb2.Mount(container_path="/usr/local/vgpu", host_path="/opt/vgpu")],
            devices=[api_pb2.DeviceSpec(container_path="/dev/nvidia0", host_path="/dev/nvidia0")],
        )
        return api_pb2.AllocateResponse(container_responses=[container])


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: unix socket paths must stay under ~107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_node(
    directory: Path,
    *,
    policy: TopologyPolicy = TopologyPolicy.SINGLE_NUMA_NODE,
    cpus: dict[int, int] | None = None,
    preferred_allocation: bool = True,
    topology: TopologyPublisher | None = None,
    seed: int = 0,
    version: str = "v1.31.0",
) -> AsyncIterator[tuple[KubeletEmulator, SampleDevicePlugin]]:
    """A kubelet with the sample plugin registered and its devices seen."""
    config = KubeletConfig(
        directory=directory,
        topology_policy=policy,
        cpus={0: 8, 1: 8} if cpus is None else cpus,
        dial_timeout=1.0,
        seed=seed,
        version=version,
    )
    plugin = SampleDevicePlugin(directory, preferred_allocation=preferred_allocation)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(plugin.stop)
        kubelet = await stack.enter_async_context(KubeletEmulator(config, topology))
        await plugin.start()
        await plugin.register()
        async with asyncio.timeout(WAIT):
            await kubelet.wait_for_devices(RESOURCE, len(plugin.devices))
        yield kubelet, plugin


def numa_of(replica: str) -> int:
    return GPUS[replica.rsplit("-", 1)[0]]


# ---------------------------------------------------------------------------- registration


async def test_registration_dials_back_and_sees_every_device(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, _plugin):
        devices = kubelet.devices(RESOURCE)

        assert kubelet.is_registered(RESOURCE)
        assert kubelet.registration_count(RESOURCE) == 1
        assert [(d.id, d.healthy, sorted(d.numa_nodes)) for d in devices] == [
            ("GPU-a-0", True, [0]),
            ("GPU-a-1", True, [0]),
            ("GPU-b-0", True, [1]),
            ("GPU-b-1", True, [1]),
            ("GPU-c-0", True, [1]),
            ("GPU-c-1", True, [1]),
        ]


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        ("v1alpha", RESOURCE, "requested API version 'v1alpha' is not supported by kubelet"),
        ("v1beta1", "gpu", "the ResourceName 'gpu' is invalid"),
        ("v1beta1", "kubernetes.io/gpu", "the ResourceName 'kubernetes.io/gpu' is invalid"),
    ],
)
async def test_register_refuses_bad_version_or_resource_name(
    sock_dir: Path, version: str, resource: str, message: str
) -> None:
    plugin = SampleDevicePlugin(sock_dir)
    async with KubeletEmulator(KubeletConfig(directory=sock_dir)) as kubelet:
        await plugin.start()
        try:
            with pytest.raises(aio.AioRpcError) as caught:
                await plugin.register(version=version, resource=resource)
        finally:
            await plugin.stop()

        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (caught.value.details() or "")
        assert not kubelet.is_registered(resource)
        assert kubelet.registration_count(resource) == 0


async def test_register_fails_when_the_plugin_socket_does_not_answer(sock_dir: Path) -> None:
    plugin = SampleDevicePlugin(sock_dir)  # never started: nothing serves its endpoint
    config = KubeletConfig(directory=sock_dir, dial_timeout=0.2)
    async with KubeletEmulator(config) as kubelet:
        with pytest.raises(aio.AioRpcError) as caught:
            await plugin.register()

        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "failed to dial device plugin 'sample.sock'" in (caught.value.details() or "")
        assert not kubelet.is_registered(RESOURCE)


def test_extended_resource_names() -> None:
    assert is_extended_resource_name("nvidia.com/gpu")
    assert is_extended_resource_name("example.com/gpu-mem")
    for name in (
        "gpu",
        "kubernetes.io/gpu",
        "foo.kubernetes.io/x",
        "Nvidia.com/gpu",
        "nvidia.com/",
        "nvidia.com/a/b",
        "requests.nvidia.com/gpu",
    ):
        assert not is_extended_resource_name(name), name


# ---------------------------------------------------------------------------- device lists


async def test_each_list_and_watch_message_replaces_the_device_list(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        remaining = [
            api_pb2.Device(
                ID=d.ID, health="Unhealthy" if d.ID == "GPU-a-0" else "Healthy", topology=d.topology
            )
            for d in plugin.devices[:3]
        ]
        await plugin.publish(remaining)

        async with asyncio.timeout(WAIT):
            await kubelet.wait_until(lambda: len(kubelet.devices(RESOURCE)) == 3)

        devices = kubelet.devices(RESOURCE)
        assert [(d.id, d.healthy) for d in devices] == [
            ("GPU-a-0", False),
            ("GPU-a-1", True),
            ("GPU-b-0", True),
        ]


async def test_plugin_stream_ending_marks_devices_unhealthy(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        await plugin.stop()

        async with asyncio.timeout(WAIT):
            await kubelet.wait_until(lambda: not kubelet.is_registered(RESOURCE))

        assert not any(d.healthy for d in kubelet.devices(RESOURCE))
        with pytest.raises(UnexpectedAdmissionError, match="cannot allocate unregistered device"):
            await kubelet.admit_container("pod-1", "main", gpu_count=1)


async def test_unhealthy_replicas_are_never_offered_or_allocated(sock_dir: Path) -> None:
    async with running_node(sock_dir, policy=TopologyPolicy.NONE) as (kubelet, plugin):
        await plugin.publish(
            [
                api_pb2.Device(
                    ID=d.ID,
                    health="Unhealthy" if d.ID.startswith("GPU-c-") else "Healthy",
                    topology=d.topology,
                )
                for d in plugin.devices
            ]
        )
        async with asyncio.timeout(WAIT):
            await kubelet.wait_until(
                lambda: sum(not d.healthy for d in kubelet.devices(RESOURCE)) == REPLICAS
            )

        admission = await kubelet.admit_container("pod-1", "main", gpu_count=4)

        offered = sorted(plugin.preferred_requests[0].available_deviceIDs)
        assert offered == ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1"]
        assert not any(replica.startswith("GPU-c-") for replica in admission.device_ids)
        with pytest.raises(UnexpectedAdmissionError, match="Requested: 1, Available: 0"):
            await kubelet.admit_container("pod-2", "main", gpu_count=1)
        assert not any(r.startswith("GPU-c-") for r in kubelet.allocations(RESOURCE))


# ---------------------------------------------------------------------------- admission


async def test_admission_picks_the_lowest_numa_node_fitting_cpus_and_gpus(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        first = await kubelet.admit_container("pod-1", "main", gpu_count=1, exclusive_cpus=4)
        second = await kubelet.admit_container("pod-2", "main", gpu_count=2, exclusive_cpus=2)
        third = await kubelet.admit_container("pod-3", "main", gpu_count=1, exclusive_cpus=6)

        # NUMA 0 fits the first; then it has 1 replica (second needs 2) and 4 CPUs (third needs 6).
        assert (first.cpu_numa, second.cpu_numa, third.cpu_numa) == (0, 1, 1)
        # The plugin's advice (the last replica offered) was taken.
        assert first.preferred_honoured and first.asked
        assert first.device_ids == (plugin.preferred_requests[0].available_deviceIDs[-1],)
        assert numa_of(first.device_ids[0]) == 0
        assert first.envs["NVIDIA_VISIBLE_DEVICES"] == first.device_ids[0].rsplit("-", 1)[0]
        assert first.response is not None
        assert [m.container_path for m in first.response.mounts] == ["/usr/local/vgpu"]
        assert [d.host_path for d in first.response.devices] == ["/dev/nvidia0"]
        assert {numa_of(i) for i in second.device_ids + third.device_ids} == {1}
        assert first.aligned and second.aligned and third.aligned

        offered = plugin.preferred_requests[1]
        assert sorted(offered.available_deviceIDs) == ["GPU-b-0", "GPU-b-1", "GPU-c-0", "GPU-c-1"]
        assert list(offered.must_include_deviceIDs) == []
        assert offered.allocation_size == 2
        assert plugin.allocate_requests == [
            list(first.device_ids),
            list(second.device_ids),
            list(third.device_ids),
        ]
        assert kubelet.free_cpus() == {0: 4, 1: 0}
        assert sorted(kubelet.allocations(RESOURCE)) == sorted(
            first.device_ids + second.device_ids + third.device_ids
        )


@pytest.mark.parametrize("policy", [TopologyPolicy.SINGLE_NUMA_NODE, TopologyPolicy.RESTRICTED])
@pytest.mark.parametrize(
    ("gpus", "cpus"),
    [
        pytest.param(5, 1, id="no-node-has-5-replicas"),
        pytest.param(1, 9, id="no-node-has-9-cpus"),
        pytest.param(3, 4, id="cpus-on-node-0-replicas-on-node-1"),
    ],
)
async def test_no_numa_node_fitting_is_a_topology_affinity_error(
    sock_dir: Path, policy: TopologyPolicy, gpus: int, cpus: int
) -> None:
    async with running_node(sock_dir, policy=policy, cpus={0: 8, 1: 2}) as (kubelet, plugin):
        with pytest.raises(TopologyAffinityError) as caught:
            await kubelet.admit_container("pod-1", "main", gpu_count=gpus, exclusive_cpus=cpus)

        assert caught.value.reason == "TopologyAffinityError"
        assert str(caught.value) == "Resources cannot be allocated with Topology locality"
        assert plugin.preferred_requests == []
        assert plugin.allocate_requests == []
        assert kubelet.allocations(RESOURCE) == {}
        assert kubelet.free_cpus() == {0: 8, 1: 2}


async def test_best_effort_admits_without_a_fitting_numa_node(sock_dir: Path) -> None:
    async with running_node(
        sock_dir, policy=TopologyPolicy.BEST_EFFORT, preferred_allocation=False
    ) as (kubelet, plugin):
        admission = await kubelet.admit_container("pod-1", "main", gpu_count=5, exclusive_cpus=2)

        assert not admission.aligned
        assert admission.cpu_numa == 1  # the node with the most free replicas
        assert admission.numa is None  # the affinity is every NUMA node
        assert len(set(admission.device_ids)) == 5
        assert set(admission.device_ids) <= {d.ID for d in plugin.devices}
        assert plugin.preferred_requests == []  # the plugin did not ask for the call
        assert kubelet.free_cpus() == {0: 8, 1: 6}


async def test_best_effort_without_a_fit_offers_every_free_replica(sock_dir: Path) -> None:
    # NUMA 0 has the CPUs, but only 2 replicas; NUMA 1 has no CPUs: nothing aligns, and
    # kubelet (best-effort) offers the plugin every free replica, whichever NUMA node.
    async with running_node(sock_dir, policy=TopologyPolicy.BEST_EFFORT, cpus={0: 8, 1: 0}) as (
        kubelet,
        plugin,
    ):
        plugin.advice = lambda r: ["GPU-b-0", "GPU-c-0", "GPU-c-1"]
        admission = await kubelet.admit_container("pod-1", "main", gpu_count=3, exclusive_cpus=4)

        assert sorted(plugin.preferred_requests[0].available_deviceIDs) == sorted(
            d.ID for d in plugin.devices
        )
        assert admission.cpu_numa == 0 and not admission.aligned
        assert sorted(admission.device_ids) == ["GPU-b-0", "GPU-c-0", "GPU-c-1"]
        assert admission.preferred_honoured


async def test_policy_none_offers_every_free_replica(sock_dir: Path) -> None:
    async with running_node(sock_dir, policy=TopologyPolicy.NONE, cpus={0: 2, 1: 8}) as (
        kubelet,
        plugin,
    ):
        admission = await kubelet.admit_container("pod-1", "main", gpu_count=2, exclusive_cpus=4)

        assert admission.cpu_numa == 1  # the lowest NUMA node with 4 free CPUs
        offered = plugin.preferred_requests[0]
        assert sorted(offered.available_deviceIDs) == sorted(d.ID for d in plugin.devices)
        assert sorted(admission.device_ids) == sorted(offered.available_deviceIDs[-2:])
        assert admission.preferred_honoured


async def test_offered_ids_come_unordered_but_reproducibly(sock_dir: Path) -> None:
    """kubelet hands the plugin Go sets (random order): the emulator shuffles them, seeded."""
    orders = []
    for seed in (0, 0, 1, 2, 3):
        async with running_node(sock_dir, policy=TopologyPolicy.NONE, seed=seed) as (
            kubelet,
            plugin,
        ):
            await kubelet.admit_container("pod-1", "main", gpu_count=1)
            orders.append(tuple(plugin.preferred_requests[0].available_deviceIDs))
    assert orders[0] == orders[1]  # the same seed, the same order
    assert len(set(orders)) > 2  # other seeds, other orders
    assert all(sorted(o) == sorted(orders[0]) for o in orders)


async def test_no_preference_call_when_the_aligned_replicas_exactly_cover_the_request(
    sock_dir: Path,
) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        # NUMA 0 has exactly 2 replicas: kubelet takes them without asking the plugin.
        admission = await kubelet.admit_container("pod-1", "main", gpu_count=2, exclusive_cpus=2)

        assert sorted(admission.device_ids) == ["GPU-a-0", "GPU-a-1"]
        assert not admission.asked and not admission.preferred_honoured
        assert plugin.preferred_requests == []
        assert plugin.allocate_requests == [list(admission.device_ids)]


@pytest.mark.parametrize(
    ("advice", "kept"),
    [
        pytest.param(lambda r: ["GPU-b-0", "GPU-b-0"], {"GPU-b-0"}, id="duplicates"),
        pytest.param(lambda r: ["GPU-b-0", "GPU-zz-9"], {"GPU-b-0"}, id="not-available"),
        pytest.param(lambda r: ["GPU-b-0", "GPU-a-0"], {"GPU-b-0"}, id="other-numa-node"),
        pytest.param(lambda r: ["GPU-b-0"], {"GPU-b-0"}, id="too-few"),
        pytest.param(lambda r: [], set(), id="none"),
    ],
)
async def test_kubelet_keeps_the_advice_inside_the_affinity_and_fills_the_rest(
    sock_dir: Path, advice: Advice, kept: set[str]
) -> None:
    # CPUs only on NUMA 1: its 4 replicas are the affinity, 2 are needed.
    async with running_node(sock_dir, cpus={0: 0, 1: 8}) as (kubelet, plugin):
        plugin.advice = advice

        admission = await kubelet.admit_container("pod-1", "main", gpu_count=2, exclusive_cpus=2)

        assert not admission.preferred_honoured
        assert len(set(admission.device_ids)) == 2
        assert kept <= set(admission.device_ids)
        assert {numa_of(d) for d in admission.device_ids} == {1}  # never outside the affinity


async def test_kubelet_picks_arbitrarily_when_the_plugin_prefers_nothing(sock_dir: Path) -> None:
    """Go's set order: with no advice kubelet's pick is not the first offered replica but an
    arbitrary one, the same for the same seed (the seed plays Go's randomness)."""
    picks = []
    for seed in (0, 0, *range(1, 12)):
        async with running_node(sock_dir, cpus={0: 0, 1: 8}, seed=seed) as (kubelet, plugin):
            plugin.advice = lambda r: []
            admission = await kubelet.admit_container(
                "pod-1", "main", gpu_count=1, exclusive_cpus=2
            )
            picks.append(admission.device_ids)
    assert picks[0] == picks[1]
    assert len(set(picks)) > 1
    assert {numa_of(p[0]) for p in picks} == {1}


async def test_allocate_error_is_unexpected_and_consumes_nothing(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        plugin.allocate_error = "device busy"

        with pytest.raises(UnexpectedAdmissionError) as caught:
            await kubelet.admit_container("pod-1", "main", gpu_count=1, exclusive_cpus=4)

        assert caught.value.reason == "UnexpectedAdmissionError"
        assert str(caught.value) == (
            "Allocate failed due to rpc error: code = Internal desc = device busy, "
            "which is unexpected"
        )
        assert kubelet.allocations(RESOURCE) == {}
        assert kubelet.free_cpus() == {0: 8, 1: 8}

        plugin.allocate_error = None
        admission = await kubelet.admit_container("pod-1", "main", gpu_count=1, exclusive_cpus=4)
        assert numa_of(admission.device_ids[0]) == 0


async def test_preferred_allocation_error_fails_admission(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        plugin.preferred_error = "numa-alignment strict: refit refused"

        with pytest.raises(UnexpectedAdmissionError) as caught:
            await kubelet.admit_container("pod-1", "main", gpu_count=1)

        # kubelet's own wording (devicemanager's callGetPreferredAllocationIfAvailable).
        assert caught.value.message == (
            "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: "
            "rpc error: code = FailedPrecondition desc = numa-alignment strict: refit refused, "
            "which is unexpected"
        )

        assert plugin.allocate_requests == []
        assert kubelet.allocations(RESOURCE) == {}


async def test_unknown_resource_and_readmission_are_refused(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, _plugin):
        with pytest.raises(
            UnexpectedAdmissionError, match=r"unregistered device example\.com/fpga"
        ):
            await kubelet.admit_container("pod-1", "main", resource="example.com/fpga")
        await kubelet.admit_container("pod-1", "main", gpu_count=1)
        with pytest.raises(ValueError, match="already admitted"):
            await kubelet.admit_container("pod-1", "main", gpu_count=1)


async def test_release_frees_devices_and_cpus(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, _plugin):
        await kubelet.admit_container("pod-1", "init", gpu_count=1, exclusive_cpus=4)
        await kubelet.admit_container("pod-1", "main", gpu_count=1, exclusive_cpus=4)
        with pytest.raises(TopologyAffinityError):
            await kubelet.admit_container("pod-2", "main", gpu_count=1, exclusive_cpus=12)

        await kubelet.release_pod("pod-1")

        assert kubelet.allocations(RESOURCE) == {}
        assert kubelet.free_cpus() == {0: 8, 1: 8}
        admission = await kubelet.admit_container("pod-2", "main", gpu_count=2, exclusive_cpus=8)
        assert admission.cpu_numa == 0


# ---------------------------------------------------------------------------- pod admission


async def test_a_pod_is_admitted_container_by_container_in_order(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, _plugin):
        result = await kubelet.admit_pod(
            "pod-1",
            [
                ContainerAsk("init", 1, 6),
                ContainerAsk("cpu-only", 0, 1),
                ContainerAsk("main", 1, 4),
            ],
        )

        assert result.error is None and result.failed_index is None
        assert [a.container_name for a in result.admitted] == ["init", "cpu-only", "main"]
        # init takes 6 of NUMA 0's 8 CPUs, so main (4) goes to NUMA 1.
        assert [a.cpu_numa for a in result.admitted] == [0, 0, 1]
        assert kubelet.free_cpus() == {0: 1, 1: 4}


async def test_a_refused_container_fails_the_pod_which_then_holds_nothing(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, _plugin):
        result = await kubelet.admit_pod(
            "pod-1", [ContainerAsk("first", 1, 4), ContainerAsk("huge", 1, 12)]
        )

        assert isinstance(result.error, TopologyAffinityError)
        assert result.failed_index == 1
        assert [a.container_name for a in result.admitted] == ["first"]
        assert kubelet.allocations(RESOURCE) == {}
        assert kubelet.free_cpus() == {0: 8, 1: 8}


class RecordingSink:
    """Where a TopologyPublisher writes: keeps every object (or fails every write)."""

    def __init__(self, fail: bool = False) -> None:
        self.objects: list[dict[str, object]] = []
        self.fail = fail

    async def publish(self, obj: object) -> object:
        if self.fail:
            raise KubeError("publish: 404 the server could not find the requested resource", 404)
        assert isinstance(obj, dict)
        self.objects.append(obj)
        return obj


def zone_figures(obj: dict[str, object]) -> dict[str, dict[str, tuple[str, str, str]]]:
    zones = obj["zones"]
    assert isinstance(zones, list)
    return {
        z["name"]: {
            r["name"]: (r["capacity"], r["allocatable"], r["available"]) for r in z["resources"]
        }
        for z in zones
    }


async def test_node_resource_topology_follows_every_admission_and_release(sock_dir: Path) -> None:
    sink = RecordingSink()
    clock = iter(float(t) for t in range(1_800_000_000, 1_800_000_100))
    publisher = TopologyPublisher(
        sink, "node-1", TopologyPolicy.SINGLE_NUMA_NODE, clock=lambda: next(clock)
    )
    async with running_node(sock_dir, topology=publisher) as (kubelet, _plugin):
        await kubelet.publish_topology()
        await kubelet.admit_pod("pod-1", [ContainerAsk("main", 2, 4)])  # NUMA 0: both replicas
        await kubelet.admit_pod("pod-2", [ContainerAsk("main", 1, 3)])  # NUMA 1
        await kubelet.release_pod("pod-1")

    assert len(sink.objects) == 4
    first, after_one, after_two, released = (zone_figures(o) for o in sink.objects)
    assert first == {
        "node-0": {"cpu": ("8", "8", "8"), RESOURCE: ("2", "2", "2")},
        "node-1": {"cpu": ("8", "8", "8"), RESOURCE: ("4", "4", "4")},
    }
    assert after_one["node-0"] == {"cpu": ("8", "8", "4"), RESOURCE: ("2", "2", "0")}
    assert after_two["node-1"] == {"cpu": ("8", "8", "5"), RESOURCE: ("4", "4", "3")}
    assert released["node-0"] == first["node-0"] and released["node-1"] == after_two["node-1"]
    last = parse_nrt(sink.objects[-1])
    assert (last.node, last.policy, last.scope) == (
        "node-1",
        TopologyPolicy.SINGLE_NUMA_NODE,
        TopologyScope.CONTAINER,
    )
    assert last.free_cpus == {0: 8, 1: 5}
    assert last.sampled_at == 1_800_000_003.0 == publisher.last_sampled_at


async def test_a_failing_write_does_not_fail_the_admission(sock_dir: Path) -> None:
    publisher = TopologyPublisher(RecordingSink(fail=True), "node-1", TopologyPolicy.NONE)
    async with running_node(sock_dir, topology=publisher) as (kubelet, _plugin):
        result = await kubelet.admit_pod("pod-1", [ContainerAsk("main", 1, 2)])

    assert result.error is None and len(result.admitted) == 1
    assert publisher.published == 0 and publisher.last_sampled_at is None


async def test_a_paused_publisher_writes_nothing(sock_dir: Path) -> None:
    sink = RecordingSink()
    publisher = TopologyPublisher(sink, "node-1", TopologyPolicy.SINGLE_NUMA_NODE)
    async with running_node(sock_dir, topology=publisher) as (kubelet, _plugin):
        await kubelet.admit_pod("pod-1", [ContainerAsk("main", 1, 2)])
        publisher.paused = True
        await kubelet.admit_pod("pod-2", [ContainerAsk("main", 1, 2)])

    assert len(sink.objects) == 1


# ---------------------------------------------------------------------------- restart


async def test_restart_removes_sockets_and_the_plugin_registers_again(sock_dir: Path) -> None:
    async with running_node(sock_dir) as (kubelet, plugin):
        admitted = await kubelet.admit_container("pod-1", "main", gpu_count=1, exclusive_cpus=2)
        checkpoint = sock_dir / "kubelet_internal_checkpoint"
        checkpoint.write_text("{}")

        removed = await kubelet.restart()

        assert "sample.sock" in removed  # kubelet.sock itself goes when its server stops
        assert not plugin.socket_path.exists()
        assert checkpoint.read_text() == "{}"
        assert stat.S_ISSOCK((sock_dir / "kubelet.sock").stat().st_mode)
        assert not kubelet.is_registered(RESOURCE)
        assert kubelet.devices(RESOURCE) == ()
        assert list(kubelet.allocations(RESOURCE)) == list(admitted.device_ids)

        await plugin.restart()
        async with asyncio.timeout(WAIT):
            await kubelet.wait_for_devices(RESOURCE, len(plugin.devices))

        assert kubelet.registration_count(RESOURCE) == 2
        again = await kubelet.admit_container("pod-2", "main", gpu_count=1, exclusive_cpus=2)
        # The other NUMA 0 replica: pod-1's is still held.
        assert numa_of(again.device_ids[0]) == 0 and again.device_ids != admitted.device_ids


# ---------------------------------------------------------------------------- pure parts


def test_placement_without_topology_imposes_no_numa_constraint() -> None:
    devices = [FreeDevice("x-0", frozenset()), FreeDevice("x-1", frozenset())]

    placement = place(
        TopologyPolicy.SINGLE_NUMA_NODE,
        free_cpus={0: 1, 1: 4},
        free_devices=devices,
        topology_aware=False,
        gpu_count=2,
        cpu_count=2,
    )

    assert (placement.numa, placement.cpu_numa) == (None, 1)
    assert (placement.in_affinity, placement.no_topology, placement.aligned) == (
        (),
        ("x-0", "x-1"),
        True,
    )


def test_more_devices_than_free_is_refused() -> None:
    placement = place(
        TopologyPolicy.NONE,
        free_cpus={0: 4},
        free_devices=[FreeDevice("x-0", frozenset({0}))],
        topology_aware=True,
        gpu_count=3,
        cpu_count=0,
    )
    with pytest.raises(UnexpectedAdmissionError, match="Requested: 3, Available: 1"):
        DeviceAllocation(RESOURCE, 3, (), placement, random.Random(0))


def allocation(
    required: int, reusable: Sequence[str] = (), seed: int = 0, **sets: tuple[str, ...]
) -> DeviceAllocation:
    placement = Placement(
        0,
        0,
        sets.get("inside", ()),
        sets.get("outside", ()),
        sets.get("no_topology", ()),
        True,
    )
    return DeviceAllocation(RESOURCE, required, reusable, placement, random.Random(seed))


def test_devices_to_allocate_follows_kubelets_steps() -> None:
    # Reusable replicas first: enough of them, and nothing is asked.
    reuse = allocation(1, reusable=["r-0"], inside=("a-0", "a-1"))
    assert reuse.ask is None and reuse.finish(None) == (("r-0",), False)
    assert reuse.reused == ("r-0",)
    # More inside the affinity than needed: ask about them; the answer inside is kept.
    ask = allocation(1, inside=("a-0", "a-1", "a-2"), outside=("b-0",))
    assert ask.ask is not None and sorted(ask.ask.available) == ["a-0", "a-1", "a-2"]
    assert ask.finish(["a-2"]) == (("a-2",), True)
    # Exactly covered by the affinity: taken without asking.
    exact = allocation(2, inside=("a-0", "a-1"), outside=("b-0",))
    assert exact.ask is None and sorted(exact.finish(None)[0]) == ["a-0", "a-1"]
    # Too few inside: they are all taken, then the plugin is asked about every free replica,
    # with them as must-include; the rest comes from outside, then from no topology.
    short = allocation(3, inside=("a-0",), outside=("b-0",), no_topology=("x-0",))
    assert short.ask is not None
    assert sorted(short.ask.available) == ["a-0", "b-0", "x-0"]
    assert short.ask.must_include == ("a-0",)
    assert sorted(short.finish(None)[0]) == ["a-0", "b-0", "x-0"]
    # Partial reuse: the reused replica is must-include and offered with the affinity.
    partial = allocation(2, reusable=["r-0"], inside=("a-0", "a-1"))
    assert partial.ask is not None and partial.ask.must_include == ("r-0",)
    assert sorted(partial.ask.available) == ["a-0", "a-1", "r-0"]
    assert partial.finish(["r-0", "a-1"]) == (("r-0", "a-1"), True)


def test_config_refuses_a_socket_path_too_long_for_unix_sockets() -> None:
    with pytest.raises(ValueError, match="longer than a unix socket path may be"):
        KubeletConfig(directory=Path("/tmp") / ("d" * 100))


def test_parse_cpus_and_cli_flag_errors() -> None:
    assert parse_cpus("0=32, 1=16") == {0: 32, 1: 16}
    assert parse_cpus("") == {}
    for bad in ("0", "0=x", "-1=4", "0=1,0=2"):
        with pytest.raises(ValueError, match=r"NUMA"):
            parse_cpus(bad)
    with pytest.raises(SystemExit) as caught:
        main(["--dir", "/tmp", "--cpus", "0=lots"])
    assert caught.value.code == 2


# ---------------------------------------------------------------------------- one rule


@pytest.mark.parametrize("policy", list(TopologyPolicy))
@pytest.mark.parametrize("seed", range(80))
def test_the_scheduler_predicts_exactly_what_the_emulator_admits(
    policy: TopologyPolicy, seed: int
) -> None:
    """The prediction (shared/core) and the emulator's placement decide alike, container by
    container, on the same free CPUs and replicas, init containers' CPUs and replicas reused by
    the containers after them as the emulator's pod admission reuses them: one rule, not two
    that could drift."""
    rng = random.Random(seed)
    cpus = {0: rng.randint(0, 12), 1: rng.randint(0, 12)}
    devices = [
        FreeDevice(f"GPU-{g}-{r}", frozenset({numa}))
        for g, numa in enumerate([0, 0, 1, 1])
        for r in range(rng.randint(0, 2))
    ]
    kinds = [ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP, ContainerKind.APP]
    demands = [
        ContainerDemand(f"c{i}", rng.choice(kinds), rng.choice([0, 0, 2, 4, 6]), rng.randint(0, 2))
        for i in range(rng.randint(1, 4))
    ]
    prediction = predict_pod(
        NodeNuma(policy, TopologyScope.CONTAINER, cpus, replicas_per_numa(devices), True), demands
    )
    ledger, free, reusable = CpuLedger(cpus), list(devices), set[str]()
    numa_of_id = {d.id: d.numa_nodes for d in devices}
    for position, demand in enumerate(demands):
        owner = ContainerKey("pod", demand.name)
        try:
            placement = place(
                policy,
                free_cpus=ledger.free(),
                free_devices=free,
                topology_aware=True,
                gpu_count=demand.gpus,
                cpu_count=demand.cpus,
                reusable_cpus=ledger.reusable("pod") if demand.cpus else None,
                reusable_devices=[FreeDevice(i, numa_of_id[i]) for i in sorted(reusable)]
                if demand.gpus
                else (),
            )
            taken: tuple[str, ...] = ()
            if demand.gpus:
                chosen = DeviceAllocation(RESOURCE, demand.gpus, reusable, placement, rng)
                taken, _ = chosen.finish(None)
        except (TopologyAffinityError, UnexpectedAdmissionError):
            # Refused by kubelet: predicted refused, unless only the emulator's device count
            # check refused it (too few replicas in all under a non-aligning policy).
            choice = prediction.choices[position]
            assert prediction.refused == demand or (
                choice is not None and not choice.verdict.refused
            )
            return
        choice = prediction.choices[position]
        if demand.gpus:
            assert choice is not None
            expected = placement.numa if placement.numa is not None else placement.cpu_numa
            assert choice.numa == expected
        free = [d for d in free if d.id not in taken]
        ledger.allocate(
            placement.cpu_numa, demand.cpus, owner, init=demand.kind is ContainerKind.INIT
        )
        if demand.kind is ContainerKind.INIT:
            reusable |= set(taken)
        else:
            reusable -= set(taken)
    assert prediction.refused is None
    assert ledger.free() == {
        n: cpus[n] - sum(c for m, c in prediction.cpus if m == n) for n in cpus
    }
