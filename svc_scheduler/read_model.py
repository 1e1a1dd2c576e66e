"""The scheduler's read model: every node's GPUs and their usage, as accounting last said.

Accounting publishes a node's full per-device usage with its revision after every change
(`numafit.usage.v1.<node>`); the read model applies those in place, so a filter decides without
asking anyone. Which updates apply and what must be fetched again is decided by `Freshness`
(freshness.py, pure, applying shared/core/freshness.py's rule); this module does the I/O around
it: the subscription, the snapshots (`snapshot` on `_all`, or on one node) and the shared
fetches.

Refreshes happen on demand, for the candidates of a filter, within the filter's budget. A
decision made on a view that turned stale meanwhile is harmless: the reserve names the revision
and accounting refuses it with `conflict`. An update that cannot be decoded marks the node its
subject names stale.

A refusal is not checked by a reserve, so it must not rest on a view accounting contradicts:
a snapshot overrules a view ahead of it that was set before its request was sent (logged as
`usage view ahead of accounting dropped`), and a view kept ahead of a snapshot because it
arrived while the request travelled is fetched once more before `views` returns it (see
Freshness: the second answer, asked after the view was set, decides).

Quota: a namespace's GPU quota (limits and usage) rides along a node snapshot (see Freshness
for how long it is trusted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared import messages, subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core.lock import node_lock
from shared.messages import NodeStateWire, SnapshotReply, SnapshotRequest, UsageUpdate
from shared.service.backoff import Backoff
from shared.service.supervisor import Supervisor
from svc_scheduler.freshness import Freshness, NodeView
from svc_scheduler.metrics import SchedulerMetrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from shared.core.accounting import TrackedPod
    from shared.core.quota import QuotaLedger

__all__ = ["NodeView", "PodContext", "ReadModel"]

log = logging.getLogger("numafit.scheduler")

FULL_REFRESH_THRESHOLD = 16
"""More stale candidates than this: one `_all` snapshot instead of one per node."""
INITIAL_SYNC_BACKOFF = (0.1, 5.0)
"""Seconds: the first retry of the first snapshot, and the longest wait between retries."""


@dataclass(frozen=True, slots=True)
class PodContext:
    """What a snapshot asked with `podUID`/`namespace` tells about one pod's filter."""

    tracked: TrackedPod | None
    quota: QuotaLedger | None


