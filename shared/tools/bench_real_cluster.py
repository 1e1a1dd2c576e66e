"""The real run's cluster and kubelet stand-in: the fake GPU nodes on the real API server
(Ready, their GPUs registered through accounting), the figures read off the components
(write counts, histograms, CPU from /proc), and the agent that does kubelet's part for
numafit's pods (Allocate: the pending pod, then its consume, one pod at a time per node).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared import messages
from shared.core import codec, keys

if TYPE_CHECKING:
    from collections.abc import Callable

    from shared.accounting_client import AccountingClient
    from shared.service.kube_io import Kube
    from shared.testing.realk8s.plane import ControlPlane

    Progress = Callable[[str], None]

NAMESPACE = "bench"
GPUS_PER_NODE = 8
REPLICAS = 10
GPU_MEMORY = 81920
SETTLE_WITHIN = 60.0
"""Seconds the cluster gets to forget a run's pods (deleted, released by accounting)."""
POLL = 0.05
"""Seconds between two looks at foreign state settling (the API server, accounting)."""
WRITE_VERBS = frozenset({"POST", "PATCH", "PUT"})
CONSUME_TRIES = 5
RETRIED = frozenset({"deadline_exceeded", "api_error", "conflict"})
POD_WRITES = frozenset({"", "binding", "status"})


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
        await until(self._untainted, SETTLE_WITHIN, "nodes untainted")

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

        await until(gone, SETTLE_WITHIN, "the run's pods forgotten")


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


async def until(condition: Callable[[], Any], within: float, what: str) -> None:
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
