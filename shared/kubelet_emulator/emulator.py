"""An emulated kubelet: device manager, Topology Manager and static CPU manager over real gRPC.

It lets the real device plugin be exercised end to end without a node:
plugins register on ``kubelet.sock`` exactly as with kubelet (Register dials
back, asks options, opens ListAndWatch), and containers are admitted the way
kubelet admits them (NUMA choice, GetPreferredAllocation as advice, Allocate),
with kubelet's failure reasons. Everything runs on one asyncio loop with
``grpc.aio``: a synchronous Register on the loop thread would deadlock an aio
plugin served from the same loop.

Tasks it owns (the gRPC server, one ListAndWatch task per plugin) are stopped by
:meth:`KubeletEmulator.stop`; use it as an async context manager.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grpc import aio  # type: ignore[import-untyped, unused-ignore]

from shared.kubelet_emulator.errors import (
    AdmissionError,
    RegistrationError,
    UnexpectedAdmissionError,
)
from shared.kubelet_emulator.ledger import ContainerKey, CpuLedger, DeviceLedger, PluginDevice
from shared.kubelet_emulator.placement import choose_devices, place
from shared.kubelet_emulator.plugin_connection import PluginConnection, describe_rpc_error
from shared.kubelet_emulator.registration import RegistrationService
from shared.kubelet_emulator.resource_names import is_extended_resource_name
from shared.kubelet_emulator.topology import zones

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path
    from types import TracebackType

    from proto.v1beta1 import api_pb2
    from shared.kubelet_emulator.config import KubeletConfig
    from shared.kubelet_emulator.topology import TopologyPublisher

__all__ = ["SUPPORTED_VERSIONS", "Admission", "ContainerAsk", "KubeletEmulator", "PodAdmission"]

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1beta1",)


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted container: what kubelet allocated and what the plugin answered."""

    pod_uid: str
    container_name: str
    resource: str
    device_ids: tuple[str, ...]
    """Replica IDs passed to Allocate (what runs)."""
    cpu_numa: int | None
    """NUMA node of the container's exclusive CPUs (its Topology Manager affinity)."""
    exclusive_cpus: int
    aligned: bool
    """False for a best-effort admission without a NUMA node fitting CPUs and devices."""
    preferred_honoured: bool
    """True when the GetPreferredAllocation answer was used as is."""
    response: api_pb2.ContainerAllocateResponse | None
    """``container_responses[0]`` of Allocate; None when no devices were requested."""

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs) if self.response is not None else {}


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """One container of a pod to admit: what kubelet's managers see of it."""

    name: str
    gpu_count: int = 0
    exclusive_cpus: int = 0
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class PodAdmission:
    """A pod's admission: its containers admitted in order, up to the one refused."""

    pod_uid: str
    admitted: tuple[Admission, ...]
    error: AdmissionError | None = None
    """Why the container after the last admitted one was refused (the pod fails)."""

    @property
    def failed_index(self) -> int | None:
        return len(self.admitted) if self.error is not None else None


