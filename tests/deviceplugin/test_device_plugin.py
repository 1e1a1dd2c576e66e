"""The device plugin over real gRPC unix sockets with the kubelet emulator, a real nats-server,
accounting and refit: registration, alignment, refits in both modes, faults, Allocate."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc
import orjson
import pytest
from grpc import aio

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared import subjects
from shared.core import keys
from shared.testing.kubelet_emulator import TopologyPolicy, UnexpectedAdmissionError
from tests.builders import container
from tests.deviceplugin.stack import RESOURCE, Stack, gpu, gpu_pod, node_stack
from tests.integration.harness import wait_for
from tests.metrics import sample
from tests.raw_kube import raw

if TYPE_CHECKING:
    from pathlib import Path

WORKED = "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;"
REFITS = "numafit_deviceplugin_refits_total"
ALLOCATIONS = "numafit_deviceplugin_allocations_total"
REFIT_REQUESTS = "numafit_refit_requests_total"


def refits(stack: Stack, mode: str, result: str) -> float:
    return sample(stack.plugin.metrics.registry, REFITS, mode=mode, result=result)


def fallback_containers(stack: Stack) -> float:
    """The fallback gauge; its deprecated alias always reads the same."""
    registry = stack.plugin.metrics.registry
    value = sample(registry, "numafit_deviceplugin_fallback_containers")
    assert sample(registry, "numafit_deviceplugin_misaligned_containers") == value
    return value


async def pod_annotations(stack: Stack, name: str) -> dict[str, str]:
    result: dict[str, str] = (await stack.h.pod("ml", name))["metadata"]["annotations"]
    return result


async def test_registration_and_reregistration_after_kubelet_restart(
    nats_url: str, tmp_path: Path
) -> None:
    async with node_stack(nats_url, tmp_path, []) as stack:
        assert stack.kubelet.registration_count(RESOURCE) == 1
        devices = stack.kubelet.devices(RESOURCE)
        assert {d.id for d in devices} >= {"GPU-a-0", "GPU-b-9"}
        # The inventory reached the Node as HAMi's register annotation, through accounting.
        assert stack.h.kube is not None
        response = await raw(stack.h.kube.core.read_node("node-1", _preload_content=False))
        register = orjson.loads(
            orjson.loads(await response.read())["metadata"]["annotations"][keys.NODE_REGISTER]
        )
        assert [(d["id"], d["numa"], d["count"]) for d in register] == [
            ("GPU-a", 1, 10),
            ("GPU-b", 0, 10),
        ]
        removed = await stack.kubelet.restart()
        assert any(name.endswith("numafit-gpu.sock") for name in removed)
        async with asyncio.timeout(10):
            await stack.kubelet.wait_until(lambda: stack.kubelet.registration_count(RESOURCE) == 2)
            await stack.kubelet.wait_for_devices(RESOURCE, 20)


async def test_gpu_already_on_the_cpus_numa_node_needs_no_refit(
    nats_url: str, tmp_path: Path
) -> None:
    pods = [gpu_pod("local", "GPU-b,NVIDIA,20000,30:;")]
    async with node_stack(nats_url, tmp_path, pods) as stack:
        uid = await stack.uid("local")
        admission = await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=4)
        assert admission.cpu_numa == 0 and admission.device_ids[0].startswith("GPU-b-")
        assert admission.preferred_honoured
        assert admission.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        assert admission.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
        assert admission.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
        assert refits(stack, "best-effort", "no_mismatch") == 1
        after = await pod_annotations(stack, "local")
        assert after[keys.TO_ALLOCATE] == ";" and after[keys.BIND_PHASE] == "success"


@pytest.mark.parametrize("mode", ["best-effort", "strict"])
async def test_mismatch_is_refitted(nats_url: str, tmp_path: Path, mode: str) -> None:
    # The worked example: prep on GPU-b (consumed), main reserved on GPU-a (NUMA 1), but
    # kubelet pins main's CPUs to NUMA 0.
    pods = [gpu_pod("train", WORKED, alignment=mode, init=[container("prep", 1, 30000, 60)])]
    async with node_stack(nats_url, tmp_path, pods) as stack:
        uid = await stack.uid("train")
        prep = await stack.kubelet.admit_container(uid, "prep", gpu_count=1, exclusive_cpus=2)
        assert prep.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        main = await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert main.cpu_numa == 0 and main.preferred_honoured
        assert main.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        assert main.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
        assert refits(stack, mode, "moved") == 1
        after = await pod_annotations(stack, "train")
        assert after[keys.ALLOCATED] == "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;"
        assert after[keys.TO_ALLOCATE] == ";;" and after[keys.BIND_PHASE] == "success"


def crowded_pods(mode: str) -> list[dict[str, Any]]:
    # GPU-b (NUMA 0) is nearly full, so the refit of `late` (reserved on GPU-a) cannot fit.
    return [
        gpu_pod(
            "big", "GPU-b,NVIDIA,35000,0:;", alignment=None, containers=[container("c", 1, 35000)]
        ),
        gpu_pod("late", "GPU-a,NVIDIA,20000,30:;", alignment=mode, bind_time=2),
    ]


async def test_a_refused_best_effort_refit_never_falls_back_onto_a_full_gpu(
    nats_url: str, tmp_path: Path
) -> None:
    # Before: kubelet's own choice ran, GPU-b (40000 MiB) held 55000 MiB. Best-effort gives up
    # NUMA alignment, not the memory the container asked for.
    async with node_stack(nats_url, tmp_path, crowded_pods("best-effort")) as stack:
        big = await stack.uid("big")
        await stack.kubelet.admit_container(big, "c", gpu_count=1, exclusive_cpus=2)
        late = await stack.uid("late")
        with pytest.raises(UnexpectedAdmissionError) as caught:
            await stack.kubelet.admit_container(late, "main", gpu_count=1, exclusive_cpus=2)
        assert (
            "numa-alignment best-effort: no GPU kubelet offers satisfies the pod: "
            "1/1 CardInsufficientMemory" in caught.value.message
        )
        assert refits(stack, "best-effort", "fallback_refused") == 1
        assert fallback_containers(stack) == 0
        after = await pod_annotations(stack, "late")
        assert after[keys.BIND_PHASE] == "failed"
        assert after[keys.ALLOCATED] == "GPU-a,NVIDIA,20000,30:;"  # nothing moved or consumed
        assert stack.plugin.allocator.outcomes[(late, 0)] == "refused:no_fit"


async def test_refusal_fails_a_strict_pod(nats_url: str, tmp_path: Path) -> None:
    async with node_stack(nats_url, tmp_path, crowded_pods("strict")) as stack:
        big = await stack.uid("big")
        await stack.kubelet.admit_container(big, "c", gpu_count=1, exclusive_cpus=2)
        late = await stack.uid("late")
        with pytest.raises(
            UnexpectedAdmissionError, match="numa-alignment strict: no allowed device fits"
        ):
            await stack.kubelet.admit_container(late, "main", gpu_count=1, exclusive_cpus=2)
        assert refits(stack, "strict", "strict_failed") == 1
        after = await pod_annotations(stack, "late")
        assert after[keys.BIND_PHASE] == "failed"
        assert after[keys.ALLOCATED] == "GPU-a,NVIDIA,20000,30:;"  # nothing moved, nothing consumed


@pytest.mark.parametrize(("mode", "admitted"), [("best-effort", True), ("strict", False)])
async def test_no_responders(nats_url: str, tmp_path: Path, mode: str, admitted: bool) -> None:
    pods = [gpu_pod("p", "GPU-a,NVIDIA,20000,30:;", alignment=mode)]
    async with node_stack(nats_url, tmp_path, pods, with_refit=False) as stack:
        uid = await stack.uid("p")
        if admitted:
            admission = await stack.kubelet.admit_container(
                uid, "main", gpu_count=1, exclusive_cpus=2
            )
            assert admission.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
            assert refits(stack, mode, "fallback") == 1
        else:
            with pytest.raises(UnexpectedAdmissionError, match="no refit service answers"):
                await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
            assert refits(stack, mode, "strict_failed") == 1


async def silent_refit(stack: Stack, reply: dict[str, Any] | None) -> None:
    """A refit responder that never answers (reply None) or answers `reply`."""
    assert stack.h.client_nc is not None

    async def handler(msg: Any) -> None:
        if reply is not None:
            await msg.respond(orjson.dumps(reply))

    await stack.h.client_nc.subscribe(
        subjects.REFIT_WILDCARD, queue=subjects.REFIT_QUEUE, cb=handler
    )
    await stack.h.client_nc.flush()


@pytest.mark.parametrize(("mode", "admitted"), [("best-effort", True), ("strict", False)])
async def test_refit_timeout(nats_url: str, tmp_path: Path, mode: str, admitted: bool) -> None:
    pods = [gpu_pod("p", "GPU-a,NVIDIA,20000,30:;", alignment=mode)]
    async with node_stack(
        nats_url, tmp_path, pods, with_refit=False, refit_timeout_ms=200
    ) as stack:
        await silent_refit(stack, None)
        uid = await stack.uid("p")
        if admitted:
            await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        else:
            with pytest.raises(
                UnexpectedAdmissionError,
                match=r"refit timed out: no answer within this call.s 200 ms budget",
            ):
                await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert refits(stack, mode, "timeout") == 1


@pytest.mark.parametrize("mode", ["best-effort", "strict"])
async def test_committed_but_unmappable_fails_in_both_modes(
    nats_url: str, tmp_path: Path, mode: str
) -> None:
    pods = [gpu_pod("p", "GPU-a,NVIDIA,20000,30:;", alignment=mode)]
    async with node_stack(nats_url, tmp_path, pods, with_refit=False) as stack:
        # "Moved" to a GPU kubelet does not offer on this NUMA node.
        await silent_refit(
            stack,
            {"succeeded": True, "code": "moved", "containerDevices": "GPU-a,NVIDIA,20000,30:"},
        )
        uid = await stack.uid("p")
        with pytest.raises(
            UnexpectedAdmissionError, match="numa refit committed but kubelet cannot honor"
        ):
            await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert refits(stack, mode, "unmappable") == 1
        assert (await pod_annotations(stack, "p"))[keys.BIND_PHASE] == "failed"


async def test_pod_that_did_not_opt_in_is_not_refitted(nats_url: str, tmp_path: Path) -> None:
    pods = [gpu_pod("p", "GPU-a,NVIDIA,20000,30:;", alignment=None)]
    async with node_stack(nats_url, tmp_path, pods) as stack:
        uid = await stack.uid("p")
        admission = await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert admission.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"  # kubelet's pick, followed
        assert refits(stack, "none", "not_opted_in") == 1
        assert stack.h.refit is not None
        moved = sample(
            stack.h.refit.metrics.registry, REFIT_REQUESTS, code="moved", mode="best-effort"
        )
        assert moved == 0


async def test_allocate_environment_for_two_gpus(nats_url: str, tmp_path: Path) -> None:
    gpus = [gpu("GPU-c", 0, 0), gpu("GPU-d", 0, 1), gpu("GPU-e", 1, 2)]
    pods = [
        gpu_pod(
            "pair",
            "GPU-c,NVIDIA,10000,25:GPU-d,NVIDIA,10000,25:;",
            containers=[container("main", 2, 10000, 25)],
        )
    ]
    async with node_stack(nats_url, tmp_path, pods, gpus=gpus) as stack:
        uid = await stack.uid("pair")
        admission = await stack.kubelet.admit_container(uid, "main", gpu_count=2, exclusive_cpus=2)
        envs = admission.envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-c,GPU-d"
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10000m"
        assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "10000m"
        assert envs["CUDA_DEVICE_SM_LIMIT"] == "25"
        assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == f"/tmp/vgpu/{uid}_main.cache"
        assert admission.response is not None
        mounts = {m.container_path: (m.host_path, m.read_only) for m in admission.response.mounts}
        assert mounts["/usr/local/vgpu/libvgpu.so"] == ("/usr/local/vgpu/libvgpu.so", True)
        assert mounts["/etc/ld.so.preload"] == ("/usr/local/vgpu/ld.so.preload", True)
        assert mounts["/tmp/vgpu"] == (f"/tmp/vgpu/containers/{uid}_main", False)


async def call_allocate(stack: Stack, ids: list[str]) -> Any:
    path = stack.plugin.config.socket_path
    async with aio.insecure_channel(f"unix://{path}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        return await stub.Allocate(request)


async def test_bad_allocations_get_clear_errors_and_the_plugin_keeps_serving(
    nats_url: str, tmp_path: Path
) -> None:
    pods = [gpu_pod("p", "GPU-b,NVIDIA,20000,30:;")]
    async with node_stack(nats_url, tmp_path, pods) as stack:
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await call_allocate(stack, ["GPU-zzz-0"])
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as too_many:
            await call_allocate(stack, ["GPU-b-0", "GPU-a-0"])
        assert "does not match the pending entry" in str(too_many.value.details())
        registry = stack.plugin.metrics.registry
        assert sample(registry, ALLOCATIONS, result="unknown_device") == 1
        # Accounting unreachable: a clear error, then service again once it is back.
        assert stack.h.accounting is not None
        await stack.h.accounting.stop(1.0)
        with pytest.raises(grpc.aio.AioRpcError) as unreachable:
            await call_allocate(stack, ["GPU-b-0"])
        assert "cannot record the allocation" in str(unreachable.value.details())
        await stack.h.start_accounting()
        uid = await stack.uid("p")
        admission = await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert admission.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"


async def test_policy_none_offers_every_gpu(nats_url: str, tmp_path: Path) -> None:
    pods = [gpu_pod("p", "GPU-a,NVIDIA,20000,30:;")]
    async with node_stack(nats_url, tmp_path, pods, policy=TopologyPolicy.NONE) as stack:
        uid = await stack.uid("p")
        admission = await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        assert admission.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
        assert refits(stack, "best-effort", "no_mismatch") == 1


async def test_pod_whose_annotations_do_not_decode_is_never_handed_devices(
    nats_url: str, tmp_path: Path
) -> None:
    pods = [gpu_pod("broken", "GPU-b,NVIDIA,lots,30:;")]
    async with node_stack(nats_url, tmp_path, pods) as stack:
        uid = await stack.uid("broken")
        with pytest.raises(UnexpectedAdmissionError, match="no pod waiting for allocation"):
            await stack.kubelet.admit_container(uid, "main", gpu_count=1, exclusive_cpus=2)
        # The plugin still serves the next pod.
        await stack.h.create("pod", gpu_pod("fine", "GPU-b,NVIDIA,1000,10:;", bind_time=2))

        async def tracked() -> bool:
            pending = await stack.h.client.call("pending", "node-1", {})
            return bool(pending["pod"] and pending["pod"]["name"] == "fine")

        await wait_for(tracked)
        admission = await stack.kubelet.admit_container(
            await stack.uid("fine"), "main", gpu_count=1, exclusive_cpus=2
        )
        assert admission.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"


async def test_per_pod_state_is_dropped_once_accounting_forgets_the_pod(
    nats_url: str, tmp_path: Path
) -> None:
    # No refit service: the best-effort pod falls back onto GPU-b, which has room for it.
    pods = [gpu_pod("late", "GPU-a,NVIDIA,20000,30:;")]
    async with node_stack(nats_url, tmp_path, pods, with_refit=False) as stack:
        late = await stack.uid("late")
        await stack.kubelet.admit_container(late, "main", gpu_count=1, exclusive_cpus=2)
        allocator = stack.plugin.allocator
        assert (late, 0) in allocator.outcomes and allocator.fallback_containers
        assert fallback_containers(stack) == 1
        allocator.forget_pods(alive=set())
        assert (late, 0) not in allocator.outcomes and not allocator.fallback_containers
        assert fallback_containers(stack) == 0
