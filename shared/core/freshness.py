"""How fresh a reader's view of a node is: the one rule both read models (the scheduler's,
svc_scheduler/freshness.py, and the refit's, svc_refit/read_model.py) apply to what accounting
tells them, a published usage update or a snapshot answer. Pure: the readers hold the state and
do the I/O; time, where it matters, is passed in.

A reader follows a node with published usage updates (`numafit.usage.v1.<node>`) and fetches a
snapshot when it cannot trust them. Accounting's snapshot is the authority; an update is only a
message on a subject.

**Epochs.** A node's revisions count within an epoch: one accounting run, or (partitioned) one
ownership of the node's partition, named by the lease that grants it (svc_accounting/leases.py,
docs/operate/scaling-accounting.md). Revisions of two epochs do not compare: a
takeover rebuilds the ledger from the pods' annotations, and the holds of the previous owner
are gone. Every new epoch is *per node*: the new owner publishes every node of the partition
under it before it serves anything, and a decision computed on a view of another epoch is
refused `conflict` (fencing). So an update under another epoch than the node's view makes that
node stale, and only that node: the other nodes of the partition get their own update under the
new epoch, and nodes of other partitions did not change owner. (The scheduler's read model used
to fetch every node of the cluster on an epoch it had not seen, which turns each takeover, and a
rolling restart of accounting moves many, into a cluster-wide snapshot per scheduler replica
while protecting nothing the per-node rule does not.)

**Usage updates** (`update_action`), in order:

- no view of the node: a reader whose last full snapshot covered every node (the scheduler)
  learns of a new node, to fetch (`FETCH`), or of one deleted (`DROP`); before that snapshot,
  or for a reader that keeps only the nodes it was asked about (the refit), there is nothing to
  apply the table to and the node's first snapshot will include it (`IGNORE`);
- another epoch than the view's: the node is stale (`FETCH`), even for `deleted` (the word of
  another ownership about the node: the fetch decides, and costs one snapshot);
- `deleted`: the node is dropped (`DROP`);
- a revision not above the view's: already seen, a snapshot overtook it (`IGNORE`); at the
  view's own revision when the reader applied its own commit there before the update came, it
  confirms that commit (`CONFIRM`);
- a table for another device set (or a view with no inventory to apply it to): the node is
  stale (`FETCH`);
- a revision gap, or a revision bump with unchanged usage: the table is the node's latest and is
  applied, but a change it does not show (a cordon, a register change, a pod's bind phase) may
  hide in the gap (`APPLY_UNCONFIRMED`). A decision may rest on it, since accounting re-checks
  every reserve and move (revision or pod resourceVersion, epoch, capacity, quota) and refuses
  what no longer holds; a refusal, checked by nobody, may not: the node is fetched before a
  refusal rests on it. The scheduler does so when it is about to refuse; the refit, which
  decides and refuses in one step, fetches before it decides on the node at all. Under load
  most updates are of this kind (two commits close together publish one revision apart by two),
  so fetching for each would make nearly every filter wait for a snapshot;
- otherwise the next revision with a change: applied (`APPLY`).

**Snapshots** (`snapshot_verdict`). What a snapshot answer at revision S proves about the held
view at revision V (same epoch):

- V <= S: the snapshot is as new or newer: it replaces the view (`TAKE`).
- V > S, and the view was set before the request was sent: accounting publishes an update only
  after the change it describes, and answered the request after the reader had seen that
  update, so its answer cannot be behind it. A view ahead of the authority's own later answer is
  impossible (a forged or buggy update, say "GPUs full" at the next revision): it is dropped and
  the snapshot taken (`TAKE`).
- V > S, and the view was set while the request travelled: an update of a change made after
  accounting answered may overtake the reply, so the view is kept. When a snapshot set it (a
  concurrent fetch, answered later) accounting itself said so (`KEEP`); when only an update says
  so, nothing has confirmed it: it is kept but fetched again before it is trusted (`RECHECK`),
  and that fetch, sent after the view was set, decides by the rule above.
- another epoch: the snapshot replaces the view (`TAKE`), and a revision a commit answered under
  the old epoch is no longer awaited.

"Set before the request was sent" is told by a counter the reader keeps: every change of a view
takes the next tick, and the tick current when a request is sent travels with it. A view whose
tick is above the request's was set while it travelled. Taking the tick before the request is
actually sent is the safe side: a view set in between only counts as in flight (kept, fetched
again), never as impossible.

**Quota** read with a snapshot is trusted for `QUOTA_TTL` seconds (`quota_fresh`); what each
reader does beyond that is its own (the scheduler never trusts a limited namespace's quota from
its cache, the refit re-reads before it refuses by quota).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = [
    "QUOTA_TTL",
    "Held",
    "Table",
    "UpdateAction",
    "Verdict",
    "quota_fresh",
    "snapshot_verdict",
    "update_action",
]

QUOTA_TTL: Final = 5.0
"""Seconds a namespace's quota read with a snapshot is trusted without asking again."""


