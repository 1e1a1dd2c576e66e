"""Which wins when a reader's view of a node meets accounting's snapshot of it: the one rule
both read models (svc_scheduler/freshness.py, svc_refit/read_model.py) apply.

A reader follows a node with published usage updates (`numafit.usage.v1.<node>`) and fetches a
snapshot when it cannot trust them. Accounting's snapshot is the authority; an update is only a
message on a subject, and a forged or buggy one (say "GPUs full" at the next revision) must not
outlive the next snapshot. What a snapshot answer at revision S proves about the held view at
revision V (same epoch):

- V <= S: the snapshot is as new or newer: it replaces the view (`TAKE`).
- V > S, and the view was set before the request was sent: accounting publishes an update only
  after the change it describes, and answered the request after the reader had seen that
  update, so its answer cannot be behind it. A view ahead of the authority's own later answer is
  impossible: it is dropped and the snapshot taken (`TAKE`).
- V > S, and the view was set while the request travelled: an update of a change made after
  accounting answered may overtake the reply, so the view is kept. When a snapshot set it (a
  concurrent fetch, answered later) accounting itself said so (`KEEP`); when only an update says
  so, nothing has confirmed it: it is kept but fetched again before it is trusted (`RECHECK`),
  and that fetch, sent after the view was set, decides by the rule above.
- another epoch: revisions of another accounting run (or partition ownership) do not compare;
  the snapshot replaces the view (`TAKE`).

"Set before the request was sent" is told by a counter the reader keeps: every change of a view
takes the next tick, and the tick current when a request is sent travels with it. A view whose
tick is above the request's was set while it travelled. Taking the tick before the request is
actually sent is the safe side: a view set in between only counts as in flight (kept, fetched
again), never as impossible.
"""

from __future__ import annotations

import enum

__all__ = ["Verdict", "snapshot_verdict"]


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
