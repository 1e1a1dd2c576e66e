"""kube-scheduler's part in `numafit up`, for every pod with the numafit scheduler name.

Whoever creates a pod (kubectl, the load generator, a scenario), the admission webhook gives a
GPU pod `schedulerName: numafit-scheduler`; this loop then does what kube-scheduler does for
that profile with numafit's extender stanza (svc_scheduler/deploy/scheduler-config.yaml):

- it lists and watches pods, and queues every unbound, undeleted Pending pod of its
  scheduler name (one attempt at a time, the earliest due first);
- for a pod requesting one of the extender's managed resources (nvidia.com/gpu, gpumem,
  gpumem-percentage, gpucores) it POSTs ExtenderArgs to `/filter` with `NodeNames` (the
  extender is nodeCacheCapable), `/prioritize` only when more than one node passed (as
  kube-scheduler skips scoring with one feasible node), picks the best score, and POSTs
  ExtenderBindingArgs to `/bind` (the extender is the binder); any other pod is bound by the
  loop itself, to the first schedulable node, as kube-scheduler's default binder would;
- a pod no node can hold gets a Warning `FailedScheduling` Event with kube-scheduler's
  wording and the extender's reasons (`0/1 nodes are available: 1 1/8 CardInsufficientMemory.`),
  the `PodScheduled=False` condition, and another attempt after a backoff (1 s doubling to
  10 s, kube-scheduler's defaults); a failed bind is `Binding rejected: ...` and retried alike;
- a bound pod gets kube-scheduler's Normal `Scheduled` Event, and its node's kubelet admits it
  (shared.tools.local.kubelets); a deleted pod's node releases what it held.

The extender's own errors (HTTP status, timeout after `http_timeout`, an `Error` in the
answer) fail the attempt like a filter refusal: the pod stays Pending and is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.service import kube_io

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import aiohttp

    from shared.tools.local.events import EventSink
    from shared.tools.local.kubelets import Kubelets

log = logging.getLogger("numafit.up.scheduler")

SCHEDULER_NAME = DEFAULT_SCHEDULER_NAME
"""The profile whose pods the loop schedules: what the webhook gives GPU pods, and one of the
names the extender schedules for (it refuses pods of any other scheduler)."""
MANAGED_RESOURCES = frozenset(
    {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"}
)
"""The extender stanza's managedResources: a pod naming none is not sent to the extender."""
INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 10.0
HTTP_TIMEOUT = 5.0
"""The extender stanza's httpTimeout."""
REMEMBERED = 4096
"""Pods whose first attempt waiters may still ask about."""


class ExtenderError(RuntimeError):
    """The extender failed a call (HTTP status, timeout, transport, or an Error answer)."""


def managed(pod: Mapping[str, Any]) -> bool:
    """Whether the pod requests or limits one of the extender's managed resources."""
    spec = pod.get("spec") or {}
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = (container or {}).get("resources") or {}
        for section in ("limits", "requests"):
            if MANAGED_RESOURCES & set(resources.get(section) or {}):
                return True
    return False