class KubeletEmulator:
    """One node's kubelet, as far as device plugins and container admission go.

    With a `topology` publisher it also plays NFD's topology-updater: the node's
    NodeResourceTopology is written after every pod admission and release.
    """

    def __init__(self, config: KubeletConfig, topology: TopologyPublisher | None = None) -> None:
        self.config = config
        self.topology = topology
        self._server: aio.Server | None = None
        self._plugins: dict[str, PluginConnection] = {}
        self._registrations: dict[str, int] = {}
        self._devices = DeviceLedger()
        self._cpus = CpuLedger(config.cpus)
        self._changed = asyncio.Condition()
        self._admitting = asyncio.Lock()
        self._admitted: set[ContainerKey] = set()
        self._log = {"node": config.node_name}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Serve ``kubelet.sock`` (any stale file there is replaced)."""
        if self._server is not None:
            raise RuntimeError("kubelet emulator already started")
        _prepare_directory(self.config)
        server = aio.server()
        RegistrationService(self.register).add_to(server)
        server.add_insecure_port(f"unix://{self.config.socket_path}")
        await server.start()
        self._server = server
        logger.info("kubelet serving", extra={**self._log, "socket": str(self.config.socket_path)})

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        plugins = list(self._plugins.values())
        self._plugins.clear()
        for plugin in plugins:
            await plugin.close()
        if server is not None:
            logger.info("kubelet stopped", extra=self._log)
        await self._notify()

    async def restart(self) -> list[str]:
        """Restart like kubelet: every socket in the directory is removed, plugins must re-register.

        Allocations survive (kubelet's checkpoint); device lists do not until
        the plugins register again. Non-socket files are left alone. Returns the
        names of the socket files removed.
        """
        async with self._admitting:
            await self.stop()
            self._devices.forget_devices()
            removed = _remove_sockets(self.config.directory)
            logger.info("kubelet restarting", extra={**self._log, "removed_sockets": removed})
            await self.start()
        return removed

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ registration

    async def register(self, request: api_pb2.RegisterRequest) -> None:
        """kubelet's Register: validate, dial back, fetch options, watch the devices."""
        resource = request.resource_name
        if request.version not in SUPPORTED_VERSIONS:
            raise RegistrationError(
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported versions are {list(SUPPORTED_VERSIONS)}"
            )
        if not is_extended_resource_name(resource):
            raise RegistrationError(f"the ResourceName {resource!r} is invalid")
        socket_path = self.config.directory / request.endpoint
        connection = await PluginConnection.connect(
            resource, socket_path, dial_timeout=self.config.dial_timeout
        )
        previous = self._plugins.get(resource)
        self._plugins[resource] = connection
        self._registrations[resource] = self._registrations.get(resource, 0) + 1
        connection.start_watching(self._on_devices, self._on_stream_ended)
        if previous is not None:  # a plugin registering again replaces its old endpoint
            await previous.close()
        logger.info(
            "plugin registered",
            extra={
                **self._log,
                "resource": resource,
                "endpoint": request.endpoint,
                "preferred_allocation": connection.options.get_preferred_allocation_available,
            },
        )
        await self._notify()

    def is_registered(self, resource: str) -> bool:
        """True while a plugin for ``resource`` is registered and its stream is open."""
        plugin = self._plugins.get(resource)
        return plugin is not None and plugin.connected

    def registration_count(self, resource: str) -> int:
        """Successful registrations of ``resource`` since this emulator was created."""
        return self._registrations.get(resource, 0)

    def devices(self, resource: str) -> tuple[PluginDevice, ...]:
        """The device list the plugin last sent."""
        return self._devices.devices(resource)

    def allocations(self, resource: str) -> dict[str, ContainerKey]:
        """Replica ID -> holding container."""
        return dict(self._devices.allocations(resource))

    def free_cpus(self) -> dict[int, int]:
        return self._cpus.free()

    async def wait_for_devices(self, resource: str, count: int) -> tuple[PluginDevice, ...]:
        """Wait until ``resource`` is registered and ``count`` healthy devices are seen.

        Bound it with ``asyncio.timeout`` (timeouts are scopes, not arguments).
        """

        def seen() -> bool:
            healthy = sum(1 for device in self.devices(resource) if device.healthy)
            return self.is_registered(resource) and healthy >= count

        await self.wait_until(seen)
        return self.devices(resource)

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds, re-checked on every registration or device change."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    # ------------------------------------------------------------------ admission

    async def admit_container(
        self,
        pod_uid: str,
        container_name: str,
        *,
        resource: str = "nvidia.com/gpu",
        gpu_count: int = 1,
        exclusive_cpus: int = 0,
    ) -> Admission:
        """Admit one container like kubelet, or raise its admission error.

        Raises ``TopologyAffinityError`` or ``UnexpectedAdmissionError``; on
        failure nothing is consumed. Admissions are serialized.
        """
        async with self._admitting:
            try:
                return await self._admit_locked(
                    pod_uid, container_name, resource, gpu_count, exclusive_cpus
                )
            finally:
                await self._publish_locked()

    async def _admit_locked(
        self,
        pod_uid: str,
        container_name: str,
        resource: str,
        gpu_count: int,
        exclusive_cpus: int,
    ) -> Admission:
        owner = ContainerKey(pod_uid, container_name)
        if owner in self._admitted:
            raise ValueError(f"container {pod_uid}/{container_name} is already admitted")
        try:
            admission = await self._admit(owner, resource, gpu_count, exclusive_cpus)
        except Exception as exc:
            logger.info(
                "container refused",
                extra={
                    **self._log,
                    "pod_uid": pod_uid,
                    "container": container_name,
                    "reason": getattr(exc, "reason", type(exc).__name__),
                    "error": str(exc),
                },
            )
            raise
        self._devices.allocate(resource, admission.device_ids, owner)
        self._cpus.allocate(admission.cpu_numa, exclusive_cpus, owner)
        self._admitted.add(owner)
        logger.info(
            "container admitted",
            extra={
                **self._log,
                "pod_uid": pod_uid,
                "container": container_name,
                "devices": list(admission.device_ids),
                "cpu_numa": admission.cpu_numa,
            },
        )
        return admission

    async def admit_pod(self, pod_uid: str, containers: Sequence[ContainerAsk]) -> PodAdmission:
        """Admit a pod like kubelet: its containers in order (init containers first), as one
        admission. The first refusal fails the pod, which then holds nothing. The node's
        NodeResourceTopology is published afterwards, either way."""
        admitted: list[Admission] = []
        error: AdmissionError | None = None
        async with self._admitting:
            for ask in containers:
                try:
                    admitted.append(
                        await self._admit_locked(
                            pod_uid, ask.name, ask.resource, ask.gpu_count, ask.exclusive_cpus
                        )
                    )
                except AdmissionError as exc:
                    error = exc
                    self._release_locked(pod_uid)
                    break
            await self._publish_locked()
        return PodAdmission(pod_uid, tuple(admitted), error)

    async def release_pod(self, pod_uid: str) -> None:
        """Free every device and CPU held by the pod's containers."""
        async with self._admitting:
            self._release_locked(pod_uid)
            await self._publish_locked()

    def _release_locked(self, pod_uid: str) -> None:
        freed = self._devices.release_pod(pod_uid)
        cpus = self._cpus.release_pod(pod_uid)
        self._admitted = {key for key in self._admitted if key.pod_uid != pod_uid}
        logger.info(
            "pod released",
            extra={**self._log, "pod_uid": pod_uid, "devices": freed, "cpus": cpus},
        )

    async def publish_topology(self) -> None:
        """Publish the node's NodeResourceTopology now (a topology-updater's first write)."""
        async with self._admitting:
            await self._publish_locked()

    async def _publish_locked(self) -> None:
        if self.topology is None:
            return
        figures = zones(
            self.config.cpus,
            self._cpus.free(),
            self._devices.every_resource(),
            {r: self._devices.allocations(r) for r in self._devices.every_resource()},
        )
        await self.topology.publish(figures)

    async def _admit(
        self, owner: ContainerKey, resource: str, gpu_count: int, cpu_count: int
    ) -> Admission:
        plugin = self._plugins.get(resource) if gpu_count > 0 else None
        if gpu_count > 0 and (plugin is None or not plugin.connected):
            raise UnexpectedAdmissionError(f"cannot allocate unregistered device {resource}")
        placement = place(
            self.config.topology_policy,
            free_cpus=self._cpus.free(),
            free_devices=self._devices.free(resource),
            topology_aware=self._devices.topology_aware(resource),
            resource=resource,
            gpu_count=gpu_count,
            cpu_count=cpu_count,
        )
        device_ids: tuple[str, ...] = ()
        honoured = False
        response = None
        if plugin is not None:
            preferred = await self._preferred(plugin, placement.available, gpu_count)
            device_ids, honoured = choose_devices(placement.available, preferred, gpu_count)
            response = await self._allocate(plugin, device_ids)
        return Admission(
            pod_uid=owner.pod_uid,
            container_name=owner.container_name,
            resource=resource,
            device_ids=device_ids,
            cpu_numa=placement.numa,
            exclusive_cpus=cpu_count,
            aligned=placement.aligned,
            preferred_honoured=honoured,
            response=response,
        )

    async def _preferred(
        self, plugin: PluginConnection, available: tuple[str, ...], size: int
    ) -> list[str] | None:
        if not plugin.options.get_preferred_allocation_available:
            return None
        try:
            async with asyncio.timeout(self.config.rpc_timeout):
                return await plugin.get_preferred_allocation(available, (), size)
        except aio.AioRpcError as exc:
            raise UnexpectedAdmissionError(describe_rpc_error(exc)) from exc
        except TimeoutError as exc:
            raise UnexpectedAdmissionError("GetPreferredAllocation timed out") from exc

    async def _allocate(
        self, plugin: PluginConnection, device_ids: tuple[str, ...]
    ) -> api_pb2.ContainerAllocateResponse:
        try:
            async with asyncio.timeout(self.config.rpc_timeout):
                response = await plugin.allocate(device_ids)
        except aio.AioRpcError as exc:
            raise UnexpectedAdmissionError(describe_rpc_error(exc)) from exc
        except TimeoutError as exc:
            raise UnexpectedAdmissionError("Allocate timed out") from exc
        if not response.container_responses:
            raise UnexpectedAdmissionError("no containers return in allocation response")
        first: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        return first

    # ------------------------------------------------------------------ plugin events

    async def _on_devices(self, plugin: PluginConnection, devices: list[PluginDevice]) -> None:
        if self._plugins.get(plugin.resource) is not plugin:
            return  # a replaced registration's last message
        self._devices.replace(plugin.resource, devices)
        logger.debug(
            "devices updated",
            extra={
                **self._log,
                "resource": plugin.resource,
                "count": len(devices),
                "healthy": sum(1 for d in devices if d.healthy),
            },
        )
        await self._notify()

    async def _on_stream_ended(self, plugin: PluginConnection) -> None:
        if self._plugins.get(plugin.resource) is plugin:
            self._devices.mark_unhealthy(plugin.resource)
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _remove_sockets(directory: Path) -> list[str]:
    removed = []
    for path in sorted(directory.iterdir()):
        try:
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
                removed.append(path.name)
        except FileNotFoundError:
            continue
    return removed


def _prepare_directory(config: KubeletConfig) -> None:
    config.directory.mkdir(parents=True, exist_ok=True)
    config.socket_path.unlink(missing_ok=True)
