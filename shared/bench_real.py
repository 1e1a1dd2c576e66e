"""`numafit bench`'s real-control-plane run: plain kube-scheduler beside numafit, on the same
real etcd, kube-apiserver and kube-controller-manager (shared/realk8s), when the binaries are
there (`KUBEBUILDER_ASSETS`).

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
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared import messages
from shared.accounting_client import AccountingClient
from shared.core import codec, keys
from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.nats_server import NatsServer
from shared.realk8s import assets as realk8s_assets
from shared.realk8s.plane import ControlPlane
from shared.service import natsconn, processes
from shared.service.kube import api_client
from shared.service.kube_io import Kube

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from kubernetes_asyncio import client

    from shared.realk8s.assets import Assets

    Progress = Callable[[str], None]

NAMESPACE = "bench"
CONFIGURATIONS = ("plain", "binpack", "spread")
PLAIN_SCHEDULER = "default-scheduler"
GPUS_PER_NODE = 8
REPLICAS = 10
GPU_MEMORY = 81920
POD_MEMORY = 1000
BOUND_WITHIN = 60.0
"""Seconds a run waits, after its last pod was created, for every pod to be bound."""
CREATORS = 8
"""Pods created at once (a client's parallel requests, as a controller creating a ReplicaSet's
pods would send them)."""
SETTLE_WITHIN = 60.0
"""Seconds the cluster gets to forget a run's pods (deleted, released by accounting)."""
POLL = 0.05
"""Seconds between two looks at foreign state settling (the API server, accounting)."""
WRITE_VERBS = frozenset({"POST", "PATCH", "PUT"})
CONSUME_TRIES = 5
RETRIED = frozenset({"deadline_exceeded", "api_error", "conflict"})
POD_WRITES = frozenset({"", "binding", "status"})


def skipped_reason() -> str | None:
    """Why the real run cannot happen here (one line), or None when it can."""
    found = realk8s_assets.find()
    return found if isinstance(found, str) else None


# --- objects ---------------------------------------------------------------------------------


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def _node_status() -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {
        "cpu": "64",
        "memory": "512Gi",
        "pods": "250",
        "nvidia.com/gpu": str(GPUS_PER_NODE * REPLICAS),
    }
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "numafit bench: a node without a kubelet",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    return {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}


def _devices(node: str) -> tuple[messages.RegisterItem, ...]:
    """The node's GPUs as the device plugin registers them (HAMi's register items)."""
    return tuple(
        messages.RegisterItem(
            id=f"GPU-{node}-{i}",
            index=i,
            count=REPLICAS,
            devmem=GPU_MEMORY,
            devcore=100,
            type="NVIDIA-H100",
            numa=i // (GPUS_PER_NODE // 2),
        )
        for i in range(GPUS_PER_NODE)
    )


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


