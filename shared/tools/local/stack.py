"""The local stack: everything `numafit up` starts, announces and stops.

Start: check the fixed ports are free (one clear line if one is not), start `numafit
simulate`'s cluster on them (nats-server, the API emulator with the webhook, accounting, refit,
the scheduler extender, per node a kubelet emulator and the real device plugin), serve every
service's /healthz, /readyz and /metrics on compose's ports, write the kubeconfig, the
Prometheus configuration and `stack.json` into the state directory, start the scheduling loop,
then the scenario's pods and the load. Stop: the reverse, every part bounded; nothing keeps
running (nats-server is a child process and is terminated).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from shared.service import kube_io
from shared.service.health import HealthServer
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.nats_server import NatsServer
from shared.tools.local import defaults, promconfig
from shared.tools.local.defaults import StackError
from shared.tools.local.events import EventSink
from shared.tools.local.kubelets import Kubelets
from shared.tools.local.load import Load
from shared.tools.local.realplane import NodeAgent, RealCluster, ensure_namespace
from shared.tools.local.scheduling_loop import SchedulingLoop
from shared.tools.simulate.cluster import SimCluster
from shared.tools.simulate.driver import Driver
from shared.tools.simulate.scenario import CreatePod

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from prometheus_client import CollectorRegistry

    from shared.service.health import Readiness
    from shared.tools.simulate.scenario import Scenario

log = logging.getLogger("numafit.up")

SCENARIO_POD_TIMEOUT = 30.0
"""Seconds a scenario pod's first scheduling attempt may take before the next step."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    scenario: Scenario
    state_dir: Path = field(default_factory=defaults.state_dir)
    host: str = defaults.HOST
    api_port: int = defaults.API_PORT
    nats_port: int = defaults.NATS_PORT
    extender_port: int = defaults.EXTENDER_PORT
    metrics_port_base: int = defaults.METRICS_PORT_BASE
    """0: every metrics port is a free one."""
    load: bool = False
    load_rate: float = defaults.LOAD_RATE
    load_max_pods: int = defaults.LOAD_MAX_PODS
    load_namespace: str = defaults.LOAD_NAMESPACE
    seed: int = 7
    scrape_interval: str = defaults.SCRAPE_INTERVAL
    control_plane: str = "emulator"
    """emulator: numafit's API emulator and scheduling loop; real: etcd, kube-apiserver,
    kube-controller-manager and kube-scheduler with the extender (shared.tools.local.realplane)."""

    @property
    def real(self) -> bool:
        return self.control_plane == "real"

    def metrics_port(self, position: int) -> int:
        return self.metrics_port_base + position if self.metrics_port_base else 0

    def fixed_ports(self) -> dict[str, int]:
        """Every port named by the options (0s are chosen by the system), by what uses it."""
        ports = {
            "the Kubernetes API (--api-port)": self.api_port,
            "NATS (--nats-port)": self.nats_port,
            "the scheduler extender (--extender-port)": self.extender_port,
        }
        names = [*defaults.SERVICES, *(f"deviceplugin {n.name}" for n in self.scenario.nodes)]
        for position, name in enumerate(names):
            ports[f"{name} metrics (--metrics-port-base)"] = self.metrics_port(position)
        return {what: port for what, port in ports.items() if port}


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    """scheduler, accounting, refit, or deviceplugin"""
    node: str
    """The device plugin's node; empty for the other services."""
    port: int


