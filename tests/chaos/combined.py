"""Exact accounting under every fault at once: pauses past the lease, joins, leaves, kills and
restarts of accounting replicas, and late writes at the API server, under continuous moves,
reserves and refits. What it measures, without trusting the code under test:

- every raw request goes out on a reply subject of its own, so the answers each one got are
  counted (`answered_twice`);
- every write the API server commits is timed as it commits (the in-process emulator's commit
  hook) and attributed to the move that asked for it: each move of a pod names a memory size
  of its own (12000 MiB less the pod's request count), so the `allocated` annotation says
  which request landed (`commits_after_refusal`: a request refused, yet its write landed;
  `unasked_commits`: a placement nobody asked for);
- every write is also timed as it reaches the API server, before any injected delay
  (`writes_sent_after_deadline`: accounting acted on a request after its caller gave up); a
  write sent in time may still be committed late when the API server holds it (the late-write
  fault): `late_acknowledged` / `late_unacknowledged` count those, the second when its sender
  was stopped before it could answer (the caller, unanswered, must treat it as unknown);
- GPU usage is summed here from the annotations after every committed write
  (`overcommitted_moments`: a state in which a GPU holds more than its memory);
- every `ok` answer's placement must have been committed (`acknowledged_missing`).

`pytest tests/chaos/test_combined_faults.py` runs it briefly; for the figures in docs/design/fencing.md ("Every fault at once"):

    .venv/bin/python -m tests.chaos.combined --seconds 300 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core import keys
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.nats_server import NatsServer
from tests.builders import container, gpu, node, pod
from tests.chaos.support import (
    create,
    entry_devices,
    kube_for,
    ledger_allocated,
    list_pods,
    refit_body,
    reserved_pod,
    service,
    stop_all,
)
from tests.integration.harness import wait_for
from tests.integration.processes import free_port
from tests.raw_accounting import RawAccounting

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from shared.testing.kube_emulator.store import Change
    from tests.chaos.support import ServiceProcess

NODES = ("node-1", "node-2", "node-3")
BIG = 80000
SMALL = 40000
POD_MEM = 12000
MOVERS_PER_NODE = 5
REFITTED_PER_NODE = 2
REFITTED_MEM = 6000
HOLDERS_PER_NODE = 2
LEASE_TTL = 3.0
PARTITIONS = 4
DEADLINE_S = 1.5
LAG_TICK = 0.05
ANSWER_GRACE_S = 12.0
"""How long after its deadline an answer is still counted (a paused replica's comes late)."""


LOGGED = frozenset(
    {
        "partition acquired",
        "partition released",
        "partition lost",
        "a previous owner's write settled at takeover",
        "a write whose answer did not come landed",
        "accounting ready",
    }
)
"""Log lines of the accounting replicas the report counts."""


def gpus_of(name: str) -> tuple[str, str]:
    return f"{name}-big", f"{name}-small"


@dataclass
class Sent:
    op: str
    pod: str
    node: str
    target: str
    mem: int
    deadline: float
    """Monotonic time after which the request must not be acted on."""
    answers: list[dict[str, Any]] = field(default_factory=list)
    sent_at: float = field(default_factory=time.monotonic)
    answered_at: list[float] = field(default_factory=list)

    def answered(self) -> bool:
        return bool(self.answers)


@dataclass
class Report:
    seconds: float
    requests: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    commits: int = 0
    refit_commits: int = 0
    answered_twice: int = 0
    unanswered: int = 0
    commits_after_refusal: int = 0
    unasked_commits: int = 0
    writes_seen_after_deadline: int = 0
    """Writes the emulator read after their request's deadline, however late it read them."""
    writes_sent_after_deadline: int = 0
    """The same, less the emulator's own lateness (its event loop's lag then, on a busy
    machine): writes that left their sender after the deadline (it was stopped between its
    last check and the send): harmless while none of them lands."""
    late_sent_landed: int = 0
    late_unacknowledged: int = 0
    """Landed after the deadline, sent before it, unanswered (its sender was stopped)."""
    late_acknowledged: int = 0
    overcommitted_moments: int = 0
    acknowledged_missing: int = 0
    ledger_differs: list[str] = field(default_factory=list)
    max_loop_lag_s: float = 0.0
    """The longest this process's event loop (the API emulator's too) fell behind: a write
    the emulator reads late is timed late, whoever sent it."""
    logged: Counter[str] = field(default_factory=Counter)
    """What the accounting replicas' own logs say happened (takeovers, settled writes)."""
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.answered_twice
            or self.commits_after_refusal
            or self.unasked_commits
            or self.late_sent_landed
            or self.overcommitted_moments
            or self.acknowledged_missing
            or self.ledger_differs
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "requests": dict(self.requests),
            "answers": dict(self.answers),
            "faults": dict(self.faults),
            "commits": self.commits,
            "refit_commits": self.refit_commits,
            "answered_twice": self.answered_twice,
            "unanswered": self.unanswered,
            "commits_after_refusal": self.commits_after_refusal,
            "unasked_commits": self.unasked_commits,
            "writes_seen_after_deadline": self.writes_seen_after_deadline,
            "writes_sent_after_deadline": self.writes_sent_after_deadline,
            "late_sent_landed": self.late_sent_landed,
            "late_unacknowledged": self.late_unacknowledged,
            "late_acknowledged": self.late_acknowledged,
            "overcommitted_moments": self.overcommitted_moments,
            "acknowledged_missing": self.acknowledged_missing,
            "ledger_differs": self.ledger_differs,
            "max_loop_lag_s": round(self.max_loop_lag_s, 3),
            "logged": dict(self.logged),
            "problems": self.problems[:20],
        }


