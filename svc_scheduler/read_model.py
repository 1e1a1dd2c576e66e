"""The scheduler's read model: every node's GPUs and their usage, as accounting last said.

Accounting publishes a node's full per-device usage with its revision after every change
(`numafit.usage.v1.<node>`); the read model applies those in place, so a filter decides without
asking anyone. It takes a snapshot (`snapshot` on `_all`, or on one node) instead when an
update cannot be trusted to describe the node completely:

- on start, after a NATS (re)connect, and when accounting's epoch changes (it restarted): all;
- a node it does not know, a revision gap, a device set that differs from the inventory it
  holds: that node;
- a revision bump with unchanged usage: that node too. Such a bump is a change the usage table
  does not show (a cordon, a new register annotation, a bind phase), and a cordon must be seen
  before the next fit.

A node the last full snapshot did not hold, and that no update has named since, does not exist
for accounting: a filter naming it gets no view (the node is refused as unavailable) and no
snapshot is taken for it, so a request listing thousands of made-up names costs nothing. An
update marked `deleted` (the Node was deleted) drops the node.

Refreshes happen on demand, for the candidates of a filter, within the filter's budget. A
decision made on a view that turned stale meanwhile is harmless: the reserve names the revision
and accounting refuses it with `conflict`.

Quota: a namespace's GPU quota (limits and usage) rides along a node snapshot. Namespaces
without limits are remembered for QUOTA_TTL seconds; limited ones are read for every decision,
since their usage moves with every reservation in the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared import subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core.accounting import TrackedPod
from shared.core.errors import CoreError
from shared.core.model import NodeSnapshot
from shared.core.quota import QuotaLedger
from shared.ledger_wire import (
    node_state_from_wire,
    quota_from_wire,
    tracked_from_wire,
    usage_from_wire,
)
from shared.service.backoff import Backoff
from shared.service.supervisor import Supervisor
from shared.wire import Reader, WireError, loads_object
from svc_scheduler.metrics import SchedulerMetrics

log = logging.getLogger("numafit.scheduler")

QUOTA_TTL = 5.0
"""Seconds a namespace seen without GPU quota limits is trusted to still have none."""
FULL_REFRESH_THRESHOLD = 16
"""More stale candidates than this: one `_all` snapshot instead of one per node."""
INITIAL_SYNC_BACKOFF = (0.1, 5.0)
"""Seconds: the first retry of the first snapshot, and the longest wait between retries."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node at one revision. Never changed after creation: a filter that captured it keeps
    a consistent (snapshot, revision) pair while other updates arrive."""

    name: str
    revision: int
    snapshot: NodeSnapshot | None
    """Devices with the usage accounting counts; None when the node has no GPU inventory."""


@dataclass(frozen=True, slots=True)
class PodContext:
    """What a snapshot asked with `podUID`/`namespace` tells about one pod's filter."""

    tracked: TrackedPod | None
    quota: QuotaLedger | None


