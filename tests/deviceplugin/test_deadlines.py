"""One deadline per kubelet call: GetPreferredAllocation and Allocate end within
`--refit-timeout-ms` plus a small fixed margin on every path, however slow or silent accounting
and the refit service are; the refit's `timeoutMs` is what is left of the call.

Accounting and the refit service are fakes on a real nats-server (they answer late, never, or
with chosen replies); the last tests use the real services with the API emulator slowed down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import orjson
import pytest
from grpc import aio

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared import subjects
from shared.core import keys
from shared.service import natsconn
from shared.testing.kubelet_emulator import KubeletConfig, KubeletEmulator, TopologyPolicy
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import SimulatedBackend
from svc_deviceplugin.service import DevicePluginService
from svc_deviceplugin.settings import PluginOptions
from tests.deviceplugin.stack import DEFAULT_GPUS, RESOURCE, Stack, gpu_pod, node_stack
from tests.integration.harness import wait_for
from tests.metrics import sample

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from nats.aio.client import Client
    from nats.aio.msg import Msg

NODE = "deadline-node"
MARGIN = 0.25
"""Seconds a call may take beyond its budget (the brief's fixed margin)."""
SILENT = None
"""A fake's delay that means: never answer."""
ALLOCATIONS = "numafit_deviceplugin_allocations_total"

PENDING_POD = {
    "uid": "uid-1",
    "namespace": "ml",
    "name": "p",
    "numaAlignment": "strict",
    # Reserved on GPU-a (NUMA 1); kubelet only offers GPU-b (NUMA 0): a mismatch.
    "entries": [{"index": 0, "containerName": "main", "devices": "GPU-a,NVIDIA,20000,30:"}],
}
CONSUMED = {
    "ok": True,
    "code": "ok",
    "podUID": "uid-1",
    "podNamespace": "ml",
    "podName": "p",
    "containerIndex": 0,
    "containerName": "main",
    "containerDevices": "GPU-b,NVIDIA,20000,30:",
    "drifted": False,
}


@dataclass
class Fake:
    """A NATS responder per subject: replies in order (the last one repeats), each after
    `delay` seconds, or never (`delay` None). Every request body is kept."""

    replies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    delays: dict[str, float | None] = field(default_factory=dict)
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, nc: Client, name: str, subject: str) -> None:
        async def handler(msg: Msg) -> None:
            self.requests[name].append(orjson.loads(msg.data))
            task = asyncio.create_task(self._answer(name, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        await nc.subscribe(subject, cb=handler)

    async def _answer(self, name: str, msg: Msg) -> None:
        delay = self.delays.get(name, 0.0)
        if delay is None:
            return
        await asyncio.sleep(delay)  # the fake's own slowness, not a wait in the test
        queue = self.replies.get(name) or [{"ok": True, "code": "ok"}]
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        await msg.respond(orjson.dumps(reply))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Node:
    plugin: DevicePluginService
    fake: Fake
    stub: Any

    async def preferred(self) -> tuple[float, list[str] | None, aio.AioRpcError | None]:
        """GetPreferredAllocation offering GPU-b's replicas: (seconds, answer, error)."""
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"GPU-b-{n}" for n in range(10)], allocation_size=1
                )
            ]
        )
        started = time.monotonic()
        try:
            response = await self.stub.GetPreferredAllocation(request)
        except aio.AioRpcError as exc:
            return time.monotonic() - started, None, exc
        return time.monotonic() - started, list(response.container_responses[0].deviceIDs), None

    async def allocate(self, ids: list[str]) -> tuple[float, Any, aio.AioRpcError | None]:
        return await allocate(self.stub, ids)

    def allocations(self, result: str) -> float:
        """`numafit_deviceplugin_allocations_total{result}` as the plugin exports it."""
        return sample(self.plugin.metrics.registry, ALLOCATIONS, result=result)


async def allocate(stub: Any, ids: list[str]) -> tuple[float, Any, aio.AioRpcError | None]:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )
    started = time.monotonic()
    try:
        response = await stub.Allocate(request)
    except aio.AioRpcError as exc:
        return time.monotonic() - started, None, exc
    return time.monotonic() - started, response, None


