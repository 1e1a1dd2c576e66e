"""What the device plugin prefers when the reservation cannot be followed as it stands: distinct
GPUs for every container, a fallback that keeps the pod's own constraints, and an app container
that kubelet hands its init container's replicas without asking (device reuse).

The plugin is real (gRPC over a unix socket, a real nats-server, accounting and refit); kubelet
is the emulator, or, where kubelet's own sequence of calls is the point, the test itself
speaking kubelet's side of the device plugin API.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pytest
from grpc import aio

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared.core import keys
from shared.testing.kubelet_emulator import UnexpectedAdmissionError
from tests.builders import container
from tests.deviceplugin.stack import Stack, gpu, gpu_pod, node_stack
from tests.metrics import sample

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

REFITS = "numafit_deviceplugin_refits_total"
DRIFT = "numafit_accounting_allocation_drift_total"


def physical(replica: str) -> str:
    return replica.rsplit("-", 1)[0]


async def pod_annotations(stack: Stack, name: str) -> dict[str, str]:
    result: dict[str, str] = (await stack.h.pod("ml", name))["metadata"]["annotations"]
    return result


def drift(stack: Stack) -> float:
    assert stack.h.accounting is not None
    return sample(stack.h.accounting.metrics.registry, DRIFT, node="node-1")


@contextlib.asynccontextmanager
async def kubelet_side(stack: Stack) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
    """kubelet's client of the plugin's socket, for calls in kubelet's own order."""
    path = stack.plugin.allocator.config.socket_path
    async with aio.insecure_channel(f"unix://{path}") as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]


async def prefer(
    stub: api_pb2_grpc.DevicePluginStub, available: Sequence[str], size: int
) -> list[str]:
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), allocation_size=size
            )
        ]
    )
    response = await stub.GetPreferredAllocation(request)
    return list(response.container_responses[0].deviceIDs)


async def allocate(stub: api_pb2_grpc.DevicePluginStub, ids: Sequence[str]) -> dict[str, str]:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
    )
    response = await stub.Allocate(request)
    return dict(response.container_responses[0].envs)


def replicas(*uuids: str) -> list[str]:
    return [f"{uuid}-{n}" for uuid in uuids for n in range(10)]


# --- distinct GPUs ------------------------------------------------------------------------------

PAIR_GPUS = [gpu("GPU-a", 1, 0), gpu("GPU-d", 1, 1), gpu("GPU-b", 0, 2), gpu("GPU-c", 0, 3)]


def pair_pod() -> dict[str, Any]:
    # Reserved on NUMA 1's two GPUs, not opted in: no refit.
    return gpu_pod(
        "pair",
        "GPU-a,NVIDIA,10000,25:GPU-d,NVIDIA,10000,25:;",
        alignment=None,
        containers=[container("main", 2, 10000, 25)],
    )


