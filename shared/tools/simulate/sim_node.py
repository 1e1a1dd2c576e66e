"""`numafit run sim-node`: a simulated GPU node for docker compose and demos against real services.

It plays the parts of a cluster that a laptop lacks: it creates its Node object, runs a kubelet
emulator (Topology Manager + static CPU manager) on the device-plugin directory it shares with
the real device plugin, publishes the node's NodeResourceTopology after every admission and
release as NFD's topology-updater would (with `--node-resource-topology`), logs each pod
placed with the refit outcome of each container as kubelet saw it, and, as kube-scheduler and
workload owners would, creates a pod every `--interval` seconds from a small mix (with and
without `hami.io/numa-alignment`, with init containers and sidecars), schedules it through the
extender, admits it, and deletes the oldest once `--max-pods` run, so the dashboards keep
moving (refits become rare once the scheduler predicts from NodeResourceTopology).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import random
import ssl
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.messages import MessageError, SnapshotReply, SnapshotRequest, TrackedPodWire
from shared.service import kube_io, natsconn
from shared.service.health import HealthServer, Readiness
from shared.service.kube import api_client
from shared.service.kube_topology import TopologyApi
from shared.service.lifecycle import stop_on_signals
from shared.service.logs import add_log_level_argument, configure_logging
from shared.testing.kubelet_emulator import (
    KubeletConfig,
    KubeletEmulator,
    TopologyPolicy,
    TopologyPublisher,
    parse_cpus,
)
from shared.tools.simulate.driver import RESOURCE, Driver, NodeHandle, Observed, observed_refit
from shared.tools.simulate.scenario import CreatePod, DeletePod
from svc_deviceplugin.discovery import SimulatedBackend, TopologyError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.core.accounting import TrackedPod

log = logging.getLogger("numafit.sim-node")


@dataclass
class _Node:
    kubelet: KubeletEmulator
    numa_of: dict[str, int]
    none_policy: bool

    @property
    def gpu_numa(self) -> dict[str, int]:
        return self.numa_of

    @property
    def policy_none(self) -> bool:
        return self.none_policy

    def refit_outcome(self, pod_uid: str, index: int, seen: Observed) -> str:
        # The device plugin runs in its own process: judge from what kubelet saw.
        return observed_refit(seen)


class _Environment:
    def __init__(
        self, kube: kube_io.Kube, url: str, nodes: dict[str, _Node], accounting: AccountingClient
    ) -> None:
        self._kube = kube
        self._url = url
        self._nodes = nodes
        self.accounting = accounting

    @property
    def api(self) -> kube_io.Kube:
        return self._kube

    @property
    def scheduler_url(self) -> str:
        return self._url

    @property
    def node_handles(self) -> Mapping[str, NodeHandle]:
        return self._nodes

    async def topology_seen(self, node: str) -> None:
        """Pods come every few seconds here: the scheduler sees each update long before."""

    async def tracked(self, uid: str) -> TrackedPod | None:
        node = next(iter(self._nodes))
        request = SnapshotRequest(node=node, pod_uid=uid)
        try:
            reply = await self.accounting.ask(request, SnapshotReply)
        except AccountingUnavailable:
            return None
        try:
            return reply.pod.to_core() if isinstance(reply.pod, TrackedPodWire) else None
        except MessageError:
            return None


async def _registered(accounting: AccountingClient, node: str) -> bool:
    try:
        reply = await accounting.ask(SnapshotRequest(node=node), SnapshotReply)
    except AccountingUnavailable:
        return False
    nodes = reply.nodes or ()
    return bool(nodes and nodes[0].devices)


def _container(name: str, mem: int, cores: int, cpu: int, sidecar: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "image": "registry.local/workload:1",
        "resources": {
            "limits": {
                "nvidia.com/gpu": 1,
                "nvidia.com/gpumem": mem,
                "nvidia.com/gpucores": cores,
                "cpu": cpu,
                "memory": "1Gi",
            }
        },
    }
    if sidecar:
        spec["restartPolicy"] = "Always"
    return spec


def workload(number: int, rng: random.Random, namespace: str) -> dict[str, Any]:
    """One pod of the mix: mostly opted in (best-effort or strict), some with phases."""
    alignment = rng.choice(["best-effort", "best-effort", "strict", None])
    kind = rng.choice(["plain", "plain", "init", "sidecar"])
    mem = rng.choice([4000, 8000, 12000, 16000])
    annotations = {"hami.io/numa-alignment": alignment} if alignment else {}
    spec: dict[str, Any] = {
        # Routed to numafit as its webhook would (the extender schedules only its own pods).
        "schedulerName": DEFAULT_SCHEDULER_NAME,
        "containers": [_container("main", mem, rng.choice([10, 20, 30]), 2)],
    }
    if kind == "init":
        spec["initContainers"] = [_container("prepare", mem * 2, 40, 1)]
    elif kind == "sidecar":
        spec["initContainers"] = [_container("helper", 2000, 5, 1, sidecar=True)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{kind}-{number}",
            "namespace": namespace,
            "annotations": annotations,
        },
        "spec": spec,
    }


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="numafit run sim-node",
        description=(
            "A simulated GPU node for docker compose: creates its Node, runs a kubelet emulator "
            "on the device-plugin directory shared with the real device plugin, and keeps "
            "creating, scheduling (through the extender), admitting and deleting pods."
        ),
    )
    parser.add_argument(
        "--node",
        default=env.get("NODE_NAME", "sim-node-1"),
        help="this node's name, the Node it creates (env NODE_NAME; default %(default)s)",
    )
    parser.add_argument(
        "--dir",
        default="/var/lib/kubelet/device-plugins",
        help="device-plugin directory shared with the device plugin: the emulated kubelet "
        "serves kubelet.sock there (default %(default)s)",
    )
    parser.add_argument(
        "--topology",
        required=True,
        metavar="FILE",
        help="the GPU topology file (YAML or JSON), the same one the device plugin is given",
    )
    parser.add_argument(
        "--topology-policy",
        default="single-numa-node",
        choices=[p.value for p in TopologyPolicy],
        help="the emulated kubelet's Topology Manager policy (default %(default)s)",
    )
    parser.add_argument(
        "--cpus",
        default="0=32,1=32",
        metavar="NUMA=COUNT,...",
        help="exclusive CPUs the static CPU manager has per NUMA node (default %(default)s)",
    )
    parser.add_argument(
        "--node-resource-topology",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="publish the node's NodeResourceTopology after every admission and release, as "
        "NFD's topology-updater does (the scheduler then predicts kubelet's NUMA choice, and "
        "refits become rare)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG"),
        help="kubeconfig of the API server (env KUBECONFIG); in-cluster configuration when absent",
    )
    parser.add_argument(
        "--nats-url",
        default=env.get("NUMAFIT_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server URL(s), comma-separated (env NUMAFIT_NATS_URL; default %(default)s)",
    )
    parser.add_argument(
        "--scheduler-url",
        default="http://127.0.0.1:8888",
        help="the scheduler extender's base URL, for /filter, /prioritize and /bind (default "
        "%(default)s)",
    )
    parser.add_argument(
        "--insecure", action="store_true", help="skip the extender's TLS certificate check"
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between new pods (default %(default)s)",
    )
    parser.add_argument(
        "--max-pods",
        type=int,
        default=12,
        metavar="N",
        help="pods kept running; the oldest is deleted beyond it (default %(default)s)",
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds to wait for the device plugin to register and its inventory to reach "
        "accounting (default %(default)s)",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=0,
        metavar="N",
        help="stop after creating N pods (default 0: never)",
    )
    parser.add_argument(
        "--namespace",
        default="workloads",
        help="namespace of the pods it creates (default %(default)s)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=7,
        help="seed of the pod mix, so that a run can be repeated (default %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9105,
        help="port of /healthz, /readyz and /metrics (0: a free one; default %(default)s)",
    )
    add_log_level_argument(parser)
    return parser


async def run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    gpus = SimulatedBackend.from_file(Path(args.topology)).list_gpus()
    registry = CollectorRegistry(auto_describe=True)
    created = Counter(
        "numafit_simnode_pods",
        "Pods the simulated node created, by outcome.",
        ["phase"],
        registry=registry,
    )
    readiness = Readiness("node")
    health = HealthServer(registry, readiness, "0.0.0.0", args.metrics_port)
    await health.start()
    nc = (await natsconn.connect(args.nats_url, "sim-node", initial_timeout=60)).client
    api = await api_client(args.kubeconfig)
    kube = kube_io.Kube(api, "numafit-sim-node")
    policy = TopologyPolicy(args.topology_policy)
    publisher = (
        TopologyPublisher(TopologyApi(kube), args.node, policy)
        if args.node_resource_topology
        else None
    )
    kubelet = KubeletEmulator(
        KubeletConfig(
            directory=Path(args.dir),
            node_name=args.node,
            topology_policy=policy,
            cpus=parse_cpus(args.cpus),
        ),
        publisher,
    )
    ssl_context: ssl.SSLContext | bool = False if args.insecure else ssl.create_default_context()
    try:
        with contextlib.suppress(kube_io.KubeError):  # it may exist from an earlier run
            await kube.create_node(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": args.node}}
            )
        await kubelet.start()
        node = _Node(kubelet, {g.uuid: g.numa for g in gpus}, args.topology_policy == "none")
        accounting = AccountingClient(nc)
        env = _Environment(kube, args.scheduler_url, {args.node: node}, accounting)
        log.info("waiting for the device plugin and its inventory", extra={"node": args.node})
        async with asyncio.timeout(args.startup_timeout):
            await kubelet.wait_for_devices(RESOURCE, sum(g.replicas or 10 for g in gpus))
            while not await _registered(accounting, args.node):  # noqa: ASYNC110 - remote state
                await asyncio.sleep(0.2)
        await kubelet.publish_topology()
        connector = aiohttp.TCPConnector(ssl=ssl_context)
        async with aiohttp.ClientSession(connector=connector) as session:
            driver = Driver(env, session)
            readiness.set("node")
            rng = random.Random(args.seed)
            running: deque[tuple[str, str]] = deque()
            for number in itertools.count(1):
                if stop.is_set() or (args.count and number > args.count):
                    break
                manifest = workload(number, rng, args.namespace)
                try:
                    report = await driver.create(CreatePod(manifest, 0))
                except Exception as exc:  # keep generating: the services may be restarting
                    log.warning("pod not placed", extra={"error": str(exc)})
                else:
                    created.labels(report.phase).inc()
                    log.info(
                        "pod placed",
                        extra={
                            "pod": report.key,
                            "phase": report.phase,
                            "reason": report.reason,
                            "refit": [c.refit for c in report.containers],
                        },
                    )
                    running.append((report.namespace, report.name))
                while len(running) > args.max_pods:
                    namespace, name = running.popleft()
                    with contextlib.suppress(Exception):
                        await driver.delete(DeletePod(namespace, name, 0))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.interval):
                        await stop.wait()
    finally:
        await kubelet.stop()
        await api.close()
        await nc.close()
        await health.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # a bad topology file is bad input: one line, exit 2, as with the device plugin
        SimulatedBackend.from_file(Path(args.topology))
    except TopologyError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_level, "json")

    async def entry() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        await run(args, stop)

    try:
        asyncio.run(entry())
    except Exception as exc:  # one line for operators
        log.error("sim-node failed", extra={"error": str(exc)})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
