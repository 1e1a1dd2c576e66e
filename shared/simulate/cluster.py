"""Everything `numafit simulate` runs, for real, in one process: a nats-server (subprocess),
the Kubernetes API emulator with the webhook plugged into pod creation, svc_accounting,
svc_refit, svc_scheduler, and per node a kubelet emulator driving the real device plugin over
gRPC unix sockets on simulated GPUs. Each service has its own NATS connection, Kubernetes
client and metrics registry, exactly as when they run as separate processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from shared.core.accounting import TrackedPod
from shared.kube_emulator import KubeEmulator
from shared.kubelet_emulator import KubeletConfig, KubeletEmulator
from shared.nats_server import NatsServer
from shared.service import natsconn
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from shared.simulate.scenario import NodeSpec, Scenario
from svc_accounting.metrics import AccountingMetrics
from svc_accounting.service import AccountingService
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import SimulatedBackend
from svc_deviceplugin.metrics import PluginMetrics
from svc_deviceplugin.service import DevicePluginService
from svc_refit.metrics import RefitMetrics
from svc_refit.service import RefitService
from svc_scheduler.emulator_admission import emulator_admission_hook
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.service import SchedulerService

RESOURCE = "nvidia.com/gpu"
DEFAULT_REPLICAS = 10


@dataclass
class SimNode:
    spec: NodeSpec
    kubelet: KubeletEmulator
    plugin: DevicePluginService
    registry: CollectorRegistry

    @property
    def gpu_numa(self) -> dict[str, int]:
        return {g.uuid: g.numa for g in self.spec.gpus}

    @property
    def policy_none(self) -> bool:
        return self.spec.topology_policy.value == "none"

    def refit_outcome(self, pod_uid: str, index: int) -> str:
        return self.plugin.allocator.outcomes.get((pod_uid, index), "none")


@dataclass
class SimCluster:
    scenario: Scenario
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="numafit-sim-")))
    nats: NatsServer = field(default_factory=NatsServer)
    emulator: KubeEmulator = field(default_factory=KubeEmulator)
    nodes: dict[str, SimNode] = field(default_factory=dict)
    registries: dict[str, CollectorRegistry] = field(default_factory=dict)
    kube: Kube | None = None
    accounting: AccountingService | None = None
    refit: RefitService | None = None
    scheduler: SchedulerService | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list)
    _socket_dirs: list[Path] = field(default_factory=list)

    async def _nats(self, name: str, hooks: list[natsconn.ReconnectHook] | None = None) -> Client:
        nc = await natsconn.connect(self.nats.url, name, on_reconnect=hooks)
        self._closers.append(nc.close)
        return nc

    async def _kube(self, component: str) -> Kube:
        api = await api_client(str(self.workdir / "kubeconfig"))
        self._closers.append(api.close)
        return Kube(api, component)

    async def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        progress("starting nats-server and the Kubernetes API emulator")
        await asyncio.to_thread(self.nats.start)
        await self.emulator.start()
        self.emulator.write_kubeconfig(self.workdir / "kubeconfig")
        self.kube = await self._kube("numafit-simulate")
        for spec in self.scenario.nodes:
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": spec.name}}
            await self.kube.create_node(body)

        progress("starting accounting, refit and the scheduler extender")
        config = self.scenario.config
        registry = self.registries["accounting"] = CollectorRegistry(auto_describe=True)
        hooks: list[natsconn.ReconnectHook] = []
        self.accounting = AccountingService(
            await self._nats("accounting", hooks),
            await self._kube("numafit-accounting"),
            config=config,
            metrics=AccountingMetrics(registry),
        )
        hooks.append(self.accounting.on_reconnect)
        await self.accounting.start()
        registry = self.registries["refit"] = CollectorRegistry(auto_describe=True)
        self.refit = RefitService(
            await self._nats("refit"),
            await self._kube("numafit-refit"),
            config=config,
            metrics=RefitMetrics(registry),
        )
        await self.refit.start()
        registry = self.registries["scheduler"] = CollectorRegistry(auto_describe=True)
        self.scheduler = SchedulerService(
            await self._nats("scheduler"),
            await self._kube("numafit-scheduler"),
            config=config,
            metrics=SchedulerMetrics(registry),
            host="127.0.0.1",
            port=0,
        )
        await self.scheduler.start()
        self.emulator.admission = emulator_admission_hook(self.scheduler.admission)

        for spec in self.scenario.nodes:
            progress(f"starting kubelet and device plugin on {spec.name}")
            await self._start_node(spec)
        async with asyncio.timeout(30):
            for sim in self.nodes.values():
                await sim.plugin.inventory_registered.wait()
            await self.scheduler.read_model.ready.wait()

    async def _start_node(self, spec: NodeSpec) -> None:
        directory = Path(tempfile.mkdtemp(prefix="nf-", dir="/tmp"))  # short unix socket paths
        self._socket_dirs.append(directory)
        kubelet = KubeletEmulator(
            KubeletConfig(
                directory=directory,
                node_name=spec.name,
                topology_policy=spec.topology_policy,
                cpus=spec.cpus,
            )
        )
        await kubelet.start()
        registry = CollectorRegistry(auto_describe=True)
        plugin = DevicePluginService(
            PluginConfig(
                node=spec.name, directory=directory, replicas=DEFAULT_REPLICAS, watch_interval=0.2
            ),
            await self._nats(f"deviceplugin-{spec.name}"),
            SimulatedBackend(spec.gpus),
            metrics=PluginMetrics(registry),
        )
        await plugin.start()
        replicas = sum(g.replicas or DEFAULT_REPLICAS for g in spec.gpus)
        async with asyncio.timeout(30):
            await kubelet.wait_for_devices(RESOURCE, replicas)
        self.nodes[spec.name] = SimNode(spec, kubelet, plugin, registry)

    async def stop(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                await node.plugin.stop(1.0)
            with contextlib.suppress(Exception):
                await node.kubelet.stop()
        for service in (self.scheduler, self.refit, self.accounting):
            if service is not None:
                with contextlib.suppress(Exception):
                    await service.stop(1.0)
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                await close()
        with contextlib.suppress(Exception):
            await self.emulator.stop()
        await asyncio.to_thread(self.nats.stop)
        for directory in [*self._socket_dirs, self.workdir]:
            shutil.rmtree(directory, ignore_errors=True)

    # --- the driver's Environment -----------------------------------------------------------

    @property
    def api(self) -> Kube:
        assert self.kube is not None
        return self.kube

    @property
    def scheduler_url(self) -> str:
        assert self.scheduler is not None
        return self.scheduler.url

    @property
    def node_handles(self) -> dict[str, SimNode]:
        return self.nodes

    async def tracked(self, uid: str) -> TrackedPod | None:
        assert self.accounting is not None
        return self.accounting.ledger.tracked(uid)

    def all_registries(self) -> list[CollectorRegistry]:
        return [*self.registries.values(), *(n.registry for n in self.nodes.values())]