class Cluster:
    """The control plane, numafit's services and both kube-schedulers, for every run."""

    def __init__(self, plane: ControlPlane, kube: Kube, nats_url: str) -> None:
        self.plane = plane
        self.kube = kube
        self.nats_url = nats_url
        self.nodes: list[str] = []
        self.extender_metrics = ""
        """The extender's /metrics URL."""
        self.scheduler_ports: dict[str, int] = {}
        """kube-scheduler name (plain, numafit) -> its secure port (/metrics)."""
        self.pids: dict[str, int] = {}
        """Component -> process id, for the CPU each spends on a run."""

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user + system) each component has used so far."""
        used = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        used["bench"] = _cpu_seconds(os.getpid())  # the pods' creator and Allocate's agent
        return used

    async def profile(self, configuration: str) -> dict[str, float]:
        """Running totals (seconds, counts) of where one scheduling cycle spends its time:
        kube-scheduler's attempts and its scheduling algorithm (the extender's filter
        included), and the extender's /filter and /bind."""
        scheduler = "plain" if configuration == "plain" else "numafit"
        text = await asyncio.to_thread(
            self.plane.get,
            "/metrics",
            url=f"https://127.0.0.1:{self.scheduler_ports[scheduler]}",
        )
        totals = histogram_sums(
            text.decode(),
            {
                "attempt": "scheduler_scheduling_attempt_duration_seconds",
                "algorithm": "scheduler_scheduling_algorithm_duration_seconds",
            },
        )
        if scheduler == "numafit" and self.extender_metrics:
            body = await asyncio.to_thread(_fetch, self.extender_metrics)
            totals |= histogram_sums(
                body,
                {
                    "filter": "numafit_scheduler_filter_duration_seconds",
                    "bind": "numafit_scheduler_bind_duration_seconds",
                },
            )
            totals |= counter_values(body, EXTENDER_COUNTERS)
        return totals

    async def create_nodes(self, count: int, accounting: AccountingClient) -> None:
        self.nodes = [f"gpu-node-{i:02d}" for i in range(count)]
        core = self.kube.core
        for name in self.nodes:
            await self.kube.create_node(_node(name))
            await core.patch_node_status(name, _node_status(), _preload_content=False)
            reply = await accounting.ask(
                messages.RegisterRequest(node=name, devices=_devices(name)),
                messages.RegisterReply,
            )
            if not reply.ok:
                raise RuntimeError(f"registering {name} refused: {reply.code} {reply.error}")
        # kube-controller-manager lifts the not-ready taint admission gave each new Node.
        await _until(self._untainted, SETTLE_WITHIN, "nodes untainted")

    async def _untainted(self) -> bool:
        nodes, _ = await self.kube.list_nodes()
        return all(not (n.get("spec") or {}).get("taints") for n in nodes)

    async def writes(self) -> int:
        """Writes to pods the API server has served so far, creations aside."""
        text = (await asyncio.to_thread(self.plane.get, "/metrics")).decode()
        total = 0
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels, _, value = line.rpartition(" ")
            fields = dict(
                part.split("=", 1)
                for part in labels[len("apiserver_request_total{") : -1].split(",")
            )
            verb = fields.get("verb", "").strip('"')
            resource = fields.get("resource", "").strip('"')
            sub = fields.get("subresource", "").strip('"')
            if resource != "pods" or verb not in WRITE_VERBS or sub not in POD_WRITES:
                continue
            if verb == "POST" and sub == "":
                continue  # the bench's own creations
            total += int(float(value))
        return total

    async def clear(self, accounting: AccountingClient) -> None:
        """Every pod of the namespace deleted, and accounting holding nothing on any node."""
        await self.kube.core.delete_collection_namespaced_pod(
            NAMESPACE, grace_period_seconds=0, _preload_content=False
        )

        async def gone() -> bool:
            pods, _ = await self.kube.list_pods()
            if any(p["metadata"]["namespace"] == NAMESPACE for p in pods):
                return False
            for name in self.nodes:
                reply = await accounting.ask(
                    messages.SnapshotRequest(node=name), messages.SnapshotReply
                )
                if any(state.pods for state in reply.nodes or ()):
                    return False
            return True

        await _until(gone, SETTLE_WITHIN, "the run's pods forgotten")


def histogram_sums(text: str, histograms: dict[str, str]) -> dict[str, float]:
    """`<key>_s` and `<key>_n`: the _sum and _count of each histogram, over all its labels."""
    totals: dict[str, float] = {}
    for key, name in histograms.items():
        for suffix, short in (("_sum", "_s"), ("_count", "_n")):
            prefix = name + suffix
            totals[key + short] = sum(
                float(line.rpartition(" ")[2])
                for line in text.splitlines()
                if line.startswith(prefix) and line[len(prefix)] in " {"
            )
    return totals


EXTENDER_COUNTERS = (
    "numafit_scheduler_reserve_attempts_total",
    "numafit_scheduler_read_model_snapshots_total",
    "numafit_scheduler_bind_total",
    "numafit_scheduler_filter_total",
)


def counter_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """`<counter>{<labels>}` -> value, for the counters named."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(names):
            series, _, value = line.rpartition(" ")
            found[series.removeprefix("numafit_scheduler_")] = float(value)
    return found


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


def profile_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean milliseconds per call of each stage between two `Cluster.profile` readings."""
    means: dict[str, float] = {}
    for key in after:
        if "{" in key:  # a counter: its increase
            grown = after[key] - before.get(key, 0.0)
            if grown:
                means[key] = grown
    for key in sorted({k[:-2] for k in after if "{" not in k}):
        count = after[key + "_n"] - before.get(key + "_n", 0.0)
        if count > 0:
            seconds = after[key + "_s"] - before.get(key + "_s", 0.0)
            means[f"{key}_ms"] = round(1000 * seconds / count, 2)
            means[f"{key}_calls"] = int(count)
    return means


