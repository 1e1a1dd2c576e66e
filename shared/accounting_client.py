"""Request-reply client of svc_accounting's operations, used by every other service.

Each call is bounded by the caller's remaining budget, and nothing here waits past it (a paged
snapshot of every node included: all its pages share one budget); `deadlineMs` travels with the
request, a margin shorter, so accounting never commits after the caller has given up and its
answer gets home. No responders and timeouts become `AccountingUnavailable`, so callers can
apply their fallback without catching nats errors.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, TypeVar

import msgspec
import nats.errors

from shared import messages, subjects
from shared.messages import AccountingReply, AccountingRequest, NodeStateWire, SnapshotReply
from shared.service import natsconn

if TYPE_CHECKING:
    from nats.aio.client import Client

R = TypeVar("R", bound=AccountingReply)


class AccountingUnavailable(Exception):
    """No accounting replica answered in time (or none is subscribed)."""


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
        request = msgspec.structs.replace(
            request, deadline_ms=max(int((budget - margin) * 1000), 0)
        )
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
        return bytes(msg.data)

    async def every_node(
        self, *, budget: float | None = None, page: int = 200
    ) -> tuple[str, list[NodeStateWire]]:
        """Accounting's epoch and every node it knows, page by page (one NATS message cannot
        hold a large cluster), all pages and restarts within one `budget`; starts over when
        the epoch changes between pages (accounting restarted meanwhile), at most three times."""
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
            nodes: list[NodeStateWire] = []
            after, epoch = "", None
            while True:
                reply = await self.ask(
                    messages.SnapshotRequest(after=after, limit=page), SnapshotReply, left()
                )
                if not reply.ok:
                    raise AccountingUnavailable(
                        f"snapshot refused: {subjects.shown(reply.error or '', 200)}"
                    )
                if epoch is not None and reply.epoch != epoch:
                    break  # accounting restarted between pages: start over
                epoch = reply.epoch
                nodes.extend(reply.nodes or ())
                if not reply.more:
                    return epoch or "", nodes
                following = reply.next or ""
                if following <= after:
                    raise AccountingUnavailable("snapshot pages do not advance")
                after = following
        raise AccountingUnavailable("accounting kept restarting during a snapshot")
