"""`numafit bench`'s real-control-plane run: plain kube-scheduler beside numafit, on the same
real etcd, kube-apiserver and kube-controller-manager (shared/testing/realk8s), when the
binaries are there (`KUBEBUILDER_ASSETS`).

The same fake GPU nodes (Nodes whose status says Ready with `nvidia.com/gpu` capacity, their
GPUs registered through accounting as the device plugin registers them) serve every run, and
each configuration schedules the same number of 1-GPU / 1000 MiB pods, the configurations
alternating (plain, numafit binpack, numafit spread, then again) so that a shared machine's
drift affects them alike. Plain pods ask for `nvidia.com/gpu` only and go to an upstream
kube-scheduler without an extender; numafit's pods go to a second kube-scheduler, configured
as the chart renders it (the extender over HTTPS for filter, prioritize and bind), with
`hami.io/node-scheduler-policy` naming the policy. Kubelet's part for numafit's pods (its
Allocate, which releases the node lock) is stood in for by an agent that watches the pods as
kubelet does and, node by node, asks accounting for the pending pod and consumes it, as the
device plugin does at Allocate.

Per run: pods bound per second counted from the first creation to the last pod bound (or to
the end of the wait, when some never are), the latency from each pod's creation to the watch
showing it bound (p50, p99), the API writes to pods per pod (PATCH, status, Binding; not the
creations, the deletions or Allocate's own consume), and the pods never bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.accounting_client import AccountingClient
from shared.core import keys
from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.service import natsconn, processes
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from shared.testing.nats_server import NatsServer
from shared.testing.realk8s import assets as realk8s_assets
from shared.testing.realk8s.plane import ControlPlane
from shared.tools.bench_real_cluster import (
    NAMESPACE,
    SETTLE_WITHIN,
    AllocateAgent,
    Cluster,
    profile_delta,
    until,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from kubernetes_asyncio import client

    from shared.testing.realk8s.assets import Assets

    Progress = Callable[[str], None]

CONFIGURATIONS = ("plain", "binpack", "spread")
PLAIN_SCHEDULER = "default-scheduler"
POD_MEMORY = 1000
BOUND_WITHIN = 60.0
"""Seconds a run waits, after its last pod was created, for every pod to be bound."""
CREATORS = 8
"""Pods created at once (a client's parallel requests, as a controller creating a ReplicaSet's
pods would send them)."""


def skipped_reason() -> str | None:
    """Why the real run cannot happen here (one line), or None when it can."""
    found = realk8s_assets.find()
    return found if isinstance(found, str) else None


# --- objects ---------------------------------------------------------------------------------


def _pod(name: str, configuration: str) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": 1}
    annotations: dict[str, str] = {}
    scheduler = PLAIN_SCHEDULER
    if configuration != "plain":
        limits["nvidia.com/gpumem"] = POD_MEMORY
        annotations[keys.NODE_POLICY] = configuration
        scheduler = DEFAULT_SCHEDULER_NAME
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "numafit.invalid/bench",
                    "imagePullPolicy": "Never",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def scheduler_configs(extender_url: str, ca_file: Path) -> dict[str, dict[str, Any]]:
    """The two kube-schedulers: plain (no extender), and numafit's profile with the extender
    as the chart configures it."""
    base = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
    }
    managed = [
        {"name": name, "ignoredByScheduler": True}
        for name in (
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
        )
    ]
    numafit = {
        **base,
        "profiles": [{"schedulerName": DEFAULT_SCHEDULER_NAME}],
        "extenders": [
            {
                "urlPrefix": extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 1,
                "httpTimeout": "5s",
                "nodeCacheCapable": True,
                "enableHTTPS": True,
                "tlsConfig": {"caFile": str(ca_file)},
                "ignorable": False,
                "managedResources": managed,
            }
        ],
    }
    plain = {**base, "profiles": [{"schedulerName": PLAIN_SCHEDULER}]}
    return {"plain": plain, "numafit": numafit}


# --- the cluster -----------------------------------------------------------------------------


async def one_run(
    cluster: Cluster, agent: AllocateAgent, configuration: str, pods: int, run: int
) -> dict[str, Any]:
    names = [f"{configuration}-{run}-{i:04d}" for i in range(pods)]
    created_at: dict[str, float] = {}
    writes_before = await cluster.writes()
    profile_before = await cluster.profile(configuration)
    cpu_before = cluster.cpu()
    consumed_before = agent.consumed
    admitted_before = len(agent.admissions)
    semaphore = asyncio.Semaphore(CREATORS)

    async def create(name: str) -> None:
        async with semaphore:
            # From the request: kube-scheduler may bind the pod before this client has read
            # the creation's answer.
            created_at[name] = time.perf_counter()
            await cluster.kube.create_pod(NAMESPACE, _pod(name, configuration))

    all_bound = agent.expect(names)
    started = time.perf_counter()
    await asyncio.gather(*(create(n) for n in names))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_bound.wait(), BOUND_WITHIN)
    never = [n for n in names if n not in agent.bound_at]
    end = max((agent.bound_at[n] for n in names if n in agent.bound_at), default=started)
    if never:
        end = time.perf_counter()
    latencies = sorted(agent.bound_at[n] - created_at[n] for n in names if n in agent.bound_at)
    # Allocate's own write (the consume) is the device plugin's, not scheduling's.
    consumed = agent.consumed - consumed_before
    writes = await cluster.writes() - writes_before - consumed
    profile: dict[str, Any] = dict(
        profile_delta(profile_before, await cluster.profile(configuration))
    )
    admissions = agent.admissions[admitted_before:]
    if admissions:
        # The lock's kubelet side: waiting for the node's turn, the plugin's lookup, Allocate.
        for key, (a, b) in (
            ("admit_queued_ms", (0, 1)),
            ("pending_ms", (1, 2)),
            ("consume_ms", (2, 3)),
        ):
            profile[key] = round(1000 * statistics.mean(t[b] - t[a] for t in admissions), 2)
    cpu_after = cluster.cpu()
    profile["cpu_ms_per_pod"] = {
        name: round(1000 * (cpu_after[name] - cpu_before.get(name, 0.0)) / pods, 2)
        for name in cpu_after
    }
    elapsed = end - started
    return {
        "pods_per_s": round(pods / elapsed, 1) if elapsed > 0 else 0.0,
        "never_bound": len(never),
        "bind_latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "bind_latency_p99_s": (
            round(latencies[max(int(len(latencies) * 0.99) - 1, 0)], 3) if latencies else None
        ),
        "api_writes_per_pod": round(writes / pods, 2),
        # How tightly the run packed its pods: binpack fills few nodes, spread uses them all.
        "nodes_used": len({agent.node_of[n] for n in names if n in agent.node_of}),
        "profile": profile,
    }


# --- the whole real run ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _numafit(
    plane: ControlPlane, nats_url: str, tmp: Path
) -> AsyncIterator[tuple[str, list[processes.ServiceProcess]]]:
    """Accounting and the scheduler extender (HTTPS, as the chart serves it) on the real API
    server, as processes of their own; yields the extender's URL."""
    # ECDSA P-256, as the chart's cert-manager Certificate issues it (kube-scheduler opens a
    # connection, and pays a handshake, whenever more than two of its calls overlap).
    serving = plane.authority.issue(
        "numafit-scheduler",
        common_name="numafit-scheduler",
        dns=("localhost",),
        ips=("127.0.0.1",),
        ecdsa=True,
    )
    listen = processes.free_port()
    started: list[processes.ServiceProcess] = []
    try:
        for name, extra in (
            ("accounting", ()),
            (
                "scheduler",
                (
                    "--listen-host", "127.0.0.1", "--listen-port", str(listen),
                    "--tls-cert-file", str(serving.cert), "--tls-key-file", str(serving.key),
                ),
            ),
        ):  # fmt: skip
            started.append(
                processes.start_service(
                    name,
                    nats_url=nats_url,
                    kubeconfig=plane.kubeconfig,
                    log=tmp / f"{name}.log",
                    extra_args=extra,
                )
            )
            await started[-1].wait_ready()
        yield f"https://127.0.0.1:{listen}", started
    finally:
        for service in reversed(started):
            await service.stop()