class LocalStack:
    def __init__(self, options: UpOptions) -> None:
        self.options = options
        nats = NatsServer(port=options.nats_port or None, host=options.host)
        if options.real:
            # StackError, one line naming KUBEBUILDER_ASSETS, where the binaries are absent.
            self.cluster: SimCluster = RealCluster(
                options.scenario,
                nats=nats,
                scheduler_host=options.host,
                scheduler_port=options.extender_port,
                api_port=options.api_port,
            )
        else:
            self.cluster = SimCluster(
                options.scenario,
                nats=nats,
                emulator=KubeEmulator(host=options.host, port=options.api_port),
                scheduler_host=options.host,
                scheduler_port=options.extender_port,
            )
        self.agent: NodeAgent | None = None
        self.health: list[HealthServer] = []
        self.endpoints: list[Endpoint] = []
        self.loop: SchedulingLoop | None = None
        self.load: Load | None = None
        self._session: aiohttp.ClientSession | None = None
        self.ready_seconds = 0.0

    @property
    def state_dir(self) -> Path:
        return self.options.state_dir

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def prometheus_config(self) -> Path:
        return self.state_dir / "prometheus.yml"

    async def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        began = time.monotonic()
        options = self.options
        defaults.check_ports(options.host, options.fixed_ports())
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StackError(f"cannot create the state directory {self.state_dir}: {exc}") from exc
        await self.cluster.start(progress)
        if isinstance(self.cluster, RealCluster):
            # The admin's token kubeconfig: kubectl works as with the emulator's.
            _write(self.kubeconfig, self.cluster.admin_kubeconfig.read_text())
            os.chmod(self.kubeconfig, 0o600)
        else:
            self.cluster.emulator.write_kubeconfig(self.kubeconfig)
        progress("serving every service's metrics")
        await self._serve_metrics()
        wiring = self.cluster.wiring
        assert wiring is not None
        kube = await wiring.kube("numafit-up")
        self._session = aiohttp.ClientSession()
        events = EventSink(kube)
        kubelets = Kubelets(Driver(self.cluster, self._session), self.cluster.nodes, events)
        if options.real:
            progress("starting the nodes' agent (kube-scheduler schedules)")
            self.agent = NodeAgent(kube, kubelets, options.scenario.nodes)
            await self.agent.start()
            for namespace in self._namespaces():
                await ensure_namespace(kube, namespace)
        else:
            progress("starting the scheduling loop")
            self.loop = SchedulingLoop(
                kube, self.cluster.scheduler_url, self._session, kubelets, events
            )
            await self.loop.start()
        self._write_state()
        await self._create_scenario_pods(kube, progress)
        if options.load:
            self.load = Load(
                kube,
                rate=options.load_rate,
                max_pods=options.load_max_pods,
                namespace=options.load_namespace,
                seed=options.seed,
            )
            self.load.start()
        self.ready_seconds = time.monotonic() - began
        log.info("numafit is up", extra={"seconds": round(self.ready_seconds, 2)})

    async def failure(self) -> str:
        """Wait until a service can no longer do its job (its readiness failed for good, as
        `numafit run` would exit 1 for); what failed and why."""
        services = {name: r for name, _, _, r in self._parts()}
        waits = {
            asyncio.ensure_future(readiness.failed.wait()): name
            for name, readiness in services.items()
        }
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in waits:
                future.cancel()
        name = waits[next(iter(done))]
        return f"{name} failed: {services[name].failure}"

    def _parts(self) -> list[tuple[str, str, CollectorRegistry, Readiness]]:
        """Every service: its name (with the node for a device plugin), node, registry,
        readiness."""
        cluster = self.cluster
        assert cluster.scheduler is not None
        assert cluster.accounting is not None
        assert cluster.refit is not None
        parts: list[tuple[str, str, CollectorRegistry, Readiness]] = [
            ("scheduler", "", cluster.registries["scheduler"], cluster.scheduler.readiness),
            ("accounting", "", cluster.registries["accounting"], cluster.accounting.readiness),
            ("refit", "", cluster.registries["refit"], cluster.refit.readiness),
        ]
        for spec in self.options.scenario.nodes:
            node = cluster.nodes[spec.name]
            parts.append(
                (f"deviceplugin/{spec.name}", spec.name, node.registry, node.plugin.readiness)
            )
        return parts

    async def _serve_metrics(self) -> None:
        for position, (name, node_name, registry, readiness) in enumerate(self._parts()):
            server = HealthServer(
                registry, readiness, self.options.host, self.options.metrics_port(position)
            )
            try:
                await server.start()
            except OSError as exc:
                raise StackError(f"cannot serve {name} metrics: {exc}") from exc
            self.health.append(server)
            self.endpoints.append(Endpoint(name.split("/")[0], node_name, server.port))

    def _write_state(self) -> None:
        targets = [
            promconfig.Target(
                f"numafit-{e.name}",
                f"{self.local_host}:{e.port}",
                {"node": e.node} if e.node else {},
            )
            for e in self.endpoints
        ]
        _write(
            self.prometheus_config,
            promconfig.render(targets, self.options.scrape_interval),
        )
        _write(
            self.state_dir / "stack.json",
            orjson.dumps(self.describe(), option=orjson.OPT_INDENT_2).decode() + "\n",
        )

    @property
    def local_host(self) -> str:
        """The address a client on this machine uses (a wildcard is reached via loopback)."""
        host = self.options.host
        if host in ("0.0.0.0", ""):
            return "127.0.0.1"
        if host == "::":
            return "[::1]"
        return f"[{host}]" if ":" in host else host

    def describe(self) -> dict[str, Any]:
        """What `stack.json` holds: where everything is."""
        nats_port = self.cluster.nats.port
        return {
            "kubeconfig": str(self.kubeconfig),
            "api": (
                self.cluster.api_url
                if isinstance(self.cluster, RealCluster)
                else self.cluster.emulator.url
            ),
            "controlPlane": self.options.control_plane,
            "nats": f"nats://{self.local_host}:{nats_port}",
            "extender": self.cluster.scheduler_url,
            "metrics": {
                (
                    f"deviceplugin/{e.node}" if e.node else e.name
                ): f"http://{self.local_host}:{e.port}/metrics"
                for e in self.endpoints
            },
            "prometheusConfig": str(self.prometheus_config),
            "nodes": [n.name for n in self.options.scenario.nodes],
            "load": self.options.load,
        }

    async def _create_scenario_pods(
        self, kube: kube_io.Kube, progress: Callable[[str], None]
    ) -> None:
        """The scenario's steps through the API, in order: each pod's first scheduling attempt
        (admission included) ends before the next step."""
        for step in self.options.scenario.steps:
            if isinstance(step, CreatePod):
                progress(f"creating {step.key}")
                namespace = step.manifest["metadata"].get("namespace", "default")
                try:
                    created = await kube.create_pod(namespace, step.manifest)
                except kube_io.KubeError as exc:
                    log.warning("scenario pod refused", extra={"pod": step.key, "error": str(exc)})
                    continue
                uid = created["metadata"]["uid"]
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SCENARIO_POD_TIMEOUT):
                        if self.agent is not None:
                            await self.agent.first_attempt(uid)
                        elif self.loop is not None:
                            await self.loop.first_attempt(uid)
            else:
                progress(f"deleting {step.namespace}/{step.name}")
                with contextlib.suppress(kube_io.NotFound):
                    await kube.delete_pod(step.namespace, step.name)

    def _namespaces(self) -> list[str]:
        """Every namespace the scenario and the load create pods in (the real API server
        refuses a pod in a namespace that does not exist; the emulator makes it)."""
        names = {"default"}
        for step in self.options.scenario.steps:
            if isinstance(step, CreatePod):
                names.add(step.manifest["metadata"].get("namespace", "default"))
        if self.options.load:
            names.add(self.options.load_namespace)
        return sorted(names)

    async def stop(self) -> None:
        if self.load is not None:
            await self.load.stop()
        if self.loop is not None:
            await self.loop.stop()
        if self.agent is not None:
            await self.agent.stop()
        for server in self.health:
            with contextlib.suppress(Exception):
                await server.stop()
        if self._session is not None:
            await self._session.close()
        await self.cluster.stop()
        log.info("numafit is down")


def _write(path: Path, text: str) -> None:
    """Atomically: whoever reads the file never sees half of it."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
