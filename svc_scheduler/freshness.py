"""How fresh the scheduler's read model is: pure bookkeeping, no I/O.

`Freshness` holds every node's view (devices, usage, revision) as accounting last said, and
decides from each message what it proves: an update that applies in place, or one that cannot
be trusted to describe the node completely, so that the node must be fetched again.
`ReadModel` (read_model.py) does the I/O around it: it feeds it usage updates and snapshots
and fetches what it reports stale.

What an update or a snapshot does to a node's view is shared/core/freshness.py's rule, the one
the refit's read model applies too; this module keeps the state it is applied to:

- before the first snapshot updates are ignored (that snapshot includes them); after it, an
  update of a node without a view announces a new node, to fetch;
- an update under another epoch than the node's view, another device set, a node without
  inventory: that node is stale (only that node: a takeover publishes each of its nodes);
- a revision gap, or a revision bump with unchanged usage: the update is applied, but the node
  is *unconfirmed* until a snapshot; a decision may rest on it, a refusal may not: the extender
  fetches the unconfirmed candidates before it refuses a pod (`unconfirmed`);
- an applied update carries the node's lock (`allocating`); a snapshot's lock is computed from
  its pods by the core's rule, so both ways give the same view;
- a commit answered with a revision (`expect`): the node is stale until it holds that one;
- a snapshot is the authority: a view ahead of its answer set before its request was sent is
  dropped for it (the caller logs it); one set by an update while the request travelled is
  kept but stays stale (`ahead_of_accounting`), and the next fetch decides. A request tells
  when it was sent by `ticket()`, the count of view changes so far;
- `deleted` (the Node was deleted) drops the node.

A node the last full snapshot did not hold, and that no update has named since, does not exist
for accounting: it is neither known nor stale, so no fetch is asked for it.

Quota: a namespace's GPU quota is remembered with the time it was read; one without limits is
trusted for the core's `QUOTA_TTL` seconds, a limited one never (its usage moves with every
reservation in the namespace). Times are given by the caller (`time.monotonic()`), so this
stays pure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared import subjects
from shared.core.freshness import (
    Held,
    Table,
    UpdateAction,
    Verdict,
    quota_fresh,
    snapshot_verdict,
    update_action,
)
from shared.messages import UsageUpdate, apply_usage

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from shared.core.lock import Lock
    from shared.core.model import NodeSnapshot
    from shared.core.quota import QuotaLedger

__all__ = ["Freshness", "NodeView"]


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node at one revision. Never changed after creation: a filter that captured it keeps
    a consistent (snapshot, revision) pair while other updates arrive."""

    name: str
    revision: int
    snapshot: NodeSnapshot | None
    """Devices with the usage accounting counts; None when the node has no GPU inventory."""
    lock: Lock | None = None
    """The pod holding the node's lock (HAMi's: one pod allocating at a time), whatever its
    age: the filter judges the expiry (shared/core/lock.py)."""
    epoch: str = ""
    """The epoch the revision counts in (one accounting run, or one partition ownership)."""