class CombinedRun:
    def __init__(self, emulator: KubeEmulator, nats_url: str, tmp: Path, seed: int) -> None:
        self.emulator = emulator
        self.nats_url = nats_url
        self.tmp = tmp
        self.rng = random.Random(seed)
        self.kubeconfig = emulator.write_kubeconfig(tmp / "kubeconfig")
        self.bucket = f"combined-{seed}-{int(time.time())}"
        self.replicas: list[ServiceProcess] = []
        self.joiner: ServiceProcess | None = None
        self.joiners: list[ServiceProcess] = []
        self.paused: set[int] = set()
        self.sent: dict[str, Sent] = {}
        self.by_mem: dict[tuple[str, int], str] = {}
        """(pod, MiB) -> the inbox of the move that asked for it."""
        self.pods: dict[str, dict[str, Any]] = {}
        """Pod name -> the pod as last committed (the emulator's commit hook)."""
        self.counts: dict[str, int] = {}
        self.report = Report(0.0)
        self.capacity: dict[str, int] = {}
        self._committed: dict[str, float] = {}
        """Inbox -> when the API server committed that move's write."""
        self._arrived: dict[str, float] = {}
        """Inbox -> when that move's write reached the API server."""
        self._arrived_wall: dict[str, float] = {}
        """The same, as Unix time (to find it in the replicas' logs)."""
        self._pauses: set[asyncio.Future[None]] = set()
        self._deck: list[str] = []
        self._lags: list[tuple[float, float]] = []
        """(when, how long) each time this event loop woke late."""
        self._holders: set[str] = set()
        """UIDs of the pods only reserved for (holds are unwritten: not in the annotations)."""
        self._stop = asyncio.Event()

    # --- set-up ----------------------------------------------------------------------------

    def _replica(self, name: str) -> ServiceProcess:
        log_dir = self.tmp / name
        log_dir.mkdir(exist_ok=True)
        return service(
            "accounting",
            self.nats_url,
            self.kubeconfig,
            log_dir,
            *("--replica-id", name, "--lease-bucket", self.bucket),
            *("--partitions", str(PARTITIONS), "--lease-ttl", f"{LEASE_TTL:g}"),
        )

    async def seed_objects(self) -> None:
        kube = await kube_for(self.kubeconfig)
        try:
            for name in NODES:
                big, small = gpus_of(name)
                self.capacity[big] = BIG
                self.capacity[small] = SMALL
                await create(
                    kube, "node", node(name, [gpu(big, 0, mem=BIG), gpu(small, 1, mem=SMALL)])
                )
                for i in range(MOVERS_PER_NODE):
                    await create(
                        kube,
                        "pod",
                        reserved_pod(f"{name}-mover-{i}", big, POD_MEM, 10, node_name=name),
                    )
                for i in range(REFITTED_PER_NODE):
                    await create(
                        kube,
                        "pod",
                        reserved_pod(f"{name}-refitted-{i}", big, REFITTED_MEM, 10, node_name=name),
                    )
                for i in range(HOLDERS_PER_NODE):
                    await create(
                        kube,
                        "pod",
                        pod(
                            f"{name}-held-{i}",
                            containers=[container("main", 1, 1000, 5)],
                            namespace="ml",
                            node_name="",
                        ),
                    )
            for obj in await list_pods(kube):
                self.pods[obj["metadata"]["name"]] = obj
        finally:
            await kube.api.close()

    # --- what the API server commits -------------------------------------------------------

    def on_commit(self, change: Change) -> None:
        if change.bucket != "pods" or change.type == "DELETED":
            return
        obj = change.object
        name = obj["metadata"]["name"]
        before = self.pods.get(name)
        self.pods[name] = obj
        now = time.monotonic()
        old = ((before or {}).get("metadata") or {}).get("annotations") or {}
        new = obj["metadata"].get("annotations") or {}
        if new.get(keys.ALLOCATED) != old.get(keys.ALLOCATED) and keys.ALLOCATED in new:
            self.report.commits += 1
            self._attribute(name, old.get(keys.ALLOCATED, ""), new[keys.ALLOCATED], now)
        self._check_usage()

    def _attribute(self, name: str, before: str, allocated: str, now: float) -> None:
        uuid, mem, _ = entry_devices(allocated)[0][0]
        if "-refitted-" in name:
            self.report.refit_commits += 1  # moved by the refit service, asked by no raw move
            return
        inbox = self.by_mem.get((name, mem))
        if inbox is None:
            self.report.unasked_commits += 1
            self.report.problems.append(f"{name}: {allocated} committed, asked by no request")
            return
        sent = self.sent[inbox]
        if sent.target != uuid:
            self.report.unasked_commits += 1
            self.report.problems.append(
                f"{name}: {uuid} committed, {sent.target} asked ({before} -> {allocated}; "
                f"answers {[a.get('code') for a in sent.answers]})"
            )
        self._committed[inbox] = now

    def _check_usage(self) -> None:
        usage: Counter[str] = Counter()
        for obj in self.pods.values():
            notes = obj["metadata"].get("annotations") or {}
            if keys.ALLOCATED not in notes:
                continue
            for devices in entry_devices(notes[keys.ALLOCATED]):
                for uuid, mem, _ in devices:
                    usage[uuid] += mem
        over = [f"{u} {m}/{self.capacity[u]}" for u, m in usage.items() if m > self.capacity[u]]
        if over:
            self.report.overcommitted_moments += 1
            self.report.problems.append(f"over-committed: {over}")

    def on_write(self, method: str, path: str, body: bytes) -> None:
        """A write reached the API server (before any injected delay): a move's PATCH is
        known by its pod and size, as its commit is."""
        if method != "PATCH" or "-mover-" not in path:
            return
        try:
            notes = orjson.loads(body)["metadata"]["annotations"]
            allocated = notes[keys.ALLOCATED]
        except (ValueError, KeyError, TypeError):
            return  # not a move (a fence, a consume): nothing to attribute
        name = path.rsplit("/", 1)[-1]
        mem = entry_devices(allocated)[0][0][1]
        inbox = self.by_mem.get((name, mem))
        if inbox is not None and inbox not in self._arrived:
            self._arrived[inbox] = time.monotonic()
            self._arrived_wall[inbox] = time.time()

    # --- load ------------------------------------------------------------------------------

    async def _answer(self, msg: Msg) -> None:
        sent = self.sent.get(msg.subject)
        if sent is not None:
            sent.answers.append(orjson.loads(msg.data))
            sent.answered_at.append(time.monotonic())

    async def _send(self, nc: Client, op: str, body: dict[str, Any], sent: Sent) -> str:
        inbox = f"combined.{len(self.sent)}"
        self.sent[inbox] = sent
        self.report.requests[op] += 1
        await nc.publish(subjects.accounting(op, sent.node), orjson.dumps(body), reply=inbox)
        return inbox

    async def _mover(self, nc: Client, name: str, node_name: str) -> None:
        big, small = gpus_of(node_name)
        while not self._stop.is_set():
            obj = self.pods[name]
            allocated = obj["metadata"]["annotations"][keys.ALLOCATED]
            where = entry_devices(allocated)[0][0][0]
            target = small if where == big else big
            count = self.counts[name] = self.counts.get(name, 0) + 1
            mem = POD_MEM - 1 - count % 1999  # never the pod's own request: a refit's
            entry = f"{target},NVIDIA,{mem},10:;"
            body = {
                "podUID": obj["metadata"]["uid"],
                "revision": 0,
                "podResourceVersion": obj["metadata"]["resourceVersion"],
                "containerIndex": 0,
                "toAllocate": entry,
                "allocated": entry,
                "node": node_name,
                "deadlineMs": int(DEADLINE_S * 1000),
                "deadlineAtMs": int((time.time() + DEADLINE_S) * 1000),
            }
            sent = Sent("move", name, node_name, target, mem, time.monotonic() + DEADLINE_S)
            # Known before it is sent: its write may be committed before `_send` returns.
            self.by_mem[(name, mem)] = f"combined.{len(self.sent)}"
            await self._send(nc, "move", body, sent)
            with contextlib.suppress(TimeoutError):
                await wait_for(sent.answered, within=DEADLINE_S + 0.5)
            await asyncio.sleep(self.rng.uniform(0.0, 0.2))  # jitter between a pod's moves

    async def _reserver(self, nc: Client, client: RawAccounting, node_name: str) -> None:
        big, _ = gpus_of(node_name)
        i = 0
        while not self._stop.is_set():
            name = f"{node_name}-held-{i % HOLDERS_PER_NODE}"
            i += 1
            obj = self.pods[name]
            with contextlib.suppress(Exception):
                snapshot = await client.snapshot(node_name)
                body = {
                    "podUID": obj["metadata"]["uid"],
                    "podNamespace": "ml",
                    "podName": name,
                    "revision": snapshot.get("revision", 0),
                    "epoch": snapshot.get("epoch"),
                    "allocated": f"{big},NVIDIA,1000,5:;",
                    "node": node_name,
                    "deadlineMs": int(DEADLINE_S * 1000),
                    "deadlineAtMs": int((time.time() + DEADLINE_S) * 1000),
                }
                sent = Sent("reserve", name, node_name, big, 1000, time.monotonic() + DEADLINE_S)
                await self._send(nc, "reserve", body, sent)
            await asyncio.sleep(0.3)

    async def _refitter(self, nc: Client) -> None:
        """Refits through the refit service too (the path a device plugin takes), of pods of
        their own (a refit re-sends the pod's entry as its view has it, so a refit of a raw
        mover's pod would blur which request a commit came from): their answers are counted
        by code, their commits count in the usage."""
        while not self._stop.is_set():
            node_name = self.rng.choice(NODES)
            name = f"{node_name}-refitted-{self.rng.randrange(REFITTED_PER_NODE)}"
            obj = self.pods[name]
            allocated = obj["metadata"]["annotations"][keys.ALLOCATED]
            where = entry_devices(allocated)[0][0][0]
            allowed = [g for g in gpus_of(node_name) if g != where]  # kubelet offers the other
            body = refit_body(obj, allowed, timeoutMs=2000)
            self.report.requests["refit"] += 1
            with contextlib.suppress(Exception):
                msg = await natsconn.request(nc, subjects.refit(node_name), orjson.dumps(body), 3.0)
                self.report.answers["refit:" + str(orjson.loads(msg.data).get("code"))] += 1
            await asyncio.sleep(0.5)

    # --- faults ----------------------------------------------------------------------------

    async def _faults(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(self.rng.uniform(2.0, 4.0))
            if not self._deck:
                # Every kind in each round of four, in a seeded order: a short run has them all.
                self._deck = ["pause", "kill", "join", "late"]
                self.rng.shuffle(self._deck)
            kind = self._deck.pop()
            self.report.faults[kind] += 1
            if kind == "pause":
                live = [i for i in range(len(self.replicas)) if i not in self.paused]
                if live:
                    i = self.rng.choice(live)
                    seconds = self.rng.uniform(2.0, 3.0) * LEASE_TTL
                    self._pauses.add(asyncio.ensure_future(self._pause(i, seconds)))
            elif kind == "kill":
                live = [i for i in range(len(self.replicas)) if i not in self.paused]
                if live:
                    proc = self.replicas[self.rng.choice(live)]
                    proc.kill()
                    await asyncio.sleep(0.5)
                    proc.start()
            elif kind == "join":
                if self.joiner is None:
                    self.joiner = self._replica("acc-joiner")
                    self.joiners.append(self.joiner)
                    self.joiner.start()
                else:
                    self.joiner.stop()  # a graceful leave (SIGTERM: hands over)
                    self.joiner = None
            else:
                node_name = self.rng.choice(NODES)
                i = self.rng.randrange(MOVERS_PER_NODE)
                self.emulator.faults.add(
                    method="PATCH",
                    path_regex=rf"/namespaces/ml/pods/{node_name}-mover-{i}$",
                    delay_s=self.rng.uniform(1.0, 5.0),
                    times=1,
                    outlive_client=True,
                )

    async def _lag(self) -> None:
        """How late this event loop wakes from a short sleep (a busy machine delays the API
        emulator's reads, which then look like late writes)."""
        while not self._stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(LAG_TICK)  # the probe itself: a timer of known length
            lag = time.monotonic() - before - LAG_TICK
            self.report.max_loop_lag_s = max(self.report.max_loop_lag_s, lag)
            if lag > LAG_TICK:
                self._lags.append((time.monotonic(), lag))

    def _lag_near(self, at: float) -> float:
        """The longest loop lag seen within a second of `at` (a write read at `at` may have
        waited that long in the emulator's socket before it was read)."""
        return max((lag for when, lag in self._lags if abs(when - at) <= 1.0), default=0.0)

    async def _pause(self, i: int, seconds: float) -> None:
        proc = self.replicas[i]
        if proc.process is None or proc.process.poll() is not None:
            return
        self.paused.add(i)
        proc.process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)  # the fault itself: a pause of this length
        finally:
            proc.process.send_signal(signal.SIGCONT)
            self.paused.discard(i)

    # --- the run ---------------------------------------------------------------------------

    async def run(self, seconds: float) -> Report:
        await self.seed_objects()
        self.emulator.store.on_commit.append(self.on_commit)
        self.emulator.faults.on_write.append(self.on_write)
        self.replicas = [self._replica(f"acc-{i}") for i in range(3)]
        refit_service = service("refit", self.nats_url, self.kubeconfig, self.tmp)
        connection = await natsconn.connect(self.nats_url, "chaos-combined")
        nc = connection.client
        client = RawAccounting(nc)
        started = time.monotonic()
        try:
            for proc in self.replicas:
                proc.start()
            refit_service.start()
            for proc in [*self.replicas, refit_service]:
                await proc.wait_ready()
            await nc.subscribe("combined.>", cb=self._answer)
            await nc.flush()
            tasks = [
                asyncio.ensure_future(self._mover(nc, f"{n}-mover-{i}", n))
                for n in NODES
                for i in range(MOVERS_PER_NODE)
            ]
            tasks += [asyncio.ensure_future(self._reserver(nc, client, n)) for n in NODES]
            tasks.append(asyncio.ensure_future(self._refitter(nc)))
            tasks.append(asyncio.ensure_future(self._faults()))
            tasks.append(asyncio.ensure_future(self._lag()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)
            self._stop.set()
            for task in [*tasks, *self._pauses]:
                task.cancel()  # a pause's own `finally` continues its replica
            await asyncio.gather(*tasks, *self._pauses, return_exceptions=True)
            # Late answers and late writes get their time to show.
            await wait_for(lambda: self.emulator.faults.in_flight == 0, within=30)
            last_deadline = max((s.deadline for s in self.sent.values()), default=0.0)
            with contextlib.suppress(TimeoutError):
                await wait_for(
                    lambda: (
                        time.monotonic() > last_deadline + ANSWER_GRACE_S
                        or all(s.answers for s in self.sent.values())
                    ),
                    within=ANSWER_GRACE_S + 5,
                )
            await self._compare_ledger(client)
        finally:
            self.report.seconds = time.monotonic() - started
            await connection.close()
            stop_all([refit_service, *self.replicas, *([self.joiner] if self.joiner else [])])
        self._tally()
        self._read_logs()
        return self.report

    def _read_logs(self) -> None:
        every = [*self.replicas, *self.joiners]
        seen: set[Path] = set()
        for proc in every:
            if proc.log in seen:
                continue
            seen.add(proc.log)
            for message in proc.messages():
                if message in LOGGED:
                    self.report.logged[message] += 1

    async def _compare_ledger(self, client: RawAccounting) -> None:
        kube = await kube_for(self.kubeconfig)
        try:
            current = await list_pods(kube)
        finally:
            await kube.api.close()
        for name in NODES:
            self._holders = {
                p["metadata"]["uid"] for p in current if "-held-" in p["metadata"]["name"]
            }
            annotated = {
                p["metadata"]["uid"]: p["metadata"]["annotations"][keys.ALLOCATED]
                for p in current
                if (p["metadata"].get("annotations") or {}).get(keys.VGPU_NODE) == name
                and keys.ALLOCATED in p["metadata"]["annotations"]
            }

            async def agrees(node_name: str = name, want: dict[str, str] = annotated) -> bool:
                try:
                    return self._without_holds(await ledger_allocated(client, node_name)) == want
                except (KeyError, TimeoutError, OSError):
                    return False

            try:
                await wait_for(agrees, within=15)
            except TimeoutError:
                self.report.ledger_differs.append(name)
                with contextlib.suppress(KeyError, TimeoutError, OSError):
                    ledger = self._without_holds(await ledger_allocated(client, name))
                    differing = {
                        uid: (annotated.get(uid), ledger.get(uid))
                        for uid in set(annotated) | set(ledger)
                        if annotated.get(uid) != ledger.get(uid)
                    }
                    self.report.problems.append(f"{name} ledger differs: {differing}")

    def _without_holds(self, ledger: dict[str, str]) -> dict[str, str]:
        return {uid: a for uid, a in ledger.items() if uid not in self._holders}

    def _tally(self) -> None:
        r = self.report
        for inbox, sent in self.sent.items():
            if len(sent.answers) > 1:
                r.answered_twice += 1
                r.problems.append(
                    f"{sent.op} {sent.pod} ({inbox}) answered {len(sent.answers)} times: "
                    + " | ".join(
                        f"+{at - sent.sent_at:.2f}s {a.get('code')} {a.get('epoch')} "
                        f"{str(a.get('error', ''))[:60]}"
                        for a, at in zip(sent.answers, sent.answered_at, strict=True)
                    )
                )
            if not sent.answers:
                r.unanswered += 1
            first = sent.answers[0] if sent.answers else None
            code = "none" if first is None else str(first.get("code"))
            r.answers[f"{sent.op}:{code}"] += 1
            if sent.op != "move":
                continue
            committed = self._committed.get(inbox)
            arrived = self._arrived.get(inbox)
            acked = first is not None and first.get("ok") is True
            if arrived is not None and arrived > sent.deadline:
                r.writes_seen_after_deadline += 1
            if arrived is not None and arrived - self._lag_near(arrived) > sent.deadline:
                r.writes_sent_after_deadline += 1
                if committed is not None:
                    r.late_sent_landed += 1
                    r.problems.append(
                        f"{sent.pod} -> {sent.target} ({inbox}) written "
                        f"+{arrived - sent.sent_at:.2f}s after it was sent, past its deadline, "
                        f"and landed (at {self._arrived_wall[inbox]:.3f}; the emulator's loop "
                        f"lag then {self._lag_near(arrived):.2f}s)"
                    )
            if committed is not None and first is not None and not acked:
                r.commits_after_refusal += 1
                r.problems.append(
                    f"{sent.pod} -> {sent.target} ({inbox}) refused, yet landed "
                    f"+{committed - sent.sent_at:.2f}s: "
                    + " | ".join(
                        f"+{at - sent.sent_at:.2f}s {a.get('code')} {a.get('epoch')} "
                        f"{str(a.get('error', ''))[:100]}"
                        for a, at in zip(sent.answers, sent.answered_at, strict=True)
                    )
                )
            if committed is not None and committed > sent.deadline:
                if acked:
                    r.late_acknowledged += 1
                else:
                    r.late_unacknowledged += 1
            if acked and committed is None:
                r.acknowledged_missing += 1
                r.problems.append(f"{sent.pod} -> {sent.target} answered ok, never committed")


async def combined_run(seconds: float, seed: int, tmp: Path, nats_url: str) -> Report:
    async with KubeEmulator() as emulator:
        return await CombinedRun(emulator, nats_url, tmp, seed).run(seconds)


async def _main(seconds: float, seed: int, keep: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="numafit-combined-") as scratch:
        tmp = keep or scratch
        broker = NatsServer(port=free_port())
        broker.start()
        try:
            report = await combined_run(seconds, seed, Path(tmp), broker.url)
        finally:
            broker.stop()
    print(orjson.dumps(report.as_json(), option=orjson.OPT_INDENT_2).decode())
    return 0 if report.clean else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long the load runs")
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's seed")
    parser.add_argument("--keep", help="a directory to keep the processes' logs in")
    args = parser.parse_args()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    return asyncio.run(_main(args.seconds, args.seed, args.keep))


if __name__ == "__main__":
    raise SystemExit(main())
