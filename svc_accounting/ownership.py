"""Which requests this accounting replica answers.

One replica (`--partitions 0`) answers every node, alone: it joins the `numafit-accounting`
queue group as before and refuses to start beside another instance.

Partitioned (the default): every replica subscribes to every accounting subject (each in a
queue group of its own, so each receives every request) and answers only for the nodes of the
partitions it serves (svc_accounting/leases.py); the others drop the request. Subjects stay
`numafit.accounting.v1.<op>.<node>`, so callers and the per-node NATS permissions do not change,
and no request takes an extra hop. Around a takeover:
- the replica that is about to serve a partition (it wants it and nobody else holds it) keeps
  a request for it until it serves, up to `takeover_wait` seconds, then answers it;
- a partition nobody serves after that wait is refused by one replica (the lowest-named live
  member) with `node_unavailable`, so the caller gets a quick answer instead of a timeout.
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

    async def admit(self, token: str) -> Admission:
        """What to do with a request on the subject token `token` (a node, or `_all`)."""
        leases = self.leases
        if leases is None or token == subjects.ALL_NODES:
            return Admission.SERVE
        k = partition_of(token, leases.partitions)
        if leases.may_serve(k):
            return Admission.SERVE
        if not self._coming(k):
            return Admission.DROP
        try:
            async with asyncio.timeout(self.takeover_wait), self._changed:
                await self._changed.wait_for(lambda: leases.may_serve(k) or not self._coming(k))
        except TimeoutError:
            pass
        if leases.may_serve(k):
            return Admission.SERVE
        if leases.unowned(k) and leases.answers_unowned():
            return Admission.REFUSE
        return Admission.DROP

    def _coming(self, k: int) -> bool:
        """Might this replica answer for partition `k` soon: nobody owns it, or this replica
        wants it (the rebalancing hands it over, or it is rebuilding it now)? Such a request
        is kept rather than dropped: if the current owner answers it first, the late answer
        from here is simply not read."""
        leases = self.leases
        if leases is None:
            return False
        if leases.unowned(k):
            return True
        return k in leases.wanted