async def _until(condition: Callable[[], Any], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not within {within:.0f} s")
        await asyncio.sleep(POLL)  # foreign state settling, bounded by `within`


# --- kubelet's part: Allocate ----------------------------------------------------------------


class AllocateAgent:
    """What kubelet and the device plugin do for numafit's pods once bound, as far as
    accounting sees it: a watch of the pods (kubelet's), then per node, one pod at a time
    (kubelet admits serially), accounting's `pending` (the plugin's lookup) and `consume`
    of the pod's entry (Allocate), which releases the node lock."""

    def __init__(self, kube: Kube, accounting: AccountingClient) -> None:
        self.kube = kube
        self.accounting = accounting
        self.queues: dict[str, asyncio.Queue[tuple[float, dict[str, Any]]]] = {}
        self.seen: set[str] = set()
        self.consumed = 0
        self.bound_at: dict[str, float] = {}
        """Pod name -> when the watch first showed it bound (every configuration's pods)."""
        self.node_of: dict[str, str] = {}
        """Pod name -> the node it was bound to."""
        self.errors: list[str] = []
        self.admissions: list[tuple[float, float, float, float]] = []
        """Per pod admitted: when the watch showed it bound and allocating, when its node's
        turn came (kubelet admits one pod at a time), when `pending` answered, when
        `consume` did (the node lock's release)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._waiting: set[str] = set()
        self._all_bound = asyncio.Event()

    def expect(self, names: list[str]) -> asyncio.Event:
        """An event set once every pod of `names` was seen bound."""
        self._waiting = {n for n in names if n not in self.bound_at}
        self._all_bound = asyncio.Event()
        if not self._waiting:
            self._all_bound.set()
        return self._all_bound

    async def run(self) -> None:
        _, version = await self.kube.list_pods()
        while True:
            async for kind, obj in self.kube.watch("pods", version):
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind in ("ADDED", "MODIFIED"):
                    self._observe(obj)

    def _observe(self, obj: dict[str, Any]) -> None:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        node = spec.get("nodeName")
        if not node or meta.get("namespace") != NAMESPACE:
            return
        if meta["name"] not in self.bound_at:
            self.bound_at[meta["name"]] = time.perf_counter()
            self.node_of[meta["name"]] = node
            self._waiting.discard(meta["name"])
            if not self._waiting:
                self._all_bound.set()
        annotations = meta.get("annotations") or {}
        if annotations.get(keys.BIND_PHASE) != keys.PHASE_ALLOCATING or meta["uid"] in self.seen:
            return
        self.seen.add(meta["uid"])
        queue = self.queues.get(node)
        if queue is None:
            queue = self.queues[node] = asyncio.Queue()
            self._tasks.append(asyncio.create_task(self._admit(node, queue)))
        queue.put_nowait((time.perf_counter(), obj))

    async def _admit(self, node: str, queue: asyncio.Queue[tuple[float, dict[str, Any]]]) -> None:
        while True:
            seen, obj = await queue.get()
            uid = obj["metadata"]["uid"]
            try:
                turn = time.perf_counter()
                await self.accounting.ask(messages.PendingRequest(node=node), messages.PendingReply)
                matched = time.perf_counter()
                entry = codec.decode_pod(obj["metadata"]["annotations"][keys.TO_ALLOCATE])[0]
                request = messages.ConsumeRequest(
                    devices=tuple(d.uuid for d in entry), pod_uid=uid, container_index=0, node=node
                )
                for _ in range(CONSUME_TRIES):
                    reply = await self.accounting.ask(request, messages.ConsumeReply)
                    # The plugin sends a consume again when its answer did not come in time
                    # (a loaded API server): accounting answers a repeat without a second write.
                    if reply.ok or reply.code not in RETRIED:
                        break
                if reply.ok:
                    self.consumed += 1
                    self.admissions.append((seen, turn, matched, time.perf_counter()))
                else:
                    self.errors.append(f"consume of {uid} refused: {reply.code} {reply.error}")
            except Exception as exc:  # reported with the figures, the run goes on
                self.errors.append(f"consume of {uid}: {exc!r}")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


# --- one run -----------------------------------------------------------------------------------


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
            await _until(
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