@contextlib.asynccontextmanager
async def fake_node(
    nats_url: str,
    budget_ms: int,
    *,
    replies: dict[str, list[dict[str, Any]]] | None = None,
    delays: dict[str, float | None] | None = None,
    state_dir: Path | None = None,
    fake: Fake | None = None,
) -> AsyncIterator[Node]:
    """The real plugin and a kubelet emulator; accounting and refit are `Fake`s (`fake`: one
    the caller keeps, so that a second plugin meets the same one). `state_dir`: where the
    plugin keeps its consume journal (None: in memory)."""
    fake = fake or Fake(
        replies={"pending": [{"ok": True, "code": "ok", "pod": PENDING_POD}], **(replies or {})},
        delays=dict(delays or {}),
    )
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    fakes_nc = (await natsconn.connect(nats_url, "fakes")).client
    plugin_nc = (await natsconn.connect(nats_url, "deviceplugin")).client
    kubelet = KubeletEmulator(
        KubeletConfig(
            directory=directory, topology_policy=TopologyPolicy.SINGLE_NUMA_NODE, cpus={0: 8}
        )
    )
    plugin = DevicePluginService(
        plugin_nc,
        PluginOptions(
            PluginConfig(
                node=NODE,
                directory=directory,
                refit_timeout_ms=budget_ms,
                watch_interval=0.05,
                state_dir=state_dir,
            ),
            SimulatedBackend(DEFAULT_GPUS),
        ),
    )
    try:
        for op in subjects.ACCOUNTING_OPS:
            await fake.serve(fakes_nc, op, subjects.accounting(op, NODE))
        await fake.serve(fakes_nc, "refit", subjects.refit(NODE))
        await fakes_nc.flush()
        await kubelet.start()
        await plugin.start()
        async with asyncio.timeout(10):
            await kubelet.wait_for_devices(RESOURCE, 20)
            await plugin.inventory_registered.wait()
        async with aio.insecure_channel(f"unix://{plugin.config.socket_path}") as channel:
            yield Node(plugin, fake, api_pb2_grpc.DevicePluginStub(channel))  # type: ignore[no-untyped-call]
    finally:
        await plugin.stop(1.0)
        await kubelet.stop()
        await fake.close()
        await plugin_nc.close()
        await fakes_nc.close()
        shutil.rmtree(directory, ignore_errors=True)


async def test_every_hop_slow_still_ends_within_the_budget(nats_url: str) -> None:
    # pending answers late, the refit never, recording the failed binding never: before,
    # 0.2 s + 0.6 s + 2 s (a fresh accounting timeout for bind-phase).
    delays = {"pending": 0.2, "refit": SILENT, "bind-phase": SILENT}
    async with fake_node(nats_url, 600, delays=delays) as node:
        elapsed, _, error = await node.preferred()
        assert error is not None and error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "numa-alignment strict: refit timed out" in str(error.details())
        assert elapsed <= 0.6 + MARGIN
        # The failed binding is still recorded, after kubelet has its answer.
        await wait_for(lambda: node.fake.requests["bind-phase"])
        assert node.fake.requests["bind-phase"][0]["phase"] == keys.PHASE_FAILED
        assert node.fake.requests["bind-phase"][0]["podUID"] == "uid-1"


async def test_silent_accounting_ends_preferred_allocation_within_the_budget(
    nats_url: str,
) -> None:
    async with fake_node(nats_url, 600, delays={"pending": SILENT}) as node:
        elapsed, answer, error = await node.preferred()
        # No pending pod to go by: only distinct GPUs are preferred (what kubelet offered).
        assert error is None and answer == ["GPU-b-0"]
        assert elapsed <= 0.6 + MARGIN


async def test_the_refit_gets_what_is_left_of_the_call(nats_url: str) -> None:
    refused = {"succeeded": False, "code": "no_fit", "failureReason": "no allowed device fits"}
    pod = {**PENDING_POD, "numaAlignment": "best-effort"}
    async with fake_node(
        nats_url,
        1000,
        replies={"pending": [{"ok": True, "code": "ok", "pod": pod}], "refit": [refused]},
        delays={"pending": 0.4},
    ) as node:
        _, answer, error = await node.preferred()
        # best-effort: kubelet's GPUs (not judged: this accounting has no snapshot to give).
        assert error is None and answer == ["GPU-b-0"]
        (refit,) = node.fake.requests["refit"]
        # 1000 ms for the call, 400 of them spent waiting for `pending`.
        assert 300 <= refit["timeoutMs"] <= 600
        # accounting's own requests carry what is left too.
        assert node.fake.requests["pending"][-1]["deadlineMs"] <= 1000


async def test_silent_consume_ends_allocate_within_the_budget(nats_url: str) -> None:
    async with fake_node(nats_url, 600, delays={"consume": SILENT}) as node:
        elapsed, _, error = await node.allocate(["GPU-b-0"])
        assert error is not None and error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cannot record the allocation" in str(error.details())
        assert elapsed <= 0.6 + MARGIN
        assert node.allocations("accounting_unavailable") == 1