@dataclass(frozen=True, slots=True)
class Held:
    """What a reader holds of one node, as far as the rule needs it."""

    epoch: str
    revision: int
    local: bool = False
    """The revision was applied from the reader's own commit; its update is still to come."""


class Table(enum.Enum):
    """What an update's usage table does to the held usage."""

    CHANGED = "changed"
    UNCHANGED = "unchanged"
    OTHER_DEVICES = "other_devices"
    """Another device set, or no inventory held to apply it to: it cannot be applied as is."""


class UpdateAction(enum.Enum):
    IGNORE = "ignore"
    """Nothing to do: already seen, or nothing held to apply it to."""
    DROP = "drop"
    """The node was deleted: forget it (absent, not stale)."""
    FETCH = "fetch"
    """Cannot be applied: the node is stale until a snapshot."""
    CONFIRM = "confirm"
    """The update of the reader's own commit, applied already: it confirms (or corrects) it."""
    APPLY = "apply"
    """The node's next revision: apply the table."""
    APPLY_UNCONFIRMED = "apply_unconfirmed"
    """Apply the table; a change it does not show may hide: no refusal rests on the view
    until a snapshot confirms it."""


def update_action(
    held: Held | None,
    *,
    epoch: str,
    revision: int,
    deleted: bool,
    table: Table,
    covered: bool,
) -> UpdateAction:
    """What a usage update (`epoch`, `revision`, `deleted`) does to the held view of its node.
    `table`: what the update's usage table does to the held usage (anything when nothing is
    held). `covered`: the reader's last full snapshot held every node accounting knows,
    so a node it has no view of is new to it."""
    if held is None:
        if not covered:
            return UpdateAction.IGNORE
        return UpdateAction.DROP if deleted else UpdateAction.FETCH
    if epoch != held.epoch:
        return UpdateAction.FETCH  # the node's revisions restarted under another ownership
    if deleted:
        return UpdateAction.DROP
    if revision < held.revision:
        return UpdateAction.IGNORE
    if revision == held.revision:
        return UpdateAction.CONFIRM if held.local else UpdateAction.IGNORE
    if table is Table.OTHER_DEVICES:
        return UpdateAction.FETCH
    if revision > held.revision + 1 or table is Table.UNCHANGED:
        return UpdateAction.APPLY_UNCONFIRMED
    return UpdateAction.APPLY


class Verdict(enum.Enum):
    TAKE = "take"
    """The snapshot replaces the view."""
    KEEP = "keep"
    """The view is newer than this answer, and a later answer of accounting's said so."""
    RECHECK = "recheck"
    """The view is ahead of the answer on an update's word only: keep it, fetch the node again
    before trusting it."""


def snapshot_verdict(
    *,
    held_epoch: str,
    held_revision: int,
    held_tick: int,
    held_confirmed: bool,
    epoch: str,
    revision: int,
    sent: int,
) -> Verdict:
    """What a snapshot answer (`epoch`, `revision`) of a request sent at tick `sent` does to the
    held view: at `held_revision` under `held_epoch`, set at tick `held_tick`, by a snapshot
    (`held_confirmed`) or by an update."""
    if held_epoch != epoch or held_revision <= revision:
        return Verdict.TAKE
    if held_tick <= sent:
        return Verdict.TAKE  # ahead of an answer given after it was seen: impossible
    return Verdict.KEEP if held_confirmed else Verdict.RECHECK


def quota_fresh(read_at: float, now: float) -> bool:
    """Is a quota read at `read_at` still to be trusted at `now` (same clock)?"""
    return now - read_at <= QUOTA_TTL
