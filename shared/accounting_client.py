"""Request-reply client of svc_accounting's operations, used by every other service.

Each call is bounded by the caller's remaining budget, and nothing here waits past it (a paged
snapshot of every node included: all its pages share one budget); `deadlineMs` travels with the
request, a margin shorter, so accounting never commits after the caller has given up and its
answer gets home. No responders and timeouts become `AccountingUnavailable`, so callers can
apply their fallback without catching nats errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, TypeVar

import msgspec
import nats.errors

from shared import messages, subjects
from shared.messages import AccountingReply, AccountingRequest, NodeStateWire, SnapshotReply
from shared.service import natsconn

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.aio.client import Client
    from nats.aio.msg import Msg

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


STATUS_HEADER = "Status"
NO_RESPONDERS = "503"
"""nats-server's answer on the reply subject when nobody is subscribed to a request's subject."""
REPLY_MARGIN = 0.02
"""Seconds kept back from the caller's budget for the reply's trip home."""


class AccountingClient:
    def __init__(self, nc: Client, default_timeout: float = 2.0) -> None:
        self.nc = nc
        self.default_timeout = default_timeout

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
        budget = self.default_timeout if budget is None else budget
        node = getattr(request, "node", None)
        subject = (
            subjects.accounting(request.OP, node)
            if isinstance(node, str)
            else subjects.accounting(request.OP, subjects.ALL_NODES)
        )
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
                msg = await natsconn.request(self.nc, subject, data, budget)
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

        One replica answers alone. Partitioned replicas all answer the first request, each for
        the partitions it serves (`partitions` of `partitionCount`); the rest of each one's
        pages are asked of it alone (`replica`). A partition nobody serves (a takeover under
        way) makes the snapshot `AccountingUnavailable`: the caller retries. Starts over when a
        replica's epoch changes between its pages, at most three times."""
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
            first = await self._first_pages(page, left)
            nodes: list[NodeStateWire] = []
            epochs: list[str] = []
            restarted = False
            for reply in first:
                pages = await self._rest_of(reply, page, left)
                if pages is None:
                    restarted = True
                    break
                epochs.append(reply.epoch or "")
                for answer in pages:
                    default = answer.epoch or ""
                    nodes.extend(
                        n if isinstance(n.epoch, str) else msgspec.structs.replace(n, epoch=default)
                        for n in answer.nodes or ()
                    )
            if not restarted:
                return "+".join(sorted(epochs)), nodes
        raise AccountingUnavailable("accounting kept restarting during a snapshot")

    async def _first_pages(self, page: int, left: Callable[[], float]) -> list[SnapshotReply]:
        """The first page of every replica: until the replies cover every partition (one
        unpartitioned reply covers everything)."""
        request = messages.SnapshotRequest(after="", limit=page)
        subject = subjects.accounting(request.OP, subjects.ALL_NODES)
        budget = left()
        request = with_deadline(request, budget - REPLY_MARGIN)
        replies: list[SnapshotReply] = []
        arrived = asyncio.Event()
        nobody = asyncio.Event()
        inbox = self.nc.new_inbox()

        async def collect(msg: Msg) -> None:
            if msg.headers and msg.headers.get(STATUS_HEADER) == NO_RESPONDERS:
                nobody.set()  # the server says no accounting replica is subscribed
                arrived.set()
                return
            try:
                replies.append(messages.decode(msg.data, SnapshotReply))
            except messages.MessageError:
                return
            arrived.set()

        def covered() -> bool:
            if any(r.partition_count is None for r in replies if r.ok):
                return True
            count = next((r.partition_count for r in replies if r.partition_count), 0)
            served = {k for r in replies if r.ok for k in r.partitions or ()}
            return bool(count) and served >= set(range(count))

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            payload = messages.encode(request)
            asked_at = time.monotonic()
            await natsconn.publish(self.nc, subject, payload, reply=inbox)
            async with asyncio.timeout(budget):
                while True:
                    await arrived.wait()
                    arrived.clear()
                    if nobody.is_set() and not replies:
                        if time.monotonic() - asked_at < natsconn.NO_RESPONDERS_GRACE:
                            # nats-server can say so just before it sees a new subscription.
                            nobody.clear()
                            await asyncio.sleep(0.005)
                            await natsconn.publish(self.nc, subject, payload, reply=inbox)
                            continue
                        raise AccountingUnavailable(f"no accounting service answers {subject}")
                    refused = next((r for r in replies if not r.ok), None)
                    if refused is not None:
                        raise AccountingUnavailable(
                            f"snapshot refused: {subjects.shown(refused.error or '', 200)}"
                        )
                    if covered():
                        break
        except nats.errors.Error as exc:  # disconnected, reconnecting, the socket broke
            raise AccountingUnavailable(
                f"snapshot not asked: {subjects.shown(str(exc), 200)}"
            ) from exc
        except TimeoutError as exc:
            if not replies:
                raise AccountingUnavailable(
                    f"no accounting replica answered a snapshot in {budget:.3f}s"
                ) from exc
            count = next((r.partition_count for r in replies if r.partition_count), 0)
            served = {k for r in replies for k in r.partitions or ()}
            missing = sorted(set(range(count)) - served)
            raise AccountingUnavailable(
                f"no accounting replica serves partitions {missing[:16]} (a takeover is under way)"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        # One reply per replica (a late duplicate of the same replica is dropped).
        unique: dict[str | None, SnapshotReply] = {}
        for reply in replies:
            unique.setdefault(reply.replica, reply)
        return list(unique.values())

    async def _rest_of(
        self, first: SnapshotReply, page: int, left: Callable[[], float]
    ) -> list[SnapshotReply] | None:
        """`first` and the pages after it, asked of the replica that sent it; None when that
        replica's epoch changed between pages (it restarted: start over)."""
        pages = [first]
        reply = first
        after = ""
        while reply.more:
            following = reply.next or ""
            if following <= after:
                raise AccountingUnavailable("snapshot pages do not advance")
            after = following
            reply = await self.ask(
                messages.SnapshotRequest(after=after, limit=page, replica=first.replica),
                SnapshotReply,
                left(),
            )
            if not reply.ok:
                raise AccountingUnavailable(
                    f"snapshot refused: {subjects.shown(reply.error or '', 200)}"
                )
            if reply.epoch != first.epoch:
                return None
            pages.append(reply)
        return pages
