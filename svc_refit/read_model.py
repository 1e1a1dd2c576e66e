"""svc_refit's read model: per node, the devices, the usage accounting counts and the tracked
pods, kept current by accounting's usage updates so that a refit decides without asking.

What it holds, per node some refit asked about (never for nodes nobody asked about):

- the inventory (register devices, cordons) and the tracked pods, from the last snapshot;
- the per-device usage table at the node's latest revision, from `numafit.usage.v1.<node>`
  (every commit publishes the node's full table, so the view follows without fetching).

Which updates apply is shared/core/freshness.py's rule, the one the scheduler's read model
applies too. A snapshot is taken instead when the updates cannot be trusted to describe the node
completely: another device set, another epoch (accounting restarted, or the node's partition
changed owner), a NATS reconnect, or a `conflict` from accounting. An update the rule applies
but leaves unconfirmed (a revision gap or a bump with unchanged usage: a cordon, a register
change, a pod's bind phase may hide in it) is applied and the node fetched before the next
refit decides on it: a refusal must not rest on it, and a refit decides and refuses in one
step. Concurrent refits share one snapshot per node
(single flight), so a burst costs one fetch, not one per refit.

Moves in flight are *claims* (svc_refit/claims.py): the capacity a sent move takes is counted
for every other refit on the node until its outcome is known, so a burst for three free slots
sends three moves, not two hundred. A refit refused only because of claims waits for them to
settle (within its deadline) and decides again: capacity a failed move gave back is never
refused.

A decision made on a view that turned stale is harmless: accounting re-checks every move
against its own ledger and refuses an over-commit with `no_fit`. A refusal is checked by
nobody, so it must not rest on a view accounting contradicts: a snapshot is the authority
(shared/core/freshness.py). A view ahead of
a snapshot that was set before the request was sent (a forged or buggy update) is replaced by
it; one set by an update while the request travelled is kept, but fetched once more before a
refit decides on it (that fetch, sent after it was set, decides).

Everything keyed by request input is bounded: nodes (least recently used first out),
namespaces' quota, fetches in flight (by the service's in-flight limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared import messages, subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core.freshness import (
    Held,
    Table,
    UpdateAction,
    Verdict,
    quota_fresh,
    snapshot_verdict,
    update_action,
)
from shared.core.nodes import without_pod
from shared.core.quota import QuotaLedger
from shared.messages import (
    MessageError,
    NodeState,
    SnapshotReply,
    SnapshotRequest,
    TrackedPodWire,
    UsageEntry,
    UsageUpdate,
)
from svc_refit.claims import Claim, Claims

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from shared.core.accounting import TrackedPod
    from shared.core.model import NodeSnapshot, Usage
    from shared.service.lifecycle import Deadline
    from shared.service.supervisor import Supervisor

log = logging.getLogger("numafit.refit")

MAX_NODES = 4096
"""Nodes kept; beyond it the least recently used is dropped (and fetched again if needed)."""
MAX_NAMESPACES = 1024
"""Namespaces whose quota is kept."""
LANDED_GRACE = 0.25
"""Seconds a landed commit's usage update is waited for before the node is fetched instead."""


class SnapshotRefused(Exception):
    """Accounting answered a snapshot with a refusal (`code`: a reply code, as listed in
    docs/reference/refit-codes.md; one this build does not know is `api_error`)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class View:
    """What one refit decides on. `usage` is the node's usage table at `revision` (without
    claims); None when the node has no GPU inventory."""

    epoch: str
    revision: int
    usage: NodeSnapshot | None
    pod: TrackedPod | None
    quota: QuotaLedger | None
    quota_at: float
    """When `quota` was read (monotonic clock)."""


@dataclass(slots=True)
class _Node:
    name: str
    epoch: str
    revision: int
    usage: NodeSnapshot
    pods: dict[str, TrackedPod]
    stale: bool = False
    marks: int = 0
    """Counts `stale` markings, so a snapshot in flight during one does not clear it."""
    expected: int = 0
    expected_at: float = 0.0
    local: bool = False
    """The current revision was applied from our own commit; its usage update is to come."""
    tick: int = 0
    """The model's tick when the current revision was set (see `ReadModel.ticket`)."""
    confirmed: bool = True
    """Accounting's own answer set the current revision (a snapshot, or our commit's reply),
    not a published update."""
    ahead: bool = False
    """Kept ahead of accounting's last snapshot on an update's word only: fetched again
    before a refit decides on it."""


