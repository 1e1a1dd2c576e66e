"""What this accounting replica does with a request its subscriptions delivered.

Requests reach only the replica subscribed to the node's slot (svc_accounting/routes.py): the
owner of its partition, once the partition is served. One replica (`--partitions 0`) serves
every node. Partitioned, a delivered request is:
- served when this replica serves the partition (and its lease is fresh);
- refused with `node_unavailable` while this replica still holds the partition's key but no
  longer serves it (a handover under way, a write that waited for the node past it): no other
  replica can hold the key, so none received the request, and the caller retries at once;
- dropped unanswered otherwise: the lease ran past its renew deadline (this process was frozen,
  say), so another replica may own the partition, be subscribed too, and answer. The request's
  absolute deadline and its epoch fence anything this replica would do with it.

A request for a partition nobody serves yet (a takeover bringing it up to date) reaches no
replica: the caller gets "no responders" (or, on a cluster whose interest has not propagated,
a timeout) and retries within its budget (shared/accounting_client.py).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from shared.core.partitions import partition_of, partition_of_slot

if TYPE_CHECKING:
    from svc_accounting.leases import Leases


class Admission(enum.Enum):
    SERVE = "serve"
    DROP = "drop"
    """Another replica may own the partition (and answer)."""
    REFUSE = "refuse"
    """This replica holds the key but does not serve it: answer `node_unavailable`."""


class Ownership:
    def __init__(self, leases: Leases | None) -> None:
        self.leases = leases

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

    def admit(self, slot: int) -> Admission:
        """What to do with a request delivered on `slot`."""
        leases = self.leases
        if leases is None:
            return Admission.SERVE
        k = partition_of_slot(slot, leases.partitions)
        if leases.may_serve(k):
            return Admission.SERVE
        if leases.holds_fresh(k):
            return Admission.REFUSE
        return Admission.DROP
