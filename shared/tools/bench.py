"""`numafit bench`: the figures of docs/reference/bench.md, measured in one run on this machine.

- refit round trip as the device plugin sees it (a refit that moves a reservation: decision,
  accounting's move and a resourceVersion-guarded patch), p50/p99 and throughput at 1 and 64
  concurrent requests (64 nodes, one requester each, as 64 device plugins would), beside its
  floor: a bare nats-py request-reply echo on the same broker, its responder in a process of
  its own (`shared/tools/bench_echo.py`), and a bare resourceVersion-guarded PATCH on the same API
  server; `refit_over_floor_ms` is the refit's p50 less theirs. Beside it the floor of the
  same chain without numafit's work: a bare forwarder (in the refit's place) asking a bare
  patcher (in accounting's place) that sends one guarded PATCH, each in a process of its own
  (`shared/tools/bench_echo.py`); `refit_over_chain_ms` is the refit's p50 less the chain's, what
  numafit's own work costs. For comparison, the echo with its responder in the bench's own
  process (no second process to wake);
- scheduling throughput: pods bound per second through the extender's `/filter` then `/bind`
  over HTTP, one pod at a time as kube-scheduler does, on 20 nodes of 8 GPUs (1 GPU, 1000 MiB
  pods), the device plugin side consuming each pod (accounting's `consume` over NATS, as at
  Allocate) so the node lock is released; and the API writes (POST/PATCH/PUT the emulator
  served) per scheduled pod during filter and bind;
- extender filter latency over HTTP at 100, 1000 and 5000 nodes of 8 GPUs;
- accounting memory per 10,000 reservations (tracemalloc, retained bytes).
Everything is real: nats-server, the Kubernetes API emulator, and accounting, refit and the
scheduler, each in a process of its own, as deployed (so no service queues behind another's
work on one event loop, and every request wakes the process that serves it). The scheduling
figures run the emulator in the bench's process instead, where it counts the writes it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from shared import messages, subjects
from shared.accounting_client import AccountingClient
from shared.codes import Code
from shared.core import codec, keys
from shared.core.pods import pod_from_object
from shared.service import natsconn
from shared.testing.realk8s import assets as realk8s_assets
from shared.tools import bench_echo, bench_real
from shared.tools.bench_plane import (
    ControlPlane,
    WriteCounter,
    control_plane,
    gpus,
    node_object,
    placed_pod,
    plain_pod,
    summarize,
)
from svc_accounting.ledger import Ledger

Progress = Callable[[str], None]


class _RoundTrips:
    """The round-trip series of one run: each kind's requests from `workers` nodes at once."""

    KINDS = ("echo", "patch", "chain", "refit", "echo_same_process")

    def __init__(
        self, plane: ControlPlane, names: list[str], echo_subject: str, uids: dict[str, str]
    ) -> None:
        self.admin, self.nc = plane.admin, plane.nc
        self.names = names
        self.echo_subject = echo_subject
        self.uids = uids
        self.versions: dict[str, str] = {}
        """Each node's floor pod's resourceVersion (the guard of its next patch)."""
        self.flip: dict[str, bool] = dict.fromkeys(names, False)
        """Each node's pod moves between GPU 0 and GPU 4, one refit after the other."""

    def refit_body(self, node: str) -> bytes:
        self.flip[node] = not self.flip[node]
        target = f"GPU-{node}-{4 if self.flip[node] else 0}"
        return orjson.dumps(
            {
                "podUID": self.uids[node],
                "podNamespace": "bench",
                "podName": f"pod-{node}",
                "nodeName": node,
                "containerIndex": 0,
                "containerName": "app",
                "deviceType": "NVIDIA",
                "allowedDeviceUUIDs": [target],
                "mode": "best-effort",
                "timeoutMs": 2000,
            }
        )

    async def _patch(self, node: str) -> float:
        """The floor under refit's write: one guarded merge patch, as accounting sends it (its
        answer carries the next version)."""
        start = time.perf_counter()
        body = await self.admin.patch_pod_annotations(
            "bench",
            f"floor-{node}",
            {"numafit.io/bench": str(time.perf_counter_ns())},
            self.versions[node],
        )
        took = time.perf_counter() - start
        self.versions[node] = body["metadata"]["resourceVersion"]
        return took

    async def one(self, kind: str, node: str) -> float:
        """One request of `kind` from `node`: its seconds."""
        if kind == "patch":
            return await self._patch(node)
        if kind in ("echo", "echo_same_process"):
            subject = self.echo_subject if kind == "echo" else SAME_PROCESS_ECHO
            payload = b"x" * 300
        elif kind == "chain":
            subject, payload = bench_echo.CHAIN, f"bench/chain-{node}".encode()
        else:
            subject, payload = subjects.refit(node), self.refit_body(node)
        start = time.perf_counter()
        msg = await self.nc.request(subject, payload, timeout=5)
        took = time.perf_counter() - start
        if kind == "refit" and orjson.loads(msg.data)["code"] != "moved":
            raise RuntimeError(f"refit did not move: {msg.data!r}")
        if kind == "chain" and msg.data.startswith(b"error"):
            raise RuntimeError(f"the chain floor's patch failed: {msg.data!r}")
        return took

    async def series(self, kind: str, workers: int, per_worker: int, samples: list[float]) -> float:
        """Run `per_worker` requests on each of `workers` nodes into `samples`; the seconds it
        took."""

        async def worker(node: str) -> None:
            for _ in range(per_worker):
                samples.append(await self.one(kind, node))

        started = time.perf_counter()
        await asyncio.gather(*(worker(n) for n in self.names[:workers]))
        return time.perf_counter() - started

    async def interleaved(self, workers: int, per_worker: int) -> dict[str, dict[str, float]]:
        """Every kind in turn, ROUNDS times, so that the refit and its floor are measured
        under the same conditions (a shared machine's speed drifts)."""
        samples: dict[str, list[float]] = {kind: [] for kind in self.KINDS}
        spent = dict.fromkeys(self.KINDS, 0.0)
        batch = max(per_worker // ROUNDS, 1)
        for _ in range(ROUNDS):
            for kind in self.KINDS:
                spent[kind] += await self.series(kind, workers, batch, samples[kind])
        return {kind: summarize(samples[kind], spent[kind]) for kind in self.KINDS}


def _over_floors(result: dict[str, Any]) -> None:
    """The refit's p50 over its floors: the echo and the patch apart, and the bare chain."""
    result["refit_over_floor_ms"] = {
        name: round(
            value["p50_ms"] - result["echo"][name]["p50_ms"] - result["patch"][name]["p50_ms"],
            3,
        )
        for name, value in result["refit"].items()
    }
    result["refit_over_chain_ms"] = {
        name: round(value["p50_ms"] - result["chain"][name]["p50_ms"], 3)
        for name, value in result["refit"].items()
    }


async def bench_round_trips(requests: int, concurrency: int, progress: Progress) -> dict[str, Any]:
    names = [f"node-{i:03d}" for i in range(concurrency)]
    objects: list[tuple[str, dict[str, Any]]] = [("node", node_object(n)) for n in names]
    objects += [("pod", placed_pod(f"pod-{n}", n, f"GPU-{n}-0")) for n in names]
    objects += [("pod", plain_pod(f"floor-{n}")) for n in names]
    objects += [("pod", plain_pod(f"chain-{n}")) for n in names]
    progress(f"round trips: {concurrency} nodes, {requests} requests per series")
    async with (
        control_plane(objects, refit=True, scheduler=False, progress=progress) as plane,
        _responder(plane.nats_url) as echo_process,
        _responder(plane.nats_url, "--patcher", "--kubeconfig", str(plane.kubeconfig)),
        _responder(plane.nats_url, "--forwarder"),
    ):
        admin = plane.admin
        uids = {n: (await admin.get_pod("bench", f"pod-{n}"))["metadata"]["uid"] for n in names}
        trips = _RoundTrips(plane, names, echo_process, uids)
        for n in names:
            floor = await admin.get_pod("bench", f"floor-{n}")
            trips.versions[n] = floor["metadata"]["resourceVersion"]

        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)

        responder = (await natsconn.connect(plane.nats_url, "echo")).client
        try:
            await responder.subscribe(SAME_PROCESS_ECHO, cb=echo)
            await responder.flush()
            for kind in trips.KINDS:
                await trips.series(kind, 1, max(requests // 10, 5), [])
            single = await trips.interleaved(1, requests)
            progress("concurrency 1: done")
            many = await trips.interleaved(concurrency, max(requests // concurrency, 1))
            progress(f"concurrency {concurrency}: done")
            result: dict[str, Any] = {
                kind: {"concurrency_1": single[kind], f"concurrency_{concurrency}": many[kind]}
                for kind in trips.KINDS
            }
            _over_floors(result)
            return result
        finally:
            await responder.close()


SAME_PROCESS_ECHO = "bench.echo.same-process"
ROUNDS = 5
"""The round-trip series run interleaved, each kind in turn this many times."""
ECHO_START_TIMEOUT = 30.0
"""Seconds the echo's responder process may take to start (imports, NATS connection)."""


@contextlib.asynccontextmanager
async def _responder(nats_url: str, *role: str) -> AsyncIterator[str]:
    """A bare nats-py responder in a process of its own (`shared/tools/bench_echo.py`: the echo, or
    with `role` the chain's patcher or forwarder), as refit is to the device plugin; yields
    the echo's subject."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shared.tools.bench_echo",
        "--nats-url",
        nats_url,
        *role,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(ECHO_START_TIMEOUT):
            line = await process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the bench responder {role} did not start: {line!r}")
        yield bench_echo.SUBJECT
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def bench_scheduling(pods: int, progress: Progress) -> dict[str, Any]:
    """Pods bound per second, one at a time as kube-scheduler binds: POST /filter (every node
    a candidate), POST /bind to the node it kept, then the device plugin's side of Allocate:
    accounting's `pending` and `consume` over NATS, which release the node lock. Also the API
    writes the emulator served during each pod's filter and bind (before Allocate)."""
    names = [f"node-{i:02d}" for i in range(20)]
    objects: list[tuple[str, dict[str, Any]]] = [("node", node_object(n)) for n in names]
    objects += [("pod", placed_pod(f"sched-{i:05d}", "", None)) for i in range(pods)]
    progress(f"scheduling: {pods} pods onto 20 nodes of 8 GPUs")
    counter = WriteCounter()
    async with control_plane(
        objects, refit=False, scheduler=True, progress=progress, counter=counter
    ) as plane:
        admin, nc, extender = plane.admin, plane.nc, plane.scheduler_url
        created = [await admin.get_pod("bench", f"sched-{i:05d}") for i in range(pods)]
        accounting = AccountingClient(nc)
        headers = {"Content-Type": "application/json"}
        writes: list[int] = []
        bind_retries = 0
        async with aiohttp.ClientSession() as session:

            async def post(verb: str, body: dict[str, Any]) -> dict[str, Any]:
                async with session.post(
                    f"{extender}/{verb}", data=orjson.dumps(body), headers=headers
                ) as response:
                    answer: dict[str, Any] = await response.json()
                    return answer

            async def allocate(node: str, uid: str) -> None:
                for _ in range(200):
                    pending = await accounting.ask(
                        messages.PendingRequest(node=node), messages.PendingReply
                    )
                    pod = pending.pod
                    if isinstance(pod, messages.PendingPod) and pod.uid == uid and pod.entries:
                        entry = codec.decode_container(pod.entries[0].devices)
                        reply = await accounting.ask(
                            messages.ConsumeRequest(
                                devices=tuple(d.uuid for d in entry), pod_uid=uid, node=node
                            ),
                            messages.ConsumeReply,
                        )
                        if reply.ok:
                            return
                        if reply.code != Code.CONFLICT.value:
                            raise RuntimeError(f"consume refused: {reply.code} {reply.error}")
                    await asyncio.sleep(0.001)  # accounting has not seen the bind yet
                raise RuntimeError(f"pod {uid} never became pending on {node}")

            started = time.perf_counter()
            for pod in created:
                meta = pod["metadata"]
                before = counter.writes
                answer = await post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
                kept = answer.get("NodeNames") or []
                if answer.get("Error") or not kept:
                    raise RuntimeError(f"filter failed: {answer}")
                node = kept[0]
                for _ in range(100):
                    bound = await post(
                        "bind",
                        {
                            "PodName": meta["name"],
                            "PodNamespace": "bench",
                            "PodUID": meta["uid"],
                            "Node": node,
                        },
                    )
                    error = str(bound.get("Error") or "")
                    if not error:
                        break
                    if "conflict" not in error and "allocating" not in error:
                        raise RuntimeError(f"bind failed: {error}")
                    bind_retries += 1
                    await asyncio.sleep(0.001)  # kube-scheduler binds again later
                else:
                    raise RuntimeError(f"bind of {meta['name']} never succeeded")
                writes.append(counter.writes - before)
                await allocate(node, meta["uid"])
            elapsed = time.perf_counter() - started
    return {
        "nodes": len(names),
        "pods": pods,
        "pods_per_s": round(pods / elapsed, 1) if elapsed > 0 else 0.0,
        "api_writes_per_pod": round(float(statistics.mean(writes)), 2),
        "api_writes_max": max(writes),
        "bind_retries": bind_retries,
    }


async def bench_filter(node_counts: list[int], filters: int, progress: Progress) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for count in node_counts:
        names = [f"node-{i:05d}" for i in range(count)]
        objects: list[tuple[str, dict[str, Any]]] = [("node", node_object(n)) for n in names]
        objects.append(("pod", placed_pod("candidate", "", None)))
        progress(f"filter: {count} nodes of 8 GPUs")
        async with control_plane(objects, refit=False, scheduler=True, progress=progress) as plane:
            admin, extender = plane.admin, plane.scheduler_url
            pod = await admin.get_pod("bench", "candidate")
            samples: list[float] = []
            async with aiohttp.ClientSession() as session:
                url = f"{extender}/filter"
                body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
                for _ in range(filters + 1):
                    start = time.perf_counter()
                    async with session.post(
                        url, data=body, headers={"Content-Type": "application/json"}
                    ) as response:
                        answer = await response.json()
                    samples.append(time.perf_counter() - start)
                    if answer.get("Error") or not answer.get("NodeNames"):
                        raise RuntimeError(f"filter failed: {answer}")
            samples = samples[1:]  # the first pays for warming caches
            result[str(count)] = summarize(samples, sum(samples))
            del result[str(count)]["throughput_per_s"]
    return result


def bench_memory(reservations: int) -> dict[str, Any]:
    """Retained bytes of the ledger holding `reservations` pods (tracemalloc)."""
    nodes = max(reservations // 50, 1)
    objects = []
    for i in range(reservations):
        node = f"node-{i % nodes:04d}"
        obj = placed_pod(f"pod-{i}", node, f"GPU-{node}-{i % 8}")
        obj["metadata"]["uid"] = f"uid-{i:08d}"
        obj["metadata"]["resourceVersion"] = str(i + 1)
        objects.append(obj)
    ledger = Ledger()
    for n in range(nodes):
        name = f"node-{n:04d}"
        ledger.set_node(name, {keys.NODE_REGISTER: codec.encode_register(gpus(name))})
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for obj in objects:
        ledger.observe(pod_from_object(obj))
    for held in ledger.nodes.values():
        _ = held.snapshot  # the cached usage snapshot is part of what the service keeps
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    total = after - before
    return {
        "reservations": reservations,
        "nodes": nodes,
        "bytes_total": total,
        "bytes_per_reservation": round(total / reservations, 1),
    }


async def run_bench(quick: bool, progress: Progress, real_only: bool = False) -> dict[str, Any]:
    requests = 100 if quick else 1000
    concurrency = 8 if quick else 64
    node_counts = [20, 50] if quick else [100, 1000, 5000]
    figures: dict[str, Any] = {"quick": quick}
    if not real_only:
        figures["round_trip"] = await bench_round_trips(requests, concurrency, progress)
        figures["scheduling"] = await bench_scheduling(40 if quick else 500, progress)
        figures["filter_latency"] = await bench_filter(node_counts, 5 if quick else 20, progress)
        progress("accounting memory")
        figures["accounting_memory"] = bench_memory(1000 if quick else 10_000)
    figures["real_scheduling"] = await real_scheduling(quick, progress)
    return figures


async def real_scheduling(quick: bool, progress: Progress) -> dict[str, Any]:
    """The real-control-plane run (shared/tools/bench_real.py), or why it was skipped."""
    found = realk8s_assets.find()
    if isinstance(found, str):
        progress(f"real scheduling skipped: {found}")
        return {"skipped": found}
    if quick:
        return await bench_real.bench_real_scheduling(
            found, nodes=4, pods=20, runs=1, progress=progress
        )
    return await bench_real.bench_real_scheduling(
        found, nodes=REAL_NODES, pods=REAL_PODS, runs=REAL_RUNS, progress=progress
    )


REAL_NODES = 20
REAL_PODS = 300
REAL_RUNS = 3
"""The real run's size: issue 22's, 300 pods of 1 GPU / 1000 MiB on 20 nodes of 8 GPUs, three
runs of each configuration."""


def render(figures: dict[str, Any]) -> str:
    lines = ["numafit bench" + (" (quick)" if figures.get("quick") else ""), ""]
    if "round_trip" in figures:
        lines += render_emulated(figures)
    lines += render_real(figures["real_scheduling"])
    return "\n".join(lines)


def render_real(real: dict[str, Any]) -> list[str]:
    if "skipped" in real:
        return ["", f"Real control plane: skipped ({real['skipped']})"]
    lines = [
        "",
        f"Real control plane (kube-scheduler v1.28, etcd, kube-apiserver): {real['pods']} pods "
        f"of 1 GPU / 1000 MiB on {real['nodes']} nodes of 8 GPUs, median of "
        f"{len(real['plain']['runs'])} runs each, alternating:",
    ]
    plain = real["plain"]["pods_per_s"] or 0.0
    for name in bench_real.CONFIGURATIONS:
        value = real[name]
        share = f"{100 * value['pods_per_s'] / plain:5.0f} % of plain" if plain else ""
        runs = " / ".join(str(r["pods_per_s"]) for r in value["runs"])
        lines.append(
            f"  {name:<8} {value['pods_per_s']:7.1f} pods/s ({runs}) {share}  "
            f"bind p50 {value['bind_latency_p50_s']} s p99 {value['bind_latency_p99_s']} s  "
            f"{value['api_writes_per_pod']:.2f} writes/pod  {value['never_bound']} never bound"
        )
    return lines


def render_emulated(figures: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    trips = figures["round_trip"]
    lines.append("Round trip as the device plugin sees it (refit moves a reservation each time):")
    rows = (
        ("echo", "bare nats-py echo"),
        ("patch", "bare guarded PATCH"),
        ("chain", "bare chain floor"),
        ("refit", "refit (moved)"),
        ("echo_same_process", "echo, 1 process"),
    )
    for kind, label in rows:
        if kind == "echo_same_process":
            lines.append(
                "  the echo with its responder in the requester's process, for comparison:"
            )
        for name, value in trips[kind].items():
            lines.append(
                f"  {label:<18} {name:<15} p50 {value['p50_ms']:8.3f} ms  "
                f"p99 {value['p99_ms']:8.3f} ms  {value['throughput_per_s']:9.1f} req/s  "
                f"({value['requests']} requests)"
            )
    over = ", ".join(
        f"{name} {value:.3f} ms" for name, value in trips["refit_over_floor_ms"].items()
    )
    lines.append(f"  refit p50 over its floor (echo + PATCH, each end its own process): {over}")
    chain = ", ".join(
        f"{name} {value:.3f} ms" for name, value in trips["refit_over_chain_ms"].items()
    )
    lines.append(
        f"  refit p50 over the chain floor (forwarder + patcher, no numafit work): {chain}"
    )
    sched = figures["scheduling"]
    lines.append("")
    lines.append(
        "Scheduling (HTTP /filter then /bind, one pod at a time; the plugin consumes each):"
    )
    lines.append(
        f"  {sched['pods_per_s']:.1f} pods/s  ({sched['pods']} pods on {sched['nodes']} nodes "
        f"of 8 GPUs, 1 GPU / 1000 MiB each)"
    )
    lines.append(
        f"  {sched['api_writes_per_pod']:.2f} API writes per pod before Allocate "
        f"(max {sched['api_writes_max']}; {sched['bind_retries']} bind retries)"
    )
    lines.append("")
    lines.append("Extender /filter latency (HTTP, every node a candidate, 8 GPUs each):")
    for count, value in figures["filter_latency"].items():
        lines.append(
            f"  {count:>5} nodes  p50 {value['p50_ms']:9.3f} ms  p99 {value['p99_ms']:9.3f} ms"
        )
    memory = figures["accounting_memory"]
    lines.append("")
    lines.append(
        f"Accounting memory: {memory['bytes_total'] / 1048576:.1f} MiB for "
        f"{memory['reservations']} reservations on {memory['nodes']} nodes "
        f"({memory['bytes_per_reservation']:.0f} bytes each)"
    )
    return lines