async def bench_real_scheduling(
    found: Assets,
    *,
    nodes: int,
    pods: int,
    runs: int,
    progress: Progress,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Every configuration `runs` times, alternating. `workdir` keeps the components' logs
    (a temporary directory otherwise)."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="numafit-real-")))
        tmp = workdir
        progress("real control plane: starting etcd, kube-apiserver, kube-controller-manager")
        plane = ControlPlane(found, tmp)
        try:
            await asyncio.to_thread(plane.start)
            return await _runs(plane, tmp, nodes=nodes, pods=pods, runs=runs, progress=progress)
        finally:
            await asyncio.to_thread(plane.stop)


async def _runs(
    plane: ControlPlane, tmp: Path, *, nodes: int, pods: int, runs: int, progress: Progress
) -> dict[str, Any]:
    api: client.ApiClient = await api_client(str(plane.kubeconfig))
    with NatsServer() as nats:
        connection = await natsconn.connect(nats.url, "bench-real")
        nc = connection.client
        try:
            kube = Kube(api, "bench")
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            await kube.core.create_namespace(namespace, _preload_content=False)  # type: ignore[arg-type]
            await until(
                lambda: _has_default_account(kube), SETTLE_WITHIN, "the namespace's ServiceAccount"
            )
            accounting = AccountingClient(nc)
            async with _numafit(plane, nats.url, tmp) as (extender_url, services):
                cluster = Cluster(plane, kube, nats.url)
                cluster.extender_metrics = f"{services[-1].metrics_url}/metrics"
                cluster.pids = {service.name: service.process.pid for service in services}
                cluster.pids |= {c.name: c.process.pid for c in plane.processes.children}
                await cluster.create_nodes(nodes, accounting)
                configs = scheduler_configs(extender_url, plane.ca_file)
                for name, config in configs.items():
                    child, port = await asyncio.to_thread(
                        plane.start_scheduler, config, f"kube-scheduler-{name}"
                    )
                    cluster.scheduler_ports[name] = port
                    cluster.pids[f"kube-scheduler-{name}"] = child.process.pid
                agent = AllocateAgent(kube, accounting)
                watcher = asyncio.create_task(agent.run())
                try:
                    results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGURATIONS}
                    for run in range(runs):
                        for configuration in CONFIGURATIONS:
                            figures = await one_run(cluster, agent, configuration, pods, run)
                            results[configuration].append(figures)
                            progress(
                                f"real scheduling run {run + 1}/{runs} {configuration}: "
                                f"{figures['pods_per_s']} pods/s, "
                                f"{figures['never_bound']} never bound"
                            )
                            await cluster.clear(accounting)
                finally:
                    watcher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await watcher
                    await agent.stop()
                if agent.errors:
                    raise RuntimeError("; ".join(agent.errors[:3]))
            summary = {c: summarize_runs(results[c]) for c in CONFIGURATIONS}
            return {"nodes": nodes, "pods": pods, **summary}
        finally:
            await nc.close()
            await api.close()


async def _has_default_account(kube: Kube) -> bool:
    try:
        await kube.core.read_namespaced_service_account(
            "default", NAMESPACE, _preload_content=False
        )
    except Exception:  # not there yet (404), or the API server still settling
        return False
    return True


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the runs (the worst for never_bound), and the runs."""

    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return round(float(statistics.median(values)), 3) if values else None

    return {
        "pods_per_s": median("pods_per_s"),
        "never_bound": max(r["never_bound"] for r in runs),
        "bind_latency_p50_s": median("bind_latency_p50_s"),
        "bind_latency_p99_s": median("bind_latency_p99_s"),
        "api_writes_per_pod": median("api_writes_per_pod"),
        "runs": runs,
    }