class ReadModel:
    def __init__(
        self,
        nc: Client,
        accounting: AccountingClient,
        metrics: SchedulerMetrics | None = None,
        *,
        on_ready: Callable[[], None] | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.nc = nc
        self.accounting = accounting
        self.metrics = metrics or SchedulerMetrics()
        self.on_ready = on_ready
        self._owns_supervisor = supervisor is None
        self.supervisor = supervisor if supervisor is not None else Supervisor("read-model")
        """Runs the first sync and the shared snapshot fetches (the service's, when given)."""
        self.epoch: str | None = None
        self.ready = asyncio.Event()
        self._nodes: dict[str, NodeView] = {}
        self._stale: set[str] = set()
        self._expected: dict[str, int] = {}
        self._needs_full = True
        self._quota: dict[str, tuple[QuotaLedger, float]] = {}
        self._refreshing: dict[str, asyncio.Future[None]] = {}
        self._refreshing_all: asyncio.Future[None] | None = None
        self._subscription: Subscription | None = None
        self._sync_task: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to usage updates, then take the first snapshot in the background (retried
        until accounting answers); `ready` is set once it has landed."""
        if self._owns_supervisor:
            await self.supervisor.start()
        self._subscription = await self.nc.subscribe(subjects.USAGE_WILDCARD, cb=self._on_usage)
        await self.nc.flush()
        self._sync_task = self.supervisor.spawn(
            self._initial_sync(), "read-model-sync", drain=False
        )

    async def stop(self) -> None:
        """Cancel the first sync and the fetches (the service's supervisor already did at
        its stop), then unsubscribe."""
        tasks: list[asyncio.Future[None]] = [
            t for t in (self._sync_task, self._refreshing_all) if t is not None
        ]
        tasks += list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._owns_supervisor:
            await self.supervisor.stop()
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
            self._subscription = None

    async def on_reconnect(self) -> None:
        """Updates may have been missed while disconnected: the next decision resyncs all."""
        self._needs_full = True
        with contextlib.suppress(AccountingUnavailable, WireError):
            await self.refresh_all(2.0)

    async def _initial_sync(self) -> None:
        backoff = Backoff(*INITIAL_SYNC_BACKOFF)
        while True:
            try:
                await self.refresh_all(5.0)
            except Exception as exc:  # whatever it was, readiness waits on this: retry
                log.warning("first snapshot failed; retrying", extra={"error": str(exc)[:300]})
                await backoff.wait()
                continue
            self.ready.set()
            if self.on_ready is not None:
                self.on_ready()
            log.info("read model ready", extra={"epoch": self.epoch, "nodes": len(self._nodes)})
            return

    # --- usage updates ----------------------------------------------------------------------

    async def _on_usage(self, msg: Msg) -> None:
        try:
            body = loads_object(msg.data, "usage update")
            reader = Reader(body, "usage update")
            self.apply_update(
                reader.text("epoch"),
                reader.text("node"),
                reader.integer("revision", minimum=0),
                body.get("devices"),
                deleted=body.get("deleted") is True,
            )
        except WireError as exc:
            log.warning("usage update ignored", extra={"error": str(exc)[:300]})

    def apply_update(
        self, epoch: str, node: str, revision: int, devices: Any, *, deleted: bool = False
    ) -> None:
        """Apply one published usage table, or mark the node (or everything) for a snapshot."""
        if self.epoch is None:
            return  # the first snapshot is still to come and will include this
        if epoch != self.epoch:
            self._needs_full = True
            return
        if deleted:
            self.drop(node)
            return
        if not subjects.valid_name(node):
            return  # accounting only knows Kubernetes node names
        view = self._nodes.get(node)
        if view is None or revision > view.revision + 1:
            self._stale.add(node)
            return
        if revision <= view.revision:
            return  # already seen (a snapshot overtook it)
        updated = _with_usage(view.snapshot, devices)
        if updated is None:
            self._stale.add(node)
            return
        self._nodes[node] = NodeView(node, revision, updated)

    # --- views ------------------------------------------------------------------------------

    def view(self, node: str) -> NodeView | None:
        return self._nodes.get(node)

    def is_fresh(self, node: str) -> bool:
        view = self._nodes.get(node)
        return (
            view is not None
            and node not in self._stale
            and view.revision >= self._expected.get(node, 0)
        )

    def _needs_fetch(self, node: str) -> bool:
        """Stale, or known to have changed; a node nobody has named since the last full
        snapshot is absent, not stale."""
        if node in self._nodes:
            return not self.is_fresh(node)
        return node in self._stale

    def invalidate(self, node: str) -> None:
        self._stale.add(node)

    def drop(self, node: str) -> None:
        """The node was deleted: forget everything about it."""
        self._nodes.pop(node, None)
        self._stale.discard(node)
        self._expected.pop(node, None)
        self.metrics.nodes.set(len(self._nodes))

    def expect(self, node: str, revision: int) -> None:
        """A commit answered with `revision`: anything older is stale for this node."""
        self._expected[node] = max(self._expected.get(node, 0), revision)

    async def views(self, names: Iterable[str], budget: float) -> dict[str, NodeView | None]:
        """Current views of `names`, refreshing the stale and unknown ones first. A node
        accounting does not know comes back as a view without inventory."""
        wanted = [n for n in dict.fromkeys(names) if subjects.valid_name(n)]
        if self._needs_full or sum(self._needs_fetch(n) for n in wanted) > FULL_REFRESH_THRESHOLD:
            await self.refresh_all(budget)
        stale = [n for n in wanted if self._needs_fetch(n)]
        if stale:
            await asyncio.gather(*(self._refresh_shared(n, budget) for n in stale))
        return {n: self._nodes.get(n) for n in dict.fromkeys(names)}

    async def refresh_all(self, budget: float) -> None:
        """One `_all` snapshot; concurrent callers share it."""
        task = self._refreshing_all
        if task is None or task.done():
            task = self.supervisor.submit(self._fetch_all(budget), "snapshot-all")
            self._refreshing_all = task
        await asyncio.shield(task)

    async def _fetch_all(self, budget: float) -> None:
        self.metrics.snapshots.labels("all").inc()
        reply = await self.accounting.snapshot_all(budget=budget)
        self._store(reply, full=True)

    async def _refresh_shared(self, node: str, budget: float) -> None:
        task = self._refreshing.get(node)
        if task is None or task.done():
            task = self.supervisor.submit(self._fetch_node(node, budget), f"snapshot-{node}")
            self._refreshing[node] = task
            task.add_done_callback(lambda _: self._refreshing.pop(node, None))
        await asyncio.shield(task)
        if node not in self._nodes:
            self._stale.discard(node)  # accounting does not know it: absent, not stale

    async def _fetch_node(self, node: str, budget: float) -> None:
        await self.context(node, budget=budget)

    async def context(
        self,
        node: str,
        *,
        pod_uid: str | None = None,
        namespace: str | None = None,
        budget: float,
    ) -> PodContext:
        """Snapshot one node, optionally with a pod's reservation and a namespace's quota."""
        self.metrics.snapshots.labels("node").inc()
        reply = await self.accounting.snapshot(
            node, pod_uid=pod_uid, namespace=namespace, budget=budget
        )
        if not reply.get("ok", True):
            if reply.get("code") == "node_unavailable":
                self.drop(node)  # accounting does not know the node
                return PodContext(None, None)
            error = str(reply.get("error", ""))[:300]
            raise AccountingUnavailable(f"snapshot of {node} refused: {error}")
        self._store(reply, full=False)
        tracked = None
        raw_pod = reply.get("pod")
        if isinstance(raw_pod, dict):
            tracked = tracked_from_wire(raw_pod)
        quota = None
        raw_quota = reply.get("quota")
        if namespace and isinstance(raw_quota, dict):
            quota = quota_from_wire(raw_quota)
            self._quota[namespace] = (quota, time.monotonic())
        return PodContext(tracked, quota)

    def _store(self, reply: Mapping[str, Any], *, full: bool) -> None:
        reader = Reader(reply, "snapshot reply")
        epoch = reader.text("epoch")
        try:
            states = [node_state_from_wire(n) for n in reader.objects("nodes")]
        except CoreError as exc:
            raise WireError(f"snapshot reply: {exc}") from exc
        new_epoch = epoch != self.epoch
        previous = self._nodes
        if new_epoch:
            # Accounting restarted: revisions of its previous run mean nothing any more.
            self._expected.clear()
            previous = {}
        if full:
            self._nodes = {}
            self._stale.clear()
            self._needs_full = False
        elif new_epoch:
            self._needs_full = True  # every other view belongs to the previous run
        self.epoch = epoch
        for state in states:
            current = previous.get(state.name)
            if current is not None and state.revision < current.revision:
                # An update newer than this snapshot was applied while it travelled.
                self._nodes[state.name] = current
                continue
            self._nodes[state.name] = NodeView(state.name, state.revision, state.snapshot())
            self._stale.discard(state.name)
        self.metrics.nodes.set(len(self._nodes))

    # --- quota ------------------------------------------------------------------------------

    def cached_quota(self, namespace: str) -> QuotaLedger | None:
        """A namespace known to have no GPU limits (recently); None means: ask accounting."""
        cached = self._quota.get(namespace)
        if cached is None:
            return None
        quota, at = cached
        if quota.limited(namespace) or time.monotonic() - at > QUOTA_TTL:
            return None
        return quota

    def forget_quota(self, namespace: str) -> None:
        self._quota.pop(namespace, None)


def _with_usage(snapshot: NodeSnapshot | None, devices: Any) -> NodeSnapshot | None:
    """`snapshot` with the published usage, or None when the table cannot be applied as is
    (another device set, a malformed table, or unchanged usage: see the module docstring)."""
    if snapshot is None:
        return None
    updated = usage_from_wire(snapshot, devices)
    if updated is None:
        return None
    if [d.as_dict() for d in updated.devices] == [d.as_dict() for d in snapshot.devices]:
        return None
    return updated