@dataclass(frozen=True, slots=True)
class _Fetched:
    """One snapshot reply, as read: the node asked about (None when accounting does not know
    it), the podUID it was asked with and, when one was, that pod's entry as sent."""

    epoch: str
    state: NodeState | None
    asked: str
    pod: TrackedPodWire | None

    def tracked(self) -> TrackedPod | None:
        """The asked pod's entry (None when not tracked anywhere); `MessageError` when it
        does not parse."""
        return None if self.pod is None else self.pod.to_core()


@dataclass(slots=True)
class _Fetch:
    future: asyncio.Future[_Fetched]


class ReadModel:
    def __init__(
        self,
        nc: Client,
        accounting: AccountingClient,
        supervisor: Supervisor,
        *,
        max_nodes: int = MAX_NODES,
        on_fetch: Callable[[], None] | None = None,
    ) -> None:
        """Shared fetches run as `supervisor`'s children (cancelled when it stops)."""
        self.nc = nc
        self.accounting = accounting
        self.supervisor = supervisor
        self.max_nodes = max_nodes
        self.on_fetch = on_fetch
        self._nodes: dict[str, _Node] = {}
        self._tokens: dict[str, str] = {}
        self._quota: dict[str, tuple[QuotaLedger, float]] = {}
        self._fetches: dict[tuple[str, str], _Fetch] = {}
        self._claims = Claims()
        """Moves in flight and waits for a node's next change (claims.py)."""
        self._subscription: Subscription | None = None
        self.fetches = 0
        self._tick = 0
        """Counts revision changes of the nodes: a snapshot request takes it when sent, so that
        its answer tells what was set before it from what was set while it travelled."""

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(subjects.USAGE_WILDCARD, cb=self._on_usage)

    async def stop(self) -> None:
        # The fetches are the supervisor's children: it cancels them when it stops (first).
        for fetch in list(self._fetches.values()):
            fetch.future.cancel()
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
            self._subscription = None

    def mark_all_stale(self) -> None:
        """Updates may have been missed (a reconnect): fetch every node before trusting it."""
        for name in list(self._nodes):
            self.mark_stale(name)
        self._quota.clear()

    # --- what the model holds ---------------------------------------------------------------

    def nodes(self) -> list[str]:
        return list(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def revision(self, node: str) -> int | None:
        entry = self._nodes.get(node)
        return None if entry is None else entry.revision

    def mark_stale(self, node: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None:
            entry.stale = True
            entry.marks += 1
        self._pulse(node)

    def expect(self, node: str, revision: int) -> None:
        """A commit on `node` answered with `revision`: older usage is stale."""
        entry = self._nodes.get(node)
        if entry is not None and revision > entry.revision:
            entry.expected = max(entry.expected, revision)
            entry.expected_at = time.monotonic()

    def own_commit(
        self,
        node: str,
        epoch: str,
        revision: int,
        old: Mapping[str, Usage],
        new: Mapping[str, Usage],
    ) -> bool:
        """Our own move landed at `revision`: when it is the node's next revision (nothing
        else happened since the view), apply it here at once instead of waiting for its usage
        update (which then only confirms it). False when the caller must wait for the update."""
        entry = self._nodes.get(node)
        if (
            entry is None
            or entry.stale
            or entry.epoch != epoch
            or revision != entry.revision + 1
            or entry.revision < entry.expected
        ):
            return False
        updated = without_pod(entry.usage, old)
        updated.add_pod_usage(new)
        entry.usage, entry.revision, entry.local = updated, revision, True
        # Accounting's own reply named the revision: confirmed (its update confirms the usage).
        self._stamp(entry, confirmed=True)
        self._pulse(node)
        return True

    def replace_pod(self, node: str, tracked: TrackedPod) -> None:
        """The pod's entry after our own commit (what accounting wrote)."""
        entry = self._nodes.get(node)
        if entry is not None and tracked.node == node:
            entry.pods[tracked.uid] = tracked

    def forget_pod(self, node: str, uid: str) -> None:
        entry = self._nodes.get(node)
        if entry is not None:
            entry.pods.pop(uid, None)

    def forget_quota(self, namespace: str) -> None:
        self._quota.pop(namespace, None)

    # --- usage updates ----------------------------------------------------------------------

    async def _on_usage(self, msg: Msg) -> None:
        # Updates of nodes nobody asked about are dropped before they are even parsed.
        node = self._tokens.get(subjects.last_token(msg.subject))
        if node is None:
            return
        try:
            update = messages.decode(msg.data, UsageUpdate)
        except MessageError as exc:
            # Something about the node changed, but what cannot be told: fetch before trusting.
            log.warning("usage update ignored", extra={"error": subjects.shown(str(exc), 200)})
            self.mark_stale(node)
            return
        self.apply_update(
            update.epoch, node, update.revision, update.devices, deleted=update.deleted
        )

    def drop(self, node: str) -> None:
        """The node is gone (deleted, or evicted): forget it."""
        if self._nodes.pop(node, None) is not None:
            self._tokens.pop(node.replace(".", "_"), None)
        self._pulse(node)

    def apply_update(
        self,
        epoch: str,
        node: str,
        revision: int,
        devices: Mapping[str, UsageEntry],
        *,
        deleted: bool = False,
    ) -> None:
        """Apply one published usage table (or `deleted`), or mark the node for a fetch (the
        core's rule)."""
        entry = self._nodes.get(node)
        updated = None if entry is None else messages.apply_usage(entry.usage, devices)
        table = Table.OTHER_DEVICES
        if entry is not None and updated is not None:
            same = updated.usage_table() == entry.usage.usage_table()
            table = Table.UNCHANGED if same else Table.CHANGED
        action = update_action(
            None if entry is None else Held(entry.epoch, entry.revision, entry.local),
            epoch=epoch,
            revision=revision,
            deleted=deleted,
            table=table,
            covered=False,  # only nodes some refit asked about are kept: no view, no interest
        )
        if entry is None or action is UpdateAction.IGNORE:
            return
        if action is UpdateAction.DROP:
            self.drop(node)
            return
        if action is UpdateAction.FETCH:
            self.mark_stale(node)
            return
        if action is UpdateAction.CONFIRM:
            # The update of our own commit, applied here already: it only confirms it (and
            # corrects it, were the two ever to differ).
            entry.local = False
            if table is Table.CHANGED:
                log.warning("own commit differed from its usage update", extra={"node": node})
                assert updated is not None
                entry.usage = updated
            return
        assert updated is not None  # APPLY, APPLY_UNCONFIRMED: the table fits
        entry.usage, entry.revision = updated, revision
        self._stamp(entry, confirmed=False)
        if action is UpdateAction.APPLY_UNCONFIRMED:
            # A change the table does not show may hide in it: a refit decides and refuses in
            # one step, so it is fetched before the next refit decides on it.
            entry.stale = True
            entry.marks += 1
        self._pulse(node)

    # --- claims: moves in flight (claims.py) ----------------------------------------------

    def claim(
        self, node: str, pod_uid: str, usage: Mapping[str, Usage]
    ) -> contextlib.AbstractContextManager[None]:
        """Count `usage` for every other refit on `node` while the move is in flight."""
        return self._claims.claim(node, pod_uid, usage)

    def moving(self, node: str, pod_uid: str) -> bool:
        """Is a move of `pod_uid` on `node` in flight (sent, its reply not applied yet)?"""
        return self._claims.moving(node, pod_uid)

    def claims(self, node: str, excluding: str) -> list[Claim]:
        return self._claims.of(node, excluding)

    def _pulse(self, node: str) -> None:
        self._claims.pulse(node)

    async def wait_change(self, node: str, within: float) -> bool:
        """Wait until something about `node` changes (an update, a claim settles); False when
        `within` seconds passed first."""
        return await self._claims.wait_change(node, within)

    # --- views ------------------------------------------------------------------------------

    async def view(
        self, node: str, pod_uid: str, namespace: str, deadline: Deadline, reserve: float
    ) -> View:
        """The node's usage, the target pod's tracked entry and its namespace's quota, fetched
        only when the model cannot tell them. Bounded by `deadline` less `reserve`."""
        entry = self._nodes.get(node)
        while entry is not None and entry.revision < entry.expected and not entry.stale:
            # Our own commit landed and its update is on the way: wait a moment for it.
            left = entry.expected_at + LANDED_GRACE - time.monotonic()
            wait = min(left, deadline.remaining() - reserve)
            if not (wait > 0 and await self.wait_change(node, wait)):
                self.mark_stale(node)
            entry = self._nodes.get(node)
        quota = self._fresh_quota(namespace)
        if entry is not None and not entry.stale:
            self._touch(node, entry)
            pod = entry.pods.get(pod_uid)
            if pod is not None and quota is not None:
                return View(entry.epoch, entry.revision, entry.usage, pod, quota[0], quota[1])
        # Unknown, stale, or the pod is not among the node's: one snapshot shared by every
        # refit of the node waiting for it.
        fetched = await self._fetch(node, pod_uid, namespace, deadline, reserve, shared=True)
        entry = self._nodes.get(node)
        if entry is not None and entry.ahead:
            # Kept ahead of the answer on the word of an update that arrived while it
            # travelled, maybe a forged or buggy one: a refusal must not rest on it. One more
            # snapshot, asked after it was set, confirms or overrules it.
            fetched = await self._fetch(node, pod_uid, namespace, deadline, reserve, shared=True)
            entry = self._nodes.get(node)
        pod = entry.pods.get(pod_uid) if entry is not None else None
        if pod is None and fetched.asked == pod_uid:
            pod = fetched.tracked()  # tracked on another node, or not at all
        elif pod is None or namespace not in self._quota:
            # The shared snapshot was someone else's question: ask ours.
            fetched = await self._fetch(node, pod_uid, namespace, deadline, reserve, shared=False)
            entry = self._nodes.get(node)
            pod = entry.pods.get(pod_uid) if entry is not None else None
            pod = pod or fetched.tracked()
        quota = self._quota.get(namespace) or (QuotaLedger(), time.monotonic())
        if entry is not None:
            return View(entry.epoch, entry.revision, entry.usage, pod, quota[0], quota[1])
        # Not kept (accounting holds no inventory for it): decide on what the snapshot said.
        state = fetched.state
        usage = None if state is None else state.snapshot()
        revision = 0 if state is None else state.revision
        return View(fetched.epoch, revision, usage, pod, quota[0], quota[1])

    async def refresh_quota(
        self, node: str, namespace: str, deadline: Deadline, reserve: float
    ) -> QuotaLedger | None:
        """The namespace's quota as accounting counts it now."""
        self._quota.pop(namespace, None)
        await self._fetch(node, "", namespace, deadline, reserve, shared=False)
        cached = self._quota.get(namespace)
        return None if cached is None else cached[0]

    async def pod_entry(
        self, node: str, pod_uid: str, deadline: Deadline, reserve: float
    ) -> TrackedPod | None:
        """The pod's entry as accounting holds it now (one snapshot of its own)."""
        fetched = await self._fetch(node, pod_uid, "", deadline, reserve, shared=False)
        return fetched.tracked()

    def _fresh_quota(self, namespace: str) -> tuple[QuotaLedger, float] | None:
        cached = self._quota.get(namespace)
        # Trusted for the core's QUOTA_TTL: accounting re-checks every move against the current
        # quota, and a refusal by quota is only given on a quota read for it.
        if cached is None or not quota_fresh(cached[1], time.monotonic()):
            return None
        return cached

    async def _fetch(
        self,
        node: str,
        pod_uid: str,
        namespace: str,
        deadline: Deadline,
        reserve: float,
        *,
        shared: bool,
    ) -> _Fetched:
        """One snapshot of `node`; `shared`: concurrent callers for the node wait on one (a
        child of the supervisor, so that no fetch outlives the service)."""
        key = (node, "" if shared else f"{pod_uid}\0{namespace}")
        fetch = self._fetches.get(key)
        if fetch is None or fetch.future.done():
            entry = self._nodes.get(node)
            marks = entry.marks if entry is not None else 0
            budget = deadline.remaining() - reserve
            future = self.supervisor.submit(
                self._snapshot(node, pod_uid, namespace, budget, marks), name=f"snapshot-{node}"
            )
            fetch = self._fetches[key] = _Fetch(future)
            future.add_done_callback(functools.partial(self._fetch_done, key, fetch))
        # Followers wait at most their own budget on someone else's fetch.
        try:
            async with asyncio.timeout(max(deadline.remaining() - reserve, 0.0)):
                return await asyncio.shield(fetch.future)
        except TimeoutError as exc:
            raise AccountingUnavailable(f"no snapshot of {node} within the budget") from exc

    def _fetch_done(self, key: tuple[str, str], fetch: _Fetch, _: object) -> None:
        # (The supervisor marks the outcome retrieved: followers that gave up leave none unseen.)
        if self._fetches.get(key) is fetch:
            del self._fetches[key]

    async def _snapshot(
        self, node: str, pod_uid: str, namespace: str, budget: float, marks: int
    ) -> _Fetched:
        """`MessageError` when the reply's node or quota does not parse."""
        if budget <= 0:
            raise AccountingUnavailable("no budget left for a snapshot")
        self.fetches += 1
        if self.on_fetch is not None:
            self.on_fetch()
        request = SnapshotRequest(node=node, pod_uid=pod_uid or None, namespace=namespace or None)
        sent = self._tick
        reply = await self.accounting.ask(request, SnapshotReply, budget)
        if not reply.ok:
            raise SnapshotRefused(
                Code.parse(reply.code),
                subjects.shown(reply.error or "snapshot refused", 200),
            )
        epoch = reply.epoch or ""  # (an `ok` snapshot reply always has one)
        state = next((n.to_state() for n in reply.nodes or () if n.node == node), None)
        self._store(node, epoch, state, marks, sent)
        if namespace and reply.quota is not None:
            self._keep_quota(namespace, reply.quota.to_core())
        pod = reply.pod if isinstance(reply.pod, TrackedPodWire) else None
        return _Fetched(epoch, state, pod_uid, pod)

    def _store(self, node: str, epoch: str, state: NodeState | None, marks: int, sent: int) -> None:
        """Take a snapshot of `node` asked for at tick `sent`; what wins over the held view is
        shared/core/freshness.py's rule."""
        if state is None or state.devices is None:
            # Accounting knows no inventory for it: nothing worth keeping.
            self.drop(node)
            return
        snapshot = state.snapshot()
        assert snapshot is not None
        pods = {p.uid: p for p in state.pods}
        entry = self._nodes.get(node)
        verdict = Verdict.TAKE
        if entry is not None:
            verdict = snapshot_verdict(
                held_epoch=entry.epoch,
                held_revision=entry.revision,
                held_tick=entry.tick,
                held_confirmed=entry.confirmed,
                epoch=epoch,
                revision=state.revision,
                sent=sent,
            )
        if entry is not None and verdict is not Verdict.TAKE:
            # Newer than this snapshot and set while it travelled: keep its usage.
            entry.pods = pods
            if verdict is Verdict.RECHECK:
                # On an update's word only: stale until a snapshot asked after it decides.
                entry.stale, entry.ahead = True, True
                entry.marks += 1
        elif entry is not None:
            if entry.epoch != epoch:
                entry.expected = 0  # revisions of accounting's previous run mean nothing
            elif state.revision < entry.revision:
                # Ahead of an answer accounting gave after it was seen: impossible, so the
                # update was forged or buggy (worth a look by whoever runs the cluster).
                log.warning("usage view ahead of accounting dropped", extra={"node": node})
            entry.epoch, entry.revision, entry.usage, entry.pods = (
                epoch,
                state.revision,
                snapshot,
                pods,
            )
            entry.local, entry.ahead = False, False
            self._stamp(entry, confirmed=True)
        else:
            entry = _Node(node, epoch, state.revision, snapshot, pods)
            self._stamp(entry, confirmed=True)
            self._nodes[node] = entry
            self._tokens[node.replace(".", "_")] = node
            self._evict()
        if entry.marks == marks:
            entry.stale = False
        if entry.expected and entry.revision >= entry.expected:
            entry.expected = 0
        self._pulse(node)

    def _stamp(self, entry: _Node, *, confirmed: bool) -> None:
        self._tick += 1
        entry.tick, entry.confirmed = self._tick, confirmed

    def _keep_quota(self, namespace: str, quota: QuotaLedger) -> None:
        self._quota.pop(namespace, None)
        self._quota[namespace] = (quota, time.monotonic())
        while len(self._quota) > MAX_NAMESPACES:
            del self._quota[next(iter(self._quota))]

    def _touch(self, node: str, entry: _Node) -> None:
        # Least recently used order: move to the end (dicts keep insertion order).
        if next(reversed(self._nodes)) != node:
            del self._nodes[node]
            self._nodes[node] = entry

    def _evict(self) -> None:
        while len(self._nodes) > self.max_nodes:
            oldest = next(iter(self._nodes))
            self.drop(oldest)