@dataclass(slots=True)
class Freshness:
    """Every node's view and what of it must be fetched again."""

    epoch: str | None = None
    """Accounting's epoch of the last snapshot; None until the first has landed."""
    needs_full: bool = True
    """Everything must be fetched again (on start, after a reconnect)."""
    _views: dict[str, NodeView] = field(default_factory=dict)
    _stale: set[str] = field(default_factory=set)
    _expected: dict[str, int] = field(default_factory=dict)
    _tick: int = 0
    """Counts view changes: a request's `ticket()` tells which views were set before it."""
    _stamps: dict[str, tuple[int, bool]] = field(default_factory=dict)
    """Per node with a view: the tick that set it, and whether a snapshot (True) or an update
    did."""
    _ahead: set[str] = field(default_factory=set)
    """Nodes whose view is ahead of accounting's last answer on an update's word only."""
    _unconfirmed: set[str] = field(default_factory=set)
    """Nodes whose view an update set that may have hidden a change (a gap, unchanged usage):
    good to decide on, to be fetched before a refusal rests on it."""
    _quota: dict[str, tuple[QuotaLedger, float]] = field(default_factory=dict)

    # --- what is known ----------------------------------------------------------------------

    def __len__(self) -> int:
        """Nodes with a view."""
        return len(self._views)

    def view(self, node: str) -> NodeView | None:
        return self._views.get(node)

    def is_fresh(self, node: str) -> bool:
        """Known, not stale, and at least at the revision a commit answered."""
        view = self._views.get(node)
        return (
            view is not None
            and node not in self._stale
            and view.revision >= self._expected.get(node, 0)
        )

    def needs_fetch(self, node: str) -> bool:
        """Stale, or known to have changed; a node nobody has named since the last full
        snapshot is absent, not stale."""
        if node in self._views:
            return not self.is_fresh(node)
        return node in self._stale

    def to_fetch(self, names: Iterable[str]) -> list[str]:
        """Those of `names` (once each, in order) that need a fetch."""
        asked = dict.fromkeys(names)
        if self._stale:
            return [name for name in asked if self.needs_fetch(name)]
        # Nothing stale (the usual case): only a node with a commit not yet seen can need a
        # fetch, and those are few; ask about them, not about every node of the cluster.
        found = {name for name in self._expected if name in asked and self.needs_fetch(name)}
        if len(found) <= 1:
            return list(found)
        return [name for name in asked if name in found]

    def ahead_of_accounting(self, names: Iterable[str]) -> list[str]:
        """Those of `names` (once each, in order) whose view is ahead of accounting's last
        answer on an update's word only: a decision must not rest on them before one more
        fetch."""
        if not self._ahead:
            return []
        return [name for name in dict.fromkeys(names) if name in self._ahead]

    def ticket(self) -> int:
        """To take before a snapshot request is sent, and hand to `apply_snapshot` with its
        answer: tells the views set before the request from those set while it travelled."""
        return self._tick

    def views_of(self, names: Sequence[str]) -> dict[str, NodeView | None]:
        """The view of each of `names` (None where there is none)."""
        return dict(zip(names, map(self._views.get, names), strict=True))

    # --- what changes it --------------------------------------------------------------------

    def apply_update(self, update: UsageUpdate) -> None:
        """Apply one published usage table, or mark the node for a fetch (the core's rule)."""
        node = update.node
        if not subjects.valid_name(node):
            return  # accounting only knows Kubernetes node names
        view = self._views.get(node)
        updated, table = None, Table.OTHER_DEVICES
        if view is not None:
            updated = _with_usage(view.snapshot, update)
            if updated is not None:
                same = _same_usage(updated, view.snapshot)
                table = Table.UNCHANGED if same else Table.CHANGED
        action = update_action(
            None if view is None else Held(view.epoch, view.revision),
            epoch=update.epoch,
            revision=update.revision,
            deleted=update.deleted,
            table=table,
            covered=self.epoch is not None,
        )
        if action is UpdateAction.DROP:
            self.drop(node)
        elif action is UpdateAction.FETCH:
            self._stale.add(node)
        elif action in (UpdateAction.APPLY, UpdateAction.APPLY_UNCONFIRMED):
            if action is UpdateAction.APPLY_UNCONFIRMED:
                self._unconfirmed.add(node)
            lock = update.allocating.to_core() if update.allocating is not None else None
            self._views[node] = NodeView(node, update.revision, updated, lock, update.epoch)
            self._stamp(node, confirmed=False)
        # IGNORE; CONFIRM never comes (this reader applies no commit of its own).

    def unconfirmed(self, names: Iterable[str]) -> list[str]:
        """Those of `names` (once each, in order) whose view may hide a change: fetched before
        a refusal rests on them."""
        if not self._unconfirmed:
            return []
        return [name for name in dict.fromkeys(names) if name in self._unconfirmed]

    def apply_snapshot(
        self,
        epoch: str,
        views: Iterable[NodeView],
        *,
        full: bool,
        asked: str | None = None,
        sent: int | None = None,
    ) -> list[str]:
        """Store a snapshot of every node (`full`) or of the node `asked` for; a node asked for
        and not in it is unknown to accounting: dropped (absent, not stale). `sent`: the
        `ticket()` taken before the request was sent (None: just now, after every view held).
        Returns the nodes whose view the snapshot overruled (ahead of it, set before the request
        was sent: a forged or buggy update)."""
        if sent is None:
            sent = self._tick
        # A view without its own epoch counts in the snapshot's.
        received = [v if v.epoch else dataclasses.replace(v, epoch=epoch) for v in views]
        previous, stamps = self._views, self._stamps
        if full:
            self._views, self._stamps = {}, {}
            self._stale.clear()
            self._ahead.clear()
            self._unconfirmed.clear()
            self.needs_full = False
        # A node of a new epoch says nothing of the others (the core's rule, on epochs).
        self.epoch = epoch
        overruled = []
        for view in received:
            name = view.name
            current = previous.get(name)
            if current is not None:
                if current.epoch != view.epoch:
                    # Revisions of another epoch mean nothing here: what a commit answered too.
                    self._expected.pop(name, None)
                stamp = stamps.get(name, (0, True))
                verdict = snapshot_verdict(
                    held_epoch=current.epoch,
                    held_revision=current.revision,
                    held_tick=stamp[0],
                    held_confirmed=stamp[1],
                    epoch=view.epoch,
                    revision=view.revision,
                    sent=sent,
                )
                if verdict is not Verdict.TAKE:
                    # Newer than this answer and set while it travelled: kept. On an update's
                    # word only, it stays stale: the next fetch, sent after it, decides.
                    self._views[name], self._stamps[name] = current, stamp
                    if verdict is Verdict.RECHECK:
                        self._stale.add(name)
                        self._ahead.add(name)
                    continue
                if current.epoch == view.epoch and current.revision > view.revision:
                    overruled.append(name)  # impossible: accounting answered after it
            self._views[name] = view
            self._stamp(name, confirmed=True)
            self._stale.discard(name)
            self._ahead.discard(name)
            self._unconfirmed.discard(name)
        if asked is not None and all(v.name != asked for v in received):
            self.drop(asked)
        return overruled

    def expect(self, node: str, revision: int) -> None:
        """A commit answered with `revision`: anything older is stale for this node."""
        self._expected[node] = max(self._expected.get(node, 0), revision)

    def invalidate(self, node: str) -> None:
        """The node must be fetched before the next decision on it."""
        self._stale.add(node)

    def invalidate_all(self) -> None:
        """Updates may have been missed (a reconnect): everything is fetched again."""
        self.needs_full = True

    def drop(self, node: str) -> None:
        """The node was deleted (or accounting does not know it): forget everything about it."""
        self._views.pop(node, None)
        self._stamps.pop(node, None)
        self._stale.discard(node)
        self._ahead.discard(node)
        self._unconfirmed.discard(node)
        self._expected.pop(node, None)

    def _stamp(self, node: str, *, confirmed: bool) -> None:
        self._tick += 1
        self._stamps[node] = (self._tick, confirmed)

    # --- quota ------------------------------------------------------------------------------

    def remember_quota(self, namespace: str, quota: QuotaLedger, now: float) -> None:
        self._quota[namespace] = (quota, now)

    def cached_quota(self, namespace: str, now: float) -> QuotaLedger | None:
        """A namespace known to have no GPU limits (recently); None means: ask accounting."""
        cached = self._quota.get(namespace)
        if cached is None:
            return None
        quota, at = cached
        if quota.limited(namespace) or not quota_fresh(at, now):
            return None
        return quota

    def forget_quota(self, namespace: str) -> None:
        self._quota.pop(namespace, None)


def _with_usage(snapshot: NodeSnapshot | None, update: UsageUpdate) -> NodeSnapshot | None:
    """`snapshot` with the published usage, or None when the table cannot be applied as is
    (a node without inventory, or another device set: see the module docstring)."""
    if snapshot is None:
        return None
    return apply_usage(snapshot, update.devices)


def _same_usage(updated: NodeSnapshot, snapshot: NodeSnapshot | None) -> bool:
    return snapshot is not None and [d.as_dict() for d in updated.devices] == [
        d.as_dict() for d in snapshot.devices
    ]