def _views(nodes: Iterable[NodeStateWire], epoch: str = "") -> list[NodeView]:
    """The nodes of a snapshot reply, each under its own epoch (else the reply's, `epoch`);
    `MessageError` when one cannot be read."""
    views = []
    for wire in nodes:
        s = wire.to_state()
        views.append(
            NodeView(
                s.name,
                s.revision,
                s.snapshot(),
                node_lock(s.pods),
                wire.epoch if isinstance(wire.epoch, str) else epoch,
            )
        )
    return views


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
        self.freshness = Freshness()
        self.ready = asyncio.Event()
        self._refreshing: dict[str, asyncio.Future[None]] = {}
        self._refreshing_all: asyncio.Future[None] | None = None
        self._subscription: Subscription | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self.on_change: Callable[[str], None] | None = None
        """Called with a node's name after an update or a snapshot of it was applied (the
        extender's binds waiting for the node's lock wake on it)."""

    @property
    def epoch(self) -> str | None:
        return self.freshness.epoch

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
        self.freshness.invalidate_all()
        with contextlib.suppress(AccountingUnavailable, messages.MessageError):
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
            log.info("read model ready", extra={"epoch": self.epoch, "nodes": len(self.freshness)})
            return

    # --- usage updates ----------------------------------------------------------------------

    async def _on_usage(self, msg: Msg) -> None:
        try:
            update = messages.decode(msg.data, UsageUpdate)
        except messages.MessageError as exc:
            # Something changed on the node the subject names, but not readably: fetch it.
            token = subjects.last_token(msg.subject)
            node = token.replace("_", ".")  # a node's token is its name with '.' as '_'
            if subjects.valid_token(token) and subjects.valid_name(node):
                self.freshness.invalidate(node)
            log.warning("usage update ignored", extra={"error": str(exc)[:300]})
            return
        self.apply_update(update)

    def apply_update(self, update: UsageUpdate) -> None:
        """Apply one published usage table, or mark the node (or everything) for a snapshot."""
        self.freshness.apply_update(update)
        self.metrics.nodes.set(len(self.freshness))
        if self.on_change is not None:
            self.on_change(update.node)

    # --- views ------------------------------------------------------------------------------

    def view(self, node: str) -> NodeView | None:
        return self.freshness.view(node)

    def is_fresh(self, node: str) -> bool:
        return self.freshness.is_fresh(node)

    def invalidate(self, node: str) -> None:
        self.freshness.invalidate(node)

    def unconfirmed(self, names: Iterable[str]) -> list[str]:
        """Those of `names` whose view may hide a change (freshness.py): fetched before a
        refusal rests on them."""
        return self.freshness.unconfirmed(names)

    def expect(self, node: str, revision: int) -> None:
        """A commit answered with `revision`: anything older is stale for this node."""
        self.freshness.expect(node, revision)

    async def views(self, names: Iterable[str], budget: float) -> dict[str, NodeView | None]:
        """Current views of `names`, refreshing the stale and unknown ones first. A node
        accounting does not know comes back as None."""
        asked = list(dict.fromkeys(names))
        wanted = subjects.valid_names(asked)
        fresh = self.freshness
        until = time.monotonic() + budget
        stale = fresh.to_fetch(wanted)
        if fresh.needs_full or len(stale) > FULL_REFRESH_THRESHOLD:
            await self.refresh_all(budget)
            stale = fresh.to_fetch(wanted)
        if stale:
            await asyncio.gather(*(self._refresh_shared(n, budget) for n in stale))
            # A view kept ahead of its answer (an update that arrived while the request
            # travelled) may be a forged or buggy one: a decision, a refusal above all (no
            # reserve checks it), must not rest on it. One more fetch, asked after it was set,
            # confirms or overrules it; only a further overtaking update stays unconfirmed, and
            # stays stale for the next decision.
            ahead = fresh.ahead_of_accounting(stale)
            left = until - time.monotonic()
            if ahead and left > 0:
                await asyncio.gather(*(self._refresh_shared(n, left) for n in ahead))
        return fresh.views_of(asked)

    async def refresh_all(self, budget: float) -> None:
        """One `_all` snapshot; concurrent callers share it."""
        task = self._refreshing_all
        if task is None or task.done():
            task = self.supervisor.submit(self._fetch_all(budget), "snapshot-all")
            self._refreshing_all = task
        await asyncio.shield(task)

    async def _fetch_all(self, budget: float) -> None:
        self.metrics.snapshots.labels("all").inc()
        sent = self.freshness.ticket()  # before any page is asked for
        epoch, nodes = await self.accounting.every_node(budget=budget)
        overruled = self.freshness.apply_snapshot(epoch, _views(nodes, epoch), full=True, sent=sent)
        self._overruled(overruled)
        self.metrics.nodes.set(len(self.freshness))

    async def _refresh_shared(self, node: str, budget: float) -> None:
        task = self._refreshing.get(node)
        if task is None or task.done():
            task = self.supervisor.submit(self._fetch_node(node, budget), f"snapshot-{node}")
            self._refreshing[node] = task
            task.add_done_callback(lambda _: self._refreshing.pop(node, None))
        await asyncio.shield(task)

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
        """Snapshot one node, optionally with a pod's reservation and a namespace's quota.
        `AccountingUnavailable` when unanswered or refused, `MessageError` when unreadable."""
        self.metrics.snapshots.labels("node").inc()
        request = SnapshotRequest(node=node, pod_uid=pod_uid or None, namespace=namespace or None)
        sent = self.freshness.ticket()
        reply = await self.accounting.ask(request, SnapshotReply, budget)
        if not reply.ok:
            if Code.parse(reply.code) is Code.NODE_UNAVAILABLE:
                self.freshness.drop(node)  # accounting does not know the node
                self.metrics.nodes.set(len(self.freshness))
                return PodContext(None, None)
            error = (reply.error or "")[:300]
            raise AccountingUnavailable(f"snapshot of {node} refused: {error}")
        assert reply.epoch is not None  # both checked by the decoder on `ok`
        assert reply.nodes is not None
        overruled = self.freshness.apply_snapshot(
            reply.epoch, _views(reply.nodes, reply.epoch), full=False, asked=node, sent=sent
        )
        self._overruled(overruled)
        self.metrics.nodes.set(len(self.freshness))
        if self.on_change is not None:
            self.on_change(node)
        tracked = reply.pod.to_core() if isinstance(reply.pod, messages.TrackedPodWire) else None
        quota = None
        if namespace and reply.quota is not None:
            quota = reply.quota.to_core()
            self.freshness.remember_quota(namespace, quota, time.monotonic())
        return PodContext(tracked, quota)

    def _overruled(self, nodes: list[str]) -> None:
        for node in nodes:
            # Accounting answered after the update was seen, yet is behind it: the update was
            # forged or buggy (worth a look by whoever runs the cluster), the snapshot holds.
            log.warning("usage view ahead of accounting dropped", extra={"node": node})

    # --- quota ------------------------------------------------------------------------------

    def cached_quota(self, namespace: str) -> QuotaLedger | None:
        """A namespace known to have no GPU limits (recently); None means: ask accounting."""
        return self.freshness.cached_quota(namespace, time.monotonic())

    def forget_quota(self, namespace: str) -> None:
        self.freshness.forget_quota(namespace)