def unschedulable_message(total: int, failed: Mapping[str, str]) -> str:
    """kube-scheduler's FitError text: each distinct reason with the number of nodes giving
    it, sorted by reason."""
    counts = Counter(failed.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    missing = total - sum(counts.values())
    if missing > 0:  # nodes the extender neither kept nor explained
        reasons = ", ".join(
            filter(None, [reasons, f"{missing} node(s) were not kept by the extender"])
        )
    return f"0/{total} nodes are available: {reasons or 'no nodes'}."


def backoff(attempts: int, initial: float = INITIAL_BACKOFF, maximum: float = MAX_BACKOFF) -> float:
    """Seconds before attempt `attempts + 1` (kube-scheduler: initial * 2^(n-1), capped)."""
    return float(min(maximum, initial * 2 ** max(attempts - 1, 0)))


@dataclass(slots=True)
class _Queued:
    namespace: str
    name: str
    uid: str
    due: float
    attempts: int = 0
    in_flight: bool = False
    reported: str = ""
    """The last PodScheduled=False message written (rewritten only when it changes)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """How one scheduling attempt ended."""

    node: str | None
    """The node the pod was bound to; None when it stays Pending."""
    message: str = ""
    """Why it stays Pending (the FailedScheduling message)."""
    phase: str = ""
    """After admission: Running, Failed (with `reason`), or empty when no kubelet admitted it."""
    reason: str = ""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SchedulingLoop:
    def __init__(
        self,
        kube: kube_io.Kube,
        extender_url: str,
        session: aiohttp.ClientSession,
        kubelets: Kubelets,
        events: EventSink,
        *,
        scheduler_name: str = SCHEDULER_NAME,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        http_timeout: float = HTTP_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.extender_url = extender_url.rstrip("/")
        self.session = session
        self.kubelets = kubelets
        self.events = events
        self.scheduler_name = scheduler_name
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.http_timeout = http_timeout
        self.clock = clock
        self._queue: dict[str, _Queued] = {}
        self._bound: dict[str, str] = {}
        """uid -> node of every pod bound to a node, for the release at deletion."""
        self._wake = asyncio.Event()
        self._attempted: OrderedDict[str, tuple[asyncio.Event, list[Attempt]]] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._releases: set[asyncio.Task[None]] = set()
        self.listed = asyncio.Event()
        """Set once the first list of pods was queued (the loop sees every pod from then)."""

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="scheduling-loop-watch"),
            asyncio.create_task(self._work(), name="scheduling-loop-work"),
        ]
        async with asyncio.timeout(10):
            await self.listed.wait()

    async def stop(self) -> None:
        """Cancel the watch, the attempt in progress and any pending release."""
        tasks = [*self._tasks, *self._releases]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    def queued(self) -> list[str]:
        """`namespace/name` of every pod waiting to be scheduled."""
        return sorted(entry.key for entry in self._queue.values())

    async def first_attempt(self, uid: str) -> Attempt:
        """Wait for the end of the pod's first scheduling attempt (admission included)."""
        event, outcome = self._slot(uid)
        await event.wait()
        return outcome[0]

    def _slot(self, uid: str) -> tuple[asyncio.Event, list[Attempt]]:
        slot = self._attempted.get(uid)
        if slot is None:
            slot = self._attempted[uid] = (asyncio.Event(), [])
            while len(self._attempted) > REMEMBERED:
                self._attempted.popitem(last=False)
        return slot

    def _finished(self, uid: str, attempt: Attempt) -> None:
        event, outcome = self._slot(uid)
        if not event.is_set():
            outcome.append(attempt)
            event.set()

    # --- watching ---------------------------------------------------------------------------

    async def _watch(self) -> None:
        failures = 0
        while True:
            try:
                items, version = await self.kube.list_pods()
                self._relisted(items)
                self.listed.set()
                failures = 0
                async for kind, pod in self.kube.watch("pods", version):
                    if kind != "BOOKMARK":
                        await self._observe(kind, pod)
            except kube_io.Gone:
                continue
            except Exception as exc:  # the API server restarting, a broken stream, ...
                failures += 1
                log.warning("watching pods failed; listing again", extra={"error": str(exc)})
                await asyncio.sleep(backoff(failures, 0.2, 5.0))

    def _relisted(self, items: list[dict[str, Any]]) -> None:
        present = {(p.get("metadata") or {}).get("uid", "") for p in items}
        for uid in [u for u in self._queue if u not in present and not self._queue[u].in_flight]:
            del self._queue[uid]
        for uid in [u for u in self._bound if u not in present]:  # deleted while not watching
            node = self._bound.pop(uid)
            task = asyncio.create_task(self.kubelets.release(node, uid))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        for pod in items:
            self._note(pod)

    async def _observe(self, kind: str, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        if kind == "DELETED":
            entry = self._queue.get(uid)
            if entry is not None and not entry.in_flight:
                del self._queue[uid]
                self._finished(uid, Attempt(None, "deleted"))
            node = self._bound.pop(uid, None) or (pod.get("spec") or {}).get("nodeName")
            if node:
                await self.kubelets.release(node, uid)
            return
        self._note(pod)

    def _note(self, pod: dict[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid = meta.get("uid", "")
        node = spec.get("nodeName")
        if node:
            self._bound.setdefault(uid, node)
            return
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if (
            uid
            and uid not in self._queue
            and spec.get("schedulerName") == self.scheduler_name
            and phase == "Pending"
            and not meta.get("deletionTimestamp")
        ):
            namespace = meta.get("namespace", "default")
            self._queue[uid] = _Queued(namespace, meta.get("name", ""), uid, self.clock())
            self._slot(uid)
            self._wake.set()

    # --- scheduling -------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            entry = await self._next()
            entry.in_flight = True
            try:
                attempt = await self._attempt(entry)
            except Exception as exc:  # one pod's trouble never stops the loop
                log.warning(
                    "scheduling attempt failed", extra={"pod": entry.key, "error": str(exc)}
                )
                attempt = Attempt(None, f"scheduling attempt failed: {exc}")
            finally:
                entry.in_flight = False
            if attempt.node is None and attempt.message not in ("", "deleted"):
                entry.attempts += 1
                entry.due = self.clock() + backoff(
                    entry.attempts, self.initial_backoff, self.max_backoff
                )
            else:
                self._queue.pop(entry.uid, None)
            self._finished(entry.uid, attempt)

    async def _next(self) -> _Queued:
        """The earliest due pod not being attempted; waits for one to be due or queued."""
        while True:
            self._wake.clear()
            waiting = [e for e in self._queue.values() if not e.in_flight]
            delay = None
            if waiting:
                entry = min(waiting, key=lambda e: e.due)
                delay = entry.due - self.clock()
                if delay <= 0:
                    return entry
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _attempt(self, entry: _Queued) -> Attempt:
        try:
            pod = await self.kube.get_pod(entry.namespace, entry.name)
        except kube_io.NotFound:
            return Attempt(None, "deleted")
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (
            meta.get("uid") != entry.uid
            or meta.get("deletionTimestamp")
            or spec.get("nodeName")
            or spec.get("schedulerName") != self.scheduler_name
        ):
            return Attempt(spec.get("nodeName"), "")  # no longer ours to schedule
        nodes = await self._schedulable_nodes()
        try:
            if managed(pod):
                node, message = await self._through_extender(pod, nodes)
            else:
                node, message = await self._plain(pod, nodes)
            reason = "Unschedulable"
        except ExtenderError as exc:  # kube-scheduler's condition says SchedulerError then
            node, message, reason = None, str(exc), "SchedulerError"
        if node is None:
            await self._unschedulable(pod, entry, message, reason)
            return Attempt(None, message)
        self._bound[entry.uid] = node
        await self.events.record(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {entry.key} to {node}",
            self.scheduler_name,
        )
        log.info(
            "pod bound", extra={"pod": entry.key, "node": node, "attempts": entry.attempts + 1}
        )
        if not self.kubelets.runs(node):
            return Attempt(node)
        report = await self.kubelets.admit(pod, node)
        log.info(
            "pod admitted",
            extra={
                "pod": entry.key,
                "node": node,
                "phase": report.phase,
                "reason": report.reason,
                "refit": {c.name: c.refit for c in report.containers},
                "gpus": {c.name: c.gpus for c in report.containers},
            },
        )
        return Attempt(node, "", report.phase, report.reason)

    async def _schedulable_nodes(self) -> list[str]:
        items, _ = await self.kube.list_nodes()
        return sorted(
            n["metadata"]["name"] for n in items if not (n.get("spec") or {}).get("unschedulable")
        )

    async def _post(self, verb: str, body: Any) -> Any:
        url = f"{self.extender_url}/{verb}"
        try:
            async with (
                asyncio.timeout(self.http_timeout),
                self.session.post(url, json=body) as response,
            ):
                if response.status != 200:
                    raise ExtenderError(f"extender {verb} answered HTTP {response.status}")
                return await response.json()
        except TimeoutError as exc:
            raise ExtenderError(f"extender {verb} timed out after {self.http_timeout:g}s") from exc
        except Exception as exc:
            if isinstance(exc, ExtenderError):
                raise
            raise ExtenderError(f"extender {verb} failed: {exc}") from exc

    async def _through_extender(
        self, pod: dict[str, Any], nodes: list[str]
    ) -> tuple[str | None, str]:
        if not nodes:
            return None, unschedulable_message(0, {})
        result = await self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": nodes})
        if result.get("Error"):
            raise ExtenderError(f"extender filter failed: {result['Error']}")
        feasible = [n for n in result.get("NodeNames") or [] if n in nodes]
        if not feasible:
            failed = {
                **(result.get("FailedNodes") or {}),
                **(result.get("FailedAndUnresolvableNodes") or {}),
            }
            return None, unschedulable_message(len(nodes), failed)
        node = feasible[0]
        if len(feasible) > 1:
            node = await self._best(pod, feasible)
        meta = pod["metadata"]
        bound = await self._post(
            "bind",
            {
                "PodName": meta["name"],
                "PodNamespace": meta.get("namespace", "default"),
                "PodUID": meta["uid"],
                "Node": node,
            },
        )
        if bound.get("Error"):
            return None, f"Binding rejected: {bound['Error']}"
        return node, ""

    async def _best(self, pod: dict[str, Any], feasible: list[str]) -> str:
        """The best-scored node (prioritize errors are ignored, as kube-scheduler does)."""
        try:
            scores = await self._post(
                "prioritize", {"Pod": pod, "Nodes": None, "NodeNames": feasible}
            )
            by_host = {item["Host"]: int(item["Score"]) for item in scores or []}
        except (ExtenderError, KeyError, TypeError, ValueError) as exc:
            log.warning("prioritize failed; scores ignored", extra={"error": str(exc)})
            by_host = {}
        return max(feasible, key=lambda n: (by_host.get(n, 0), -feasible.index(n)))

    async def _plain(self, pod: dict[str, Any], nodes: list[str]) -> tuple[str | None, str]:
        """A pod the extender is not interested in: kube-scheduler binds it itself."""
        if not nodes:
            return None, unschedulable_message(0, {})
        meta = pod["metadata"]
        try:
            await self.kube.create_binding(
                meta.get("namespace", "default"), meta["name"], meta["uid"], nodes[0]
            )
        except kube_io.KubeError as exc:
            return None, f"Binding rejected: {exc}"
        return nodes[0], ""

    async def _unschedulable(
        self, pod: dict[str, Any], entry: _Queued, message: str, reason: str
    ) -> None:
        log.info("pod unschedulable", extra={"pod": entry.key, "why": message})
        await self.events.record(pod, "Warning", "FailedScheduling", message, self.scheduler_name)
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": _now(),
        }
        if entry.reported == message:
            return
        with contextlib.suppress(kube_io.KubeError):
            await self.kube.patch_pod_status(
                entry.namespace, entry.name, {"conditions": [condition]}
            )
            entry.reported = message
