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
import random
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpc import aio  # type: ignore[import-untyped, unused-ignore]

from shared.core.kubelet_version import init_resource_rejection, pod_resource_requests
from shared.core.model import ContainerKind
from shared.core.pods import ContainerSpec
from shared.testing.kubelet_emulator.errors import (
    AdmissionError,
    OutOfResourceError,
    RegistrationError,
    UnexpectedAdmissionError,
)
from shared.testing.kubelet_emulator.ledger import (
    ContainerKey,
    CpuLedger,
    DeviceLedger,
    PluginDevice,
)
from shared.testing.kubelet_emulator.placement import DeviceAllocation, FreeDevice, place
from shared.testing.kubelet_emulator.plugin_connection import PluginConnection, describe_rpc_error
from shared.testing.kubelet_emulator.registration import RegistrationService
from shared.testing.kubelet_emulator.resource_names import is_extended_resource_name
from shared.testing.kubelet_emulator.topology import zones

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from types import TracebackType

    from proto.v1beta1 import api_pb2
    from shared.testing.kubelet_emulator.config import KubeletConfig
    from shared.testing.kubelet_emulator.placement import PreferenceAsk
    from shared.testing.kubelet_emulator.topology import TopologyPublisher

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
    """NUMA node of the container's exclusive CPUs (None: it has none, e.g. in a Burstable
    pod)."""
    exclusive_cpus: int
    aligned: bool
    """False for a best-effort admission without a NUMA node fitting CPUs and devices."""
    preferred_honoured: bool
    """True when GetPreferredAllocation was asked and its answer chose every replica kubelet
    took after asking."""
    response: api_pb2.ContainerAllocateResponse | None
    """``container_responses[0]`` of Allocate; None when no devices were requested."""
    numa: int | None = None
    """The single NUMA node of the container's Topology Manager affinity (None: no
    constraint, or every NUMA node)."""
    reused: tuple[str, ...] = ()
    """Replicas taken over from the pod's init containers (kubelet's device reuse)."""
    asked: bool = False
    """GetPreferredAllocation was called for the container."""

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs) if self.response is not None else {}


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """One container of a pod to admit: what kubelet's managers see of it.

    `exclusive_cpus` is what the static CPU manager pins (only a Guaranteed pod's containers
    get any: build asks with `container_asks`); `kind` says whether what it holds is reusable
    by the containers after it (a regular init container) or not; `limits` and `requests` are
    the container's resources as written, for kubelet's resource predicate."""

    name: str
    gpu_count: int = 0
    exclusive_cpus: int = 0
    resource: str = "nvidia.com/gpu"
    kind: ContainerKind = ContainerKind.APP
    limits: Mapping[str, object] = field(default_factory=dict)
    requests: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PodAdmission:
    """A pod's admission: its containers admitted in order, up to the one refused."""

    pod_uid: str
    admitted: tuple[Admission, ...]
    error: AdmissionError | None = None
    """Why the pod was refused: the container after the last admitted one, or, when every
    container was admitted (the device plugin was called for each), kubelet's resource
    predicate (`OutOfResourceError`)."""

    @property
    def failed_index(self) -> int | None:
        if self.error is None or isinstance(self.error, OutOfResourceError):
            return None
        return len(self.admitted)


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
        self._rng = random.Random(config.seed)
        """Go's set order, seeded: offered IDs and kubelet's own picks."""
        self._pod_requests: dict[str, Mapping[str, int]] = {}
        """Admitted pods' requests of extended resources no plugin advertises (what kubelet's
        predicate counts as used)."""
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
        """Admit one container like kubelet, on its own (no reuse from other containers of
        the pod: use `admit_pod` for a whole pod), or raise its admission error.

        Raises ``TopologyAffinityError`` or ``UnexpectedAdmissionError``; on
        failure nothing is consumed. Admissions are serialized.
        """
        ask = ContainerAsk(container_name, gpu_count, exclusive_cpus, resource)
        async with self._admitting:
            try:
                return await self._admit_locked(pod_uid, ask, set())
            finally:
                await self._publish_locked()

    async def _admit_locked(self, pod_uid: str, ask: ContainerAsk, reusable: set[str]) -> Admission:
        owner = ContainerKey(pod_uid, ask.name)
        if owner in self._admitted:
            raise ValueError(f"container {pod_uid}/{ask.name} is already admitted")
        try:
            admission = await self._admit(owner, ask, reusable)
        except Exception as exc:
            logger.info(
                "container refused",
                extra={
                    **self._log,
                    "pod_uid": pod_uid,
                    "container": ask.name,
                    "reason": getattr(exc, "reason", type(exc).__name__),
                    "error": str(exc),
                },
            )
            raise
        self._devices.allocate(ask.resource, admission.device_ids, owner)
        self._cpus.allocate(
            admission.cpu_numa, ask.exclusive_cpus, owner, init=ask.kind is ContainerKind.INIT
        )
        self._admitted.add(owner)
        logger.info(
            "container admitted",
            extra={
                **self._log,
                "pod_uid": pod_uid,
                "container": ask.name,
                "devices": list(admission.device_ids),
                "reused": list(admission.reused),
                "cpu_numa": admission.cpu_numa,
            },
        )
        return admission

    async def admit_pod(self, pod_uid: str, containers: Sequence[ContainerAsk]) -> PodAdmission:
        """Admit a pod like kubelet: its containers in order (init containers first), as one
        admission, what a regular init container holds reused by the containers after it; then
        kubelet's resource predicate (`OutOf<resource>`, checked after the device plugin was
        called). The first refusal fails the pod, which then holds nothing. The node's
        NodeResourceTopology is published afterwards, either way."""
        admitted: list[Admission] = []
        error: AdmissionError | None = None
        reusable: dict[str, set[str]] = {}
        async with self._admitting:
            for ask in containers:
                pool = reusable.setdefault(ask.resource, set())
                try:
                    admission = await self._admit_locked(pod_uid, ask, pool)
                except AdmissionError as exc:
                    error = exc
                    break
                admitted.append(admission)
                # kubelet's devicesToReuse: a regular init container's replicas are reusable
                # by the containers after it; a sidecar or an app container keeps its own.
                if ask.kind is ContainerKind.INIT:
                    pool |= set(admission.device_ids)
                else:
                    pool -= set(admission.device_ids)
            if error is None:
                error = self._predicate(pod_uid, containers)
            if error is not None:
                self._release_locked(pod_uid)
            await self._publish_locked()
        return PodAdmission(pod_uid, tuple(admitted), error)

    def _predicate(self, pod_uid: str, containers: Sequence[ContainerAsk]) -> AdmissionError | None:
        """kubelet's resource predicate, after the Topology Manager's handler: an extended
        resource no plugin advertises is stripped from app containers and, from v1.31 on,
        from init containers too (shared/core/kubelet_version.py)."""
        specs = [ContainerSpec(a.name, a.kind, a.limits, a.requests) for a in containers]
        advertised = frozenset(self._plugins)
        rejection = init_resource_rejection(self.config.version, specs, advertised)
        if rejection is None:
            names = {n for a in containers for n in (*a.limits, *a.requests)} - advertised
            self._pod_requests[pod_uid] = pod_resource_requests(specs, names)
            return None
        used = sum(
            requests.get(rejection.resource, 0)
            for uid, requests in self._pod_requests.items()
            if uid != pod_uid
        )
        return OutOfResourceError(rejection.resource, rejection.requested, used, 0)

    async def release_pod(self, pod_uid: str) -> None:
        """Free every device and CPU held by the pod's containers."""
        async with self._admitting:
            self._release_locked(pod_uid)
            await self._publish_locked()

    def _release_locked(self, pod_uid: str) -> None:
        freed = self._devices.release_pod(pod_uid)
        cpus = self._cpus.release_pod(pod_uid)
        self._pod_requests.pop(pod_uid, None)
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

    async def _admit(self, owner: ContainerKey, ask: ContainerAsk, reusable: set[str]) -> Admission:
        resource, gpu_count, cpu_count = ask.resource, ask.gpu_count, ask.exclusive_cpus
        plugin = self._plugins.get(resource) if gpu_count > 0 else None
        if gpu_count > 0 and (plugin is None or not plugin.connected):
            raise UnexpectedAdmissionError(f"cannot allocate unregistered device {resource}")
        numa_of = {d.id: d.numa_nodes for d in self._devices.devices(resource)}
        placement = place(
            self.config.topology_policy,
            free_cpus=self._cpus.free(),
            free_devices=self._devices.free(resource),
            topology_aware=self._devices.topology_aware(resource),
            gpu_count=gpu_count,
            cpu_count=cpu_count,
            reusable_cpus=self._cpus.reusable(owner.pod_uid) if cpu_count else None,
            reusable_devices=[FreeDevice(i, numa_of.get(i, frozenset())) for i in sorted(reusable)]
            if gpu_count
            else (),
        )
        device_ids: tuple[str, ...] = ()
        honoured = asked = False
        reused: tuple[str, ...] = ()
        response = None
        if plugin is not None:
            allocation = DeviceAllocation(resource, gpu_count, reusable, placement, self._rng)
            preferred = None
            if allocation.ask is not None and plugin.options.get_preferred_allocation_available:
                asked = True
                preferred = await self._preferred(plugin, allocation.ask)
            device_ids, honoured = allocation.finish(preferred)
            reused = allocation.reused
            response = await self._allocate(plugin, device_ids)
        return Admission(
            pod_uid=owner.pod_uid,
            container_name=owner.container_name,
            resource=resource,
            device_ids=device_ids,
            cpu_numa=placement.cpu_numa,
            exclusive_cpus=cpu_count,
            aligned=placement.aligned,
            preferred_honoured=honoured,
            response=response,
            numa=placement.numa,
            reused=reused,
            asked=asked,
        )

    async def _preferred(self, plugin: PluginConnection, ask: PreferenceAsk) -> list[str] | None:
        try:
            async with asyncio.timeout(self.config.rpc_timeout):
                return await plugin.get_preferred_allocation(
                    ask.available, ask.must_include, ask.size
                )
        except aio.AioRpcError as exc:
            raise UnexpectedAdmissionError(
                f"device plugin GetPreferredAllocation rpc failed with err: "
                f"{describe_rpc_error(exc)}"
            ) from exc
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
