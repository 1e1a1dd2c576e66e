"""Request-reply client of svc_accounting's operations, used by every other service.

Each call is bounded by the caller's remaining budget, and nothing here waits past it (a paged
snapshot of every node included: all its pages share one budget); `deadlineMs` travels with the
request, a margin shorter, so accounting never commits after the caller has given up and its
answer gets home. No responders (retried for `UNSERVED_RETRY`: a partition being taken over) and
timeouts become `AccountingUnavailable`, so callers can apply their fallback, or retry,
without catching nats errors.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, TypeVar

import msgspec
import nats.errors

from shared import messages, subjects
from shared.core.partitions import partition_of
from shared.messages import AccountingReply, AccountingRequest, NodeStateWire, SnapshotReply
from shared.service import natsconn

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.aio.client import Client

R = TypeVar("R", bound=AccountingReply)
Q = TypeVar("Q", bound=AccountingRequest)


def with_deadline(request: Q, seconds: float) -> Q:
    """`request` with its deadline `seconds` from now, both ways: `deadlineMs` (relative, what
    older replicas read) and `deadlineAtMs` (absolute Unix milliseconds: a request read late, by
    a replica that was paused or waited for a takeover, is refused instead of acted on)."""
    ms = max(int(seconds * 1000), 0)
    return msgspec.structs.replace(
        request, deadline_ms=ms, deadline_at_ms=int(time.time() * 1000) + ms
    )


class AccountingUnavailable(Exception):
    """No accounting replica answered in time (or none is subscribed)."""


UNSERVED_RETRY = 1.0
"""Seconds a request keeps being sent again while nobody is subscribed to its subject: a
partition being taken over is subscribed only once its new owner has brought it up to date
(svc_accounting/routes.py), about a relist of the pods after a handover. Past this, or
`UNSERVED_SHARE` of the budget, `AccountingUnavailable`: the caller's own retry or fallback
is not held up longer."""
UNSERVED_SHARE = 0.25
"""At most this share of a request's budget goes to resending it while nobody serves it: a
caller making several requests in one budget (the device plugin's Allocate: pending, then
consume) keeps time for the others and for its fallback."""
REPLY_MARGIN = 0.02
"""Seconds kept back from the caller's budget for the reply's trip home."""


class AccountingClient:
    def __init__(
        self,
        nc: Client,
        default_timeout: float = 2.0,
        *,
        unserved_retry: float = UNSERVED_RETRY,
    ) -> None:
        self.nc = nc
        self.default_timeout = default_timeout
        self.unserved_retry = unserved_retry

    async def ask(
        self,
        request: AccountingRequest,
        reply_type: type[R],
        budget: float | None = None,
        *,
        margin: float = REPLY_MARGIN,
    ) -> R:
        """One typed operation: `request` (its `node` names the subject; a snapshot of every
        node has none), answered with a `reply_type` within `budget` seconds, or
        `AccountingUnavailable`. `deadlineMs` is set here, `margin` short of the budget."""
        node = getattr(request, "node", None)
        subject = (
            subjects.accounting(request.OP, node)
            if isinstance(node, str)
            else subjects.accounting(request.OP, subjects.ALL_NODES)
        )
        return await self._ask_on(subject, request, reply_type, budget, margin=margin)

    async def _ask_on(
        self,
        subject: str,
        request: Q,
        reply_type: type[R],
        budget: float | None = None,
        *,
        margin: float = REPLY_MARGIN,
    ) -> R:
        budget = self.default_timeout if budget is None else budget
        if budget <= 0:
            raise AccountingUnavailable(f"no budget left to ask {subject}")
        request = with_deadline(request, budget - margin)
        data = await self._roundtrip(request.OP, subject, messages.encode(request), budget)
        try:
            return messages.decode(data, reply_type)
        except messages.MessageError as exc:
            raise AccountingUnavailable(str(exc)) from exc

    async def _roundtrip(self, op: str, subject: str, data: bytes, budget: float) -> bytes:
        if len(data) > self.nc.max_payload:
            raise AccountingUnavailable(
                f"{op} request of {len(data)} bytes exceeds the NATS limit of {self.nc.max_payload}"
            )
        try:
            # nats-py bounds the wait for the reply; this bounds the publish before it too.
            async with asyncio.timeout(budget):
                msg = await natsconn.request(
                    self.nc,
                    subject,
                    data,
                    budget,
                    grace=min(self.unserved_retry, budget * UNSERVED_SHARE),
                )
        except nats.errors.NoRespondersError as exc:
            raise AccountingUnavailable(f"no accounting service answers {subject}") from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise AccountingUnavailable(
                f"accounting did not answer {subject} in {budget:.3f}s"
            ) from exc
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as exc:
            raise AccountingUnavailable("NATS connection closed") from exc
        except nats.errors.OutboundBufferLimitError as exc:
            raise AccountingUnavailable("NATS reconnecting, outbound buffer full") from exc
        except nats.errors.Error as exc:  # the socket broke under the request, and the like
            raise AccountingUnavailable(f"NATS error: {subjects.shown(str(exc), 200)}") from exc
        return bytes(msg.data)

    async def every_node(
        self, *, budget: float | None = None, page: int = 200
    ) -> tuple[str, list[NodeStateWire]]:
        """Every node accounting knows, each with its epoch set, page by page (one NATS
        message cannot hold a large cluster), within one `budget`; and the epoch of the run
        that answered (partitioned accounting: the answering replicas' epochs, joined).

        Plain request-reply, one answerer per request: the owner of slot 0 answers first with
        the nodes of every partition it serves (`partitions` of `partitionCount`; one
        replica: every node, no count); then the owner of the lowest partition not covered
        yet (slot k is partition k's), until every partition is. A partition nobody serves
        (a takeover under way) makes the snapshot `AccountingUnavailable`: the caller
        retries. Starts over when the answerer of a partition changes between its pages, at
        most three times."""
        total = self.default_timeout if budget is None else budget
        deadline = time.monotonic() + total

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AccountingUnavailable(
                    f"snapshot of every node did not finish in {total:.3f}s"
                )
            return remaining

        for _ in range(3):
            gathered = await self._every_partition(page, left)
            if gathered is not None:
                return gathered
        raise AccountingUnavailable("accounting kept restarting during a snapshot")

    async def _every_partition(
        self, page: int, left: Callable[[], float]
    ) -> tuple[str, list[NodeStateWire]] | None:
        """One pass over the partitions (None: an answerer changed, start over)."""
        nodes: list[NodeStateWire] = []
        epochs: list[str] = []
        covered: set[int] = set()
        count: int | None = None
        slot = 0
        while True:
            pages = await self._pages_of(slot, page, left)
            if pages is None:
                return None
            first = pages[0]
            epochs.append(first.epoch or "")
            if count is None:
                count = first.partition_count or 0
            elif first.partition_count != count:
                return None  # the replicas restarted with another partition count
            fresh = set(first.partitions or ()) - covered
            if count and slot not in fresh:
                raise AccountingUnavailable(
                    f"the owner of partition {slot} answered without it (a handover under way)"
                )
            for answer in pages:
                default = answer.epoch or ""
                for n in answer.nodes or ():
                    # A partition two answers cover (handed over between them): the first's.
                    if count and partition_of(n.node, count) not in fresh:
                        continue
                    nodes.append(
                        n if isinstance(n.epoch, str) else msgspec.structs.replace(n, epoch=default)
                    )
            covered |= fresh
            missing = sorted(set(range(count)) - covered)
            if not missing:
                return "+".join(sorted(epochs)), nodes
            slot = missing[0]

    async def _pages_of(
        self, slot: int, page: int, left: Callable[[], float]
    ) -> list[SnapshotReply] | None:
        """Every page the owner of `slot` answers; None when the answerer changed between
        pages (another replica, or the same one restarted: start over)."""
        subject = subjects.accounting_all(slot)
        pages: list[SnapshotReply] = []
        after = ""
        while True:
            request = messages.SnapshotRequest(after=after, limit=page)
            reply = await self._ask_on(subject, request, SnapshotReply, left())
            if not reply.ok:
                raise AccountingUnavailable(
                    f"snapshot refused: {subjects.shown(reply.error or '', 200)}"
                )
            if pages and (reply.epoch, reply.replica) != (pages[0].epoch, pages[0].replica):
                return None
            pages.append(reply)
            if not reply.more:
                return pages
            following = reply.next or ""
            if following <= after:
                raise AccountingUnavailable("snapshot pages do not advance")
            after = following