async def test_a_two_gpu_pod_not_opted_in_is_preferred_two_distinct_gpus(
    nats_url: str, tmp_path: Path
) -> None:
    # Seen with a kubelet choosing on its own: two replicas of one GPU, and accounting's
    # consume refused `allocation names a GPU twice`, failing the pod.
    async with node_stack(nats_url, tmp_path, [pair_pod()], gpus=PAIR_GPUS) as stack:
        async with kubelet_side(stack) as stub:
            offered = replicas("GPU-b", "GPU-c")
            answer = await prefer(stub, offered, 2)
            assert len(answer) == 2 and set(answer) <= set(offered)
            assert len({physical(r) for r in answer}) == 2
            envs = await allocate(stub, answer)
        assert sorted(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == ["GPU-b", "GPU-c"]
        after = await pod_annotations(stack, "pair")
        assert sorted(after[keys.ALLOCATED].rstrip(":;").split(":")) == [
            "GPU-b,NVIDIA,10000,25",
            "GPU-c,NVIDIA,10000,25",
        ]
        assert after[keys.BIND_PHASE] == "success"
        assert sample(stack.plugin.metrics.registry, REFITS, mode="none", result="not_opted_in")


async def test_the_emulated_kubelet_runs_it_on_two_gpus(nats_url: str, tmp_path: Path) -> None:
    async with node_stack(nats_url, tmp_path, [pair_pod()], gpus=PAIR_GPUS) as stack:
        uid = await stack.uid("pair")
        admission = await stack.kubelet.admit_container(uid, "main", gpu_count=2, exclusive_cpus=2)
        assert admission.cpu_numa == 0 and admission.preferred_honoured
        assert sorted(physical(r) for r in admission.device_ids) == ["GPU-b", "GPU-c"]


# --- the fallback keeps the pod's own constraints ------------------------------------------------


async def test_a_best_effort_pod_pinned_to_a_gpu_kubelet_does_not_offer_is_refused(
    nats_url: str, tmp_path: Path
) -> None:
    # Seen on a real kubelet: pinned to GPU-3 by use-gpuuuid, CPUs on the other NUMA node,
    # the refit found nothing and the pod ran on kubelet's pick, a GPU it excluded.
    pinned = gpu_pod("pinned", "GPU-a,NVIDIA,20000,30:;")
    pinned["metadata"]["annotations"][keys.USE_UUID] = "GPU-a"
    async with node_stack(nats_url, tmp_path, [pinned]) as stack:
        uid = await stack.uid("pinned")
        with pytest.raises(UnexpectedAdmissionError) as caught:
            await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert "no GPU kubelet offers satisfies the pod: 1/1 CardUuidMismatch" in (
            caught.value.message
        )
        after = await pod_annotations(stack, "pinned")
        assert after[keys.BIND_PHASE] == "failed"
        assert after[keys.ALLOCATED] == "GPU-a,NVIDIA,20000,30:;"


THREE_GPUS = [gpu("GPU-a", 1, 0), gpu("GPU-b", 0, 1), gpu("GPU-c", 0, 2)]


def crowded(mem: int) -> list[dict[str, Any]]:
    # GPU-b (NUMA 0, 40000 MiB) holds 35000 MiB already; `late` is reserved on GPU-a (NUMA 1).
    return [
        gpu_pod(
            "big", "GPU-b,NVIDIA,35000,0:;", alignment=None, containers=[container("c", 1, 35000)]
        ),
        gpu_pod(
            "late",
            f"GPU-a,NVIDIA,{mem},30:;",
            bind_time=2,
            containers=[container("main", 1, mem, 30)],
        ),
    ]


async def test_an_unanswered_refit_falls_back_only_onto_a_gpu_with_room(
    nats_url: str, tmp_path: Path
) -> None:
    # No refit service: kubelet's NUMA 0 GPUs are judged on accounting's usage. GPU-b cannot
    # take 20000 MiB more, GPU-c can.
    async with node_stack(
        nats_url, tmp_path, crowded(20000), gpus=THREE_GPUS, with_refit=False
    ) as stack:
        async with kubelet_side(stack) as stub:
            await allocate(stub, await prefer(stub, replicas("GPU-b"), 1))  # big
            answer = await prefer(stub, replicas("GPU-b", "GPU-c"), 1)
            assert [physical(r) for r in answer] == ["GPU-c"]
            await allocate(stub, answer)
        assert (await pod_annotations(stack, "late"))[keys.ALLOCATED] == "GPU-c,NVIDIA,20000,30:;"
        assert (await pod_annotations(stack, "big"))[keys.ALLOCATED] == "GPU-b,NVIDIA,35000,0:;"
        registry = stack.plugin.metrics.registry
        assert sample(registry, REFITS, mode="best-effort", result="fallback") == 1
        assert sample(registry, "numafit_deviceplugin_preferences_total", source="fallback") == 1


async def test_an_unanswered_refit_with_no_gpu_that_has_room_is_refused(
    nats_url: str, tmp_path: Path
) -> None:
    async with node_stack(
        nats_url, tmp_path, crowded(20000), gpus=THREE_GPUS, with_refit=False
    ) as stack:
        async with kubelet_side(stack) as stub:
            await allocate(stub, await prefer(stub, replicas("GPU-b"), 1))  # big
            with pytest.raises(aio.AioRpcError) as caught:
                await prefer(stub, replicas("GPU-b"), 1)  # only the crowded GPU offered
        assert "no GPU kubelet offers satisfies the pod: 1/1 CardInsufficientMemory" in str(
            caught.value.details()
        )
        assert (await pod_annotations(stack, "late"))[keys.BIND_PHASE] == "failed"


# --- an app container given its init container's replicas ---------------------------------------


def init_then_app(alignment: str | None) -> dict[str, Any]:
    # The scheduler spread the init container (GPU-b, NUMA 0) and the app (GPU-a, NUMA 1).
    return gpu_pod(
        "train",
        "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;",
        alignment=alignment,
        init=[container("prep", 1, 30000, 60)],
    )


@pytest.mark.parametrize("alignment", [None, "strict"])
async def test_an_app_container_handed_its_init_containers_replica_is_no_drift(
    nats_url: str, tmp_path: Path, alignment: str | None
) -> None:
    # kubelet's device reuse: the app container's Allocate names the init container's replica,
    # with no GetPreferredAllocation before it.
    async with node_stack(nats_url, tmp_path, [init_then_app(alignment)]) as stack:
        async with kubelet_side(stack) as stub:
            replica = (await prefer(stub, replicas("GPU-b"), 1))[0]
            await allocate(stub, [replica])  # prep
            envs = await allocate(stub, [replica])  # main, on prep's replica
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"  # main's own amounts
        after = await pod_annotations(stack, "train")
        # The ledger records what runs, phase-aware: both on GPU-b, each with its amounts.
        assert after[keys.ALLOCATED] == "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;"
        assert after[keys.TO_ALLOCATE] == ";;" and after[keys.BIND_PHASE] == "success"
        assert drift(stack) == 0  # no AllocationDiffersFromReservation
        registry = stack.plugin.metrics.registry
        assert sample(registry, "numafit_deviceplugin_init_reuses_total", result="moved") == 1


async def test_the_emulated_kubelet_reuses_the_init_containers_replica(
    nats_url: str, tmp_path: Path
) -> None:
    from shared.core.model import ContainerKind
    from shared.testing.kubelet_emulator import ContainerAsk

    async with node_stack(nats_url, tmp_path, [init_then_app(None)]) as stack:
        uid = await stack.uid("train")
        result = await stack.kubelet.admit_pod(
            uid,
            [ContainerAsk("prep", 1, 2, kind=ContainerKind.INIT), ContainerAsk("main", 1, 2)],
        )
        assert result.error is None
        prep, main = result.admitted
        assert main.reused == prep.device_ids and not main.asked
        assert drift(stack) == 0
        after = await pod_annotations(stack, "train")
        assert after[keys.ALLOCATED] == "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;"
        assert stack.plugin.allocator.outcomes[(uid, 1)] == "reused"
