"""Which requests this accounting replica answers.

One replica (`--partitions 0`) answers every node, alone: it joins the `numafit-accounting`
queue group as before and refuses to start beside another instance.

Partitioned (the default): every replica subscribes to every accounting subject (each in a
queue group of its own, so each receives every request) and answers only for the nodes of the
partitions it serves (svc_accounting/leases.py); the others drop the request. Subjects stay
`numafit.accounting.v1.<op>.<node>`, so callers and the per-node NATS permissions do not change,
and no request takes an extra hop.

Exactly one replica answers a request, so that no request is ever answered (or acted on) twice:
- the replica serving the node's partition answers it;
- a replica handing the partition over (it stopped serving, the key is not free yet) refuses
  it with `node_unavailable`: the caller retries and reaches the next owner;
- a partition nobody owns: only the replica that wants it (the rendezvous choice among the live
  members) keeps the request, up to `takeover_wait` seconds; it answers once it serves (the
  request's deadline and epoch still decide: one decided on the previous owner's view is
  refused with `conflict`), refuses with `node_unavailable` when it holds the key but is still
  bringing the partition up to date, and drops it when it does not even hold the key (another
  replica may want it too and answer);
- a partition another replica holds is that replica's, even when this one wants it (a replica
  that joined): the holder answers, and hands the partition over between requests.
"""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING

from shared import subjects
from shared.core.partitions import partition_of

if TYPE_CHECKING:
    from svc_accounting.leases import Leases

DEFAULT_TAKEOVER_WAIT = 1.0
"""Seconds a request for a partition in a takeover is kept for its next owner."""


class Admission(enum.Enum):
    SERVE = "serve"
    DROP = "drop"
    """Another replica answers."""
    REFUSE = "refuse"
    """Nobody serves the node's partition: answer `node_unavailable`."""


class Ownership:
    def __init__(
        self, leases: Leases | None, *, takeover_wait: float = DEFAULT_TAKEOVER_WAIT
    ) -> None:
        self.leases = leases
        self.takeover_wait = takeover_wait
        self._changed = asyncio.Condition()

    @property
    def partitioned(self) -> bool:
        return self.leases is not None

    @property
    def partition_count(self) -> int:
        return 0 if self.leases is None else self.leases.partitions

    def partition(self, node: str) -> int | None:
        leases = self.leases
        return None if leases is None else partition_of(node, leases.partitions)

    def serves(self, node: str) -> bool:
        leases = self.leases
        return leases is None or leases.may_serve(partition_of(node, leases.partitions))

    def served(self) -> tuple[int, ...]:
        leases = self.leases
        if leases is None:
            return ()
        return tuple(sorted(k for k in leases.serving if leases.may_serve(k)))

    async def changed(self) -> None:
        """Wake requests waiting for a partition (called when serving starts or stops)."""
        async with self._changed:
            self._changed.notify_all()

    async def admit(self, token: str, *, changes: bool = True) -> Admission:
        """What to do with a request on the subject token `token` (a node, or `_all`);
        `changes`: the operation may change something (a read is kept more readily)."""
        leases = self.leases
        if leases is None or token == subjects.ALL_NODES:
            return Admission.SERVE
        k = partition_of(token, leases.partitions)
        if leases.may_serve(k):
            return Admission.SERVE
        if k in leases.releasing:
            return Admission.REFUSE
        if not self._coming(k, changes):
            return Admission.DROP
        sightings = leases.sightings[k]
        try:
            async with asyncio.timeout(self.takeover_wait), self._changed:
                await self._changed.wait_for(
                    lambda: leases.may_serve(k) or not self._coming(k, changes)
                )
        except TimeoutError:
            pass
        if leases.sightings[k] != sightings:
            # Another replica held the partition while this request waited here (this one's
            # view was behind): that replica received it too and answered it.
            return Admission.DROP
        if leases.may_serve(k):
            return Admission.SERVE
        if (k in leases.held and leases.rebuilding(k)) or k in leases.releasing:
            return Admission.REFUSE  # still this replica's to answer: quickly, not by timeout
        # Wanted but still not held: two replicas can both want a partition while their views
        # of the members differ (a join, a leave), so a refusal from here could be a second
        # answer; the holder (or nobody) answers.
        return Admission.DROP

    def _coming(self, k: int, changes: bool) -> bool:
        """Will this replica, and no other, answer for partition `k` soon? It holds the key and
        is bringing the partition's nodes up to date (its lease fresh), or nobody holds the
        key and this replica is the one that wants it. A partition another replica holds is
        that replica's to act on, even while this one wants it (it joined): keeping a write
        here would carry it out a second time after the handover. A read is kept then too,
        so that none goes unanswered around the handover: answering one twice is harmless
        (the caller reads the first answer)."""
        leases = self.leases
        if leases is None:
            return False
        if k in leases.held:
            # Held: this replica's only while being brought up to date with its lease fresh
            # (not while handed over; a lease past its renew deadline may be someone else's
            # already, e.g. after this process was paused).
            return leases.rebuilding(k)
        return k in leases.wanted and (leases.unowned(k) or not changes)
