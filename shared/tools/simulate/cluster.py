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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from shared.service.kube_topology import TopologyApi
from shared.service.wiring import InProcess
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.kube_emulator.scheduler_webhook import emulator_admission_hook
from shared.testing.kubelet_emulator import KubeletConfig, KubeletEmulator, TopologyPublisher
from shared.testing.nats_server import NatsServer
from svc_accounting import service as accounting_service
from svc_deviceplugin import service as deviceplugin_service
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import SimulatedBackend
from svc_refit import service as refit_service
from svc_scheduler import service as scheduler_service

if TYPE_CHECKING:
    from collections.abc import Callable

    from shared.core.accounting import TrackedPod
    from shared.service.kube_io import Kube
    from shared.tools.simulate.driver import Observed
    from shared.tools.simulate.scenario import NodeSpec, Scenario

RESOURCE = "nvidia.com/gpu"
DEFAULT_REPLICAS = 10


@dataclass
class SimNode:
    spec: NodeSpec
    kubelet: KubeletEmulator
    plugin: deviceplugin_service.DevicePluginService
    registry: CollectorRegistry

    @property
    def gpu_numa(self) -> dict[str, int]:
        return {g.uuid: g.numa for g in self.spec.gpus}

    @property
    def policy_none(self) -> bool:
        return self.spec.topology_policy.value == "none"

    def refit_outcome(self, pod_uid: str, index: int, seen: Observed) -> str:
        # The plugin runs in this process: its own record is exact (`seen` is not needed).
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
    accounting: accounting_service.AccountingService | None = None
    refit: refit_service.RefitService | None = None
    scheduler: scheduler_service.SchedulerService | None = None
    wiring: InProcess | None = None
    """Every service and client of the cluster, wired as `numafit run` wires each."""
    scheduler_host: str = "127.0.0.1"
    scheduler_port: int = 0
    """Where the extender and webhook listen (0: a free port; `numafit up` names one)."""
    _socket_dirs: list[Path] = field(default_factory=list)

    def _registry(self, name: str) -> CollectorRegistry:
        registry = self.registries[name] = CollectorRegistry(auto_describe=True)
        return registry

    async def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        progress("starting nats-server and the Kubernetes API emulator")
        await asyncio.to_thread(self.nats.start)
        await self.emulator.start()
        self.emulator.write_kubeconfig(self.workdir / "kubeconfig")
        wiring = self.wiring = InProcess(self.nats.url, self.workdir / "kubeconfig")
        self.kube = await wiring.kube("numafit-simulate")
        for spec in self.scenario.nodes:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": spec.name},
                # The version its kubelet emulator plays, as a kubelet reports its own.
                "status": {"nodeInfo": {"kubeletVersion": spec.kubelet_version}},
            }
            await self.kube.create_node(body)

        progress("starting accounting, refit and the scheduler extender")
        config = self.scenario.config
        self.accounting = await wiring.start(
            accounting_service.spec(accounting_service.AccountingOptions(config=config)),
            client_name="accounting",
            registry=self._registry("accounting"),
        )
        self.refit = await wiring.start(
            refit_service.spec(refit_service.RefitOptions(config=config)),
            client_name="refit",
            registry=self._registry("refit"),
        )
        self.scheduler = await wiring.start(
            scheduler_service.spec(
                scheduler_service.SchedulerOptions(
                    config=config, host=self.scheduler_host, port=self.scheduler_port
                )
            ),
            client_name="scheduler",
            registry=self._registry("scheduler"),
        )
        self.emulator.admission = emulator_admission_hook(self.scheduler.admission)

        for spec in self.scenario.nodes:
            progress(f"starting kubelet and device plugin on {spec.name}")
            await self._start_node(wiring, spec)
        async with asyncio.timeout(30):
            for sim in self.nodes.values():
                await sim.plugin.inventory_registered.wait()
            await self.scheduler.read_model.ready.wait()
            await self.scheduler.nodes.listed.wait()  # every node's kubelet version known
            for name in self.nodes:
                await self.topology_seen(name)

    async def _start_node(self, wiring: InProcess, spec: NodeSpec) -> None:
        directory = Path(tempfile.mkdtemp(prefix="nf-", dir="/tmp"))  # short unix socket paths
        self._socket_dirs.append(directory)
        publisher = None
        if spec.node_resource_topology:
            # The node's topology-updater: its own client, as NFD's runs in its own pod.
            sink = TopologyApi(await wiring.kube(f"topology-updater-{spec.name}"))
            publisher = TopologyPublisher(sink, spec.name, spec.topology_policy)
        kubelet = KubeletEmulator(
            KubeletConfig(
                directory=directory,
                node_name=spec.name,
                topology_policy=spec.topology_policy,
                cpus=spec.cpus,
                version=spec.kubelet_version,
            ),
            publisher,
        )
        await kubelet.start()
        registry = CollectorRegistry(auto_describe=True)
        config = PluginConfig(
            node=spec.name, directory=directory, replicas=DEFAULT_REPLICAS, watch_interval=0.2
        )
        plugin = await wiring.start(
            deviceplugin_service.spec(
                deviceplugin_service.PluginOptions(config, SimulatedBackend(spec.gpus))
            ),
            client_name=f"deviceplugin-{spec.name}",
            registry=registry,
        )
        replicas = sum(g.replicas or DEFAULT_REPLICAS for g in spec.gpus)
        async with asyncio.timeout(30):
            await kubelet.wait_for_devices(RESOURCE, replicas)
        await kubelet.publish_topology()
        self.nodes[spec.name] = SimNode(spec, kubelet, plugin, registry)

    async def stop(self) -> None:
        wiring = self.wiring
        for node in self.nodes.values():
            if wiring is not None:
                with contextlib.suppress(Exception):
                    await wiring.stop(node.plugin, 1.0)
            with contextlib.suppress(Exception):
                await node.kubelet.stop()
        if wiring is not None:
            with contextlib.suppress(Exception):
                await wiring.close(1.0)  # the scheduler, refit, accounting; every client
        with contextlib.suppress(Exception):
            await self.emulator.stop()
        await asyncio.to_thread(self.nats.stop)
        for directory in [*self._socket_dirs, self.workdir]:
            shutil.rmtree(directory, ignore_errors=True)

    async def topology_seen(self, node: str) -> None:
        """Until the scheduler has seen the node's last published NodeResourceTopology (the
        next decision is then made on the figures, not on what the scheduler assumes)."""
        assert self.scheduler is not None
        publisher = self.nodes[node].kubelet.topology
        if publisher is None or publisher.last_sampled_at is None:
            return
        sampled = publisher.last_sampled_at
        watch = self.scheduler.topology
        seen = watch.state.topology

        def caught_up() -> bool:
            topology = seen(node)
            return topology is not None and (topology.sampled_at or 0.0) >= sampled

        async with asyncio.timeout(10):
            await watch.wait_until(caught_up)

    async def predictions_settled(self) -> None:
        """Every prediction the scheduler can judge is judged (the counts are final)."""
        assert self.scheduler is not None
        await self.scheduler.topology.settle()

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