async def test_a_consume_conflict_is_asked_again(nats_url: str) -> None:
    conflict = {"ok": False, "code": "conflict", "error": "pod changed; re-read"}
    async with fake_node(nats_url, 2000, replies={"consume": [conflict, CONSUMED]}) as node:
        _, response, error = await node.allocate(["GPU-b-0"])
        assert error is None
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
        assert len(node.fake.requests["consume"]) == 2
        assert node.allocations("ok") == 1


async def test_other_consume_refusals_are_reported_clearly_and_bounded(nats_url: str) -> None:
    refusal = {"ok": False, "code": "api_error", "error": "E" * 5000}
    async with fake_node(nats_url, 2000, replies={"consume": [refusal]}) as node:
        _, _, error = await node.allocate(["GPU-b-0"])
        assert error is not None and error.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = str(error.details())
        assert details.startswith("allocation refused by accounting (api_error): ")
        assert len(details) < 400
        assert len(node.fake.requests["consume"]) == 1  # not a conflict: not asked again
        assert node.allocations("api_error") == 1


async def test_an_unknown_refusal_code_is_not_a_label(nats_url: str) -> None:
    refusal = {"ok": False, "code": "x" * 1000, "error": "?"}
    async with fake_node(nats_url, 2000, replies={"consume": [refusal]}) as node:
        _, _, error = await node.allocate(["GPU-b-0"])
        assert error is not None and len(str(error.details())) < 400
        assert node.allocations("other") == 1
        samples = [
            s.labels.get("result", "")
            for m in node.plugin.metrics.registry.collect()
            for s in m.samples
            if s.name == ALLOCATIONS
        ]
        assert all(len(label) < 64 for label in samples)


async def test_unbounded_input_is_never_repeated_in_logs_or_errors(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    pod = {**PENDING_POD, "numaAlignment": "y" * 10000}
    async with fake_node(
        nats_url, 2000, replies={"pending": [{"ok": True, "code": "ok", "pod": pod}]}
    ) as node:
        with caplog.at_level(logging.INFO, logger="numafit.deviceplugin"):
            _, answer, error = await node.preferred()
            assert error is None and answer == ["GPU-b-0"]
            _, _, refused = await node.allocate(["GPU-zzz-" + "9" * 5000])
        assert refused is not None and refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(str(refused.details())) < 400
    for record in caplog.records:
        for value in vars(record).values():
            assert not isinstance(value, str) or len(value) < 1000, record.getMessage()


# --- the real services, with the API server slowed down ----------------------------------


@contextlib.asynccontextmanager
async def direct_stub(stack: Stack) -> AsyncIterator[Any]:
    async with aio.insecure_channel(f"unix://{stack.plugin.config.socket_path}") as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]


async def test_a_slow_api_server_ends_allocate_within_the_budget(
    nats_url: str, tmp_path: Path
) -> None:
    pods = [gpu_pod("local", "GPU-b,NVIDIA,20000,30:;")]
    async with node_stack(nats_url, tmp_path, pods, refit_timeout_ms=600) as stack:
        # consume's pod PATCH takes 1.5 s: before, the plugin gave accounting 2 s for it.
        stack.h.emulator.faults.add(method="PATCH", path_regex="/pods/", delay_s=1.5, times=1)
        async with direct_stub(stack) as stub:
            elapsed, _, error = await allocate(stub, ["GPU-b-0"])
        assert error is not None and "deadline_exceeded" in str(error.details())
        assert elapsed <= 0.6 + MARGIN


async def test_a_slow_api_server_ends_a_strict_refit_within_the_budget(
    nats_url: str, tmp_path: Path
) -> None:
    pods = [gpu_pod("p", "GPU-a,NVIDIA,20000,30:;", alignment="strict")]
    async with node_stack(nats_url, tmp_path, pods, refit_timeout_ms=600) as stack:
        # The refit's move and the failed binding both PATCH the pod; each takes 1.5 s.
        stack.h.emulator.faults.add(method="PATCH", path_regex="/pods/", delay_s=1.5)
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"GPU-b-{n}" for n in range(10)], allocation_size=1
                )
            ]
        )
        async with direct_stub(stack) as stub:
            started = time.monotonic()
            with pytest.raises(aio.AioRpcError) as caught:
                await stub.GetPreferredAllocation(request)
            elapsed = time.monotonic() - started
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "numa-alignment strict" in str(caught.value.details())
        assert elapsed <= 0.6 + MARGIN
        stack.h.emulator.faults.clear()
