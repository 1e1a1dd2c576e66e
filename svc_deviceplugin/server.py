"""The gRPC side: the DevicePlugin service on the plugin's socket, kubelet registration, and
re-registration when kubelet restarts (it recreates kubelet.sock and removes plugin sockets).

Everything runs on one asyncio loop with `grpc.aio`: kubelet dials back into the plugin
inside the Register call, so a blocking Register would deadlock the plugin's own server.

Each GetPreferredAllocation and Allocate gets one deadline (`refit_timeout_ms` from its start)
that every hop below takes its budget from; a backstop a little after it (`BACKSTOP_S`) ends
the call with DEADLINE_EXCEEDED should any hop not keep to its budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc import aio

from proto.v1beta1 import api_pb2, api_pb2_grpc
from shared.service.backoff import Backoff
from shared.subjects import shown
from svc_deviceplugin.hops import AdmissionRefused
from svc_deviceplugin.judge import ContainerPreference

log = logging.getLogger("numafit.deviceplugin")

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
BACKSTOP_S = 0.1
"""How long after its deadline a kubelet call is cut short if a hop overran its budget."""

T = TypeVar("T")

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from shared.service.lifecycle import Deadline
    from svc_deviceplugin.allocator import Allocator
    from svc_deviceplugin.config import PluginConfig
    from svc_deviceplugin.inventory import Replica
    from svc_deviceplugin.metrics import PluginMetrics

    Context = aio.ServicerContext[Any, Any]


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc, unused-ignore]
    """kubelet's view of the node's GPUs: replicas, preferences, allocations."""

    def __init__(self, allocator: Allocator, replicas: Callable[[], list[Replica]]) -> None:
        self.allocator = allocator
        self.metrics = allocator.metrics
        self.replicas = replicas
        self.changed = asyncio.Condition()
        self.version = 0
        """Bumped by every `notify`: a ListAndWatch stream sends again when it moved on, so a
        change while the stream waits for kubelet to read is never lost."""
        self.stopping = False

    async def notify(self) -> None:
        async with self.changed:
            self.version += 1
            self.changed.notify_all()

    async def _within_deadline(
        self, method: str, deadline: Deadline, work: Awaitable[T], context: Context
    ) -> T:
        """`work` bounded by the call's deadline (plus the backstop), timed."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(deadline.remaining() + BACKSTOP_S):
                return await work
        except TimeoutError:
            self.metrics.deadline_exceeded.labels(method).inc()
            budget = self.allocator.config.refit_timeout_ms
            log.error("kubelet call overran its deadline", extra={"method": method})
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"{method} did not finish within {budget} ms"
            )
            raise  # abort raises; this is for the type checker
        finally:
            self.metrics.call_duration.labels(method).observe(time.perf_counter() - started)

    def device_list(self) -> api_pb2.ListAndWatchResponse:
        devices = []
        for replica in self.replicas():
            topology = (
                api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=replica.numa)])
                if replica.numa >= 0
                else None
            )
            devices.append(
                api_pb2.Device(
                    ID=replica.id,
                    health=HEALTHY if replica.healthy else UNHEALTHY,
                    topology=topology,
                )
            )
        return api_pb2.ListAndWatchResponse(devices=devices)

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Context
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        # Each message replaces kubelet's whole list, so always send every replica.
        sent = [self.version]

        def moved_on() -> bool:
            return self.stopping or self.version != sent[0]

        yield self.device_list()
        while not self.stopping:
            async with self.changed:
                await self.changed.wait_for(moved_on)
            if self.stopping:
                return
            sent[0] = self.version
            yield self.device_list()

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Context
    ) -> api_pb2.PreferredAllocationResponse:
        asks = [
            ContainerPreference(
                list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
            )
            for r in request.container_requests
        ]
        deadline = self.allocator.deadline()
        try:
            answers = await self._within_deadline(
                "GetPreferredAllocation",
                deadline,
                self.allocator.preferred(asks, deadline),
                context,
            )
        except AdmissionRefused as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return api_pb2.PreferredAllocationResponse(
            container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answers
            ]
        )

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: Context
    ) -> api_pb2.AllocateResponse:
        deadline = self.allocator.deadline()
        return await self._within_deadline(
            "Allocate", deadline, self._allocate(request, deadline, context), context
        )

    async def _allocate(
        self, request: api_pb2.AllocateRequest, deadline: Deadline, context: Context
    ) -> api_pb2.AllocateResponse:
        responses = []
        for container in request.container_requests:
            try:
                allocation = await self.allocator.allocate(list(container.devices_ids), deadline)
            except AdmissionRefused as exc:
                code = (
                    grpc.StatusCode.INVALID_ARGUMENT
                    if exc.invalid_argument
                    else grpc.StatusCode.FAILED_PRECONDITION
                )
                log.warning("allocate refused", extra={"error": shown(str(exc), 300)})
                await context.abort(code, str(exc))
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs=allocation.envs,
                    mounts=[
                        api_pb2.Mount(
                            container_path=m.container_path,
                            host_path=m.host_path,
                            read_only=m.read_only,
                        )
                        for m in allocation.mounts
                    ],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Context
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def _inode(path: os.PathLike[str] | str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class PluginServer:
    """Serve the plugin socket and stay registered with kubelet across its restarts."""

    def __init__(
        self, config: PluginConfig, servicer: DevicePluginServicer, metrics: PluginMetrics
    ) -> None:
        self.config = config
        self.servicer = servicer
        self.metrics = metrics
        self.registered = asyncio.Event()
        self._server: Any = None

    async def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.config.socket_path.unlink()
        server = aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.config.socket_path}")
        await server.start()
        self._server = server

    async def _stop_serving(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self.servicer.stopping = True
            await self.servicer.notify()
            try:
                await server.stop(grace=1.0)
            finally:
                self.servicer.stopping = False

    async def _register(self) -> None:
        async with aio.insecure_channel(f"unix://{self.config.kubelet_socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                api_pb2.RegisterRequest(
                    version="v1beta1",
                    endpoint=self.config.socket_name,
                    resource_name=self.config.resource_name,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=15,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Serve, register, and start over whenever kubelet restarts, until `stop` (or until
        cancelled: the socket is closed and removed either way)."""
        try:
            await self._run(stop)
        finally:
            await self._stop_serving()
            with contextlib.suppress(FileNotFoundError):
                self.config.socket_path.unlink()

    async def _run(self, stop: asyncio.Event) -> None:
        backoff = Backoff()
        while not stop.is_set():
            if _inode(self.config.kubelet_socket) is None:
                await _wait(stop, self.config.watch_interval)
                continue
            await self._serve()
            kubelet = _inode(self.config.kubelet_socket)
            try:
                await self._register()
            except grpc.RpcError as exc:
                detail = exc.details() if hasattr(exc, "details") else exc
                log.warning(
                    "registration failed; retrying", extra={"error": shown(str(detail), 200)}
                )
                await self._stop_serving()
                await backoff.wait(stop)
                continue
            backoff.reset()
            self.metrics.registrations.inc()
            self.registered.set()
            log.info(
                "registered with kubelet",
                extra={
                    "resource": self.config.resource_name,
                    "socket": str(self.config.socket_path),
                },
            )
            while not stop.is_set():
                await _wait(stop, self.config.watch_interval)
                if (
                    _inode(self.config.kubelet_socket) != kubelet
                    or not self.config.socket_path.exists()
                ):
                    log.info("kubelet restarted; registering again")
                    self.registered.clear()
                    break
            await self._stop_serving()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
