"""Serving one delivered accounting request: its subject checked (the node's slot), its
partition's ownership asked, the operation run, exactly one answer sent (none when it was read
after its caller's deadline), the result counted and the change published."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import nats.errors

from shared import messages, subjects
from shared.codes import Code
from shared.service import natsconn
from shared.subjects import shown
from svc_accounting.ownership import Admission
from svc_accounting.replies import ReadTooLate, Unanswerable, bounded

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterable

    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from svc_accounting.ledger import Ledger
    from svc_accounting.metrics import AccountingMetrics
    from svc_accounting.operations import Operations
    from svc_accounting.ownership import Ownership

log = logging.getLogger("numafit.accounting")

LATE_WARN_EVERY = 10.0
"""Seconds between two warnings about requests dropped because they were read too late."""


class RequestServer:
    def __init__(
        self,
        nc: Client,
        ops: Operations,
        ownership: Ownership,
        ledger: Ledger,
        metrics: AccountingMetrics,
        publish_changed: Callable[[Iterable[str]], Awaitable[None]],
    ) -> None:
        self.nc = nc
        self.ops = ops
        self.ownership = ownership
        self.ledger = ledger
        self.metrics = metrics
        self.publish_changed = publish_changed
        self._late_dropped = 0
        self._late_warned_at = -LATE_WARN_EVERY

    def admit(self, msg: Msg) -> Callable[[], Coroutine[Any, Any, None]]:
        """`msg` judged as it is delivered (not when its task runs, which on a busy loop can be
        after a handover that this delivery preceded: the drain of a partition's subscriptions
        hands every delivered request here while the partition is still served); the work of
        answering it, to be run as a request task."""
        received = time.monotonic()  # the request's relative deadline counts from here
        addressed = subjects.parse_accounting(msg.subject)
        admission = (
            None
            if addressed is None or not addressed.slot_matches()
            else self.ownership.admit(addressed.slot)
        )
        return lambda: self.serve(msg, received, addressed, admission)

    async def serve(
        self,
        msg: Msg,
        received: float,
        addressed: subjects.AccountingSubject | None,
        admission: Admission | None,
    ) -> None:
        if addressed is None or admission is None:
            # Built by hand (the slot is not the node's): it reached the owner of another
            # node, the one replica subscribed to that slot, which says so.
            await self._answer_invalid(msg, addressed)
            return
        op, token = addressed.op, addressed.token
        if admission is Admission.DROP:
            return  # the lease ran out: another replica may own the partition and answer
        if admission is Admission.REFUSE:
            self.metrics.unowned.inc()
            with contextlib.suppress(Exception):
                await self._reply(msg, messages.encode(self._unowned(addressed)))
            return
        try:
            outcome = await self.ops.handle(op, token, msg.data, received)
            reply = outcome.reply
            data = messages.encode(reply)
        except (ReadTooLate, Unanswerable):
            self._warn_late(op)
            return
        except Exception:
            log.exception("accounting operation failed", extra={"op": op})
            self.metrics.result(op, None)
            with contextlib.suppress(Exception):
                internal = messages.AccountingReply(
                    ok=False, code=Code.API_ERROR, error="internal error"
                )
                await self._reply(msg, messages.encode(internal))
            return
        try:
            # The answer first: the caller's next step does not wait for the publishing and
            # bookkeeping below (the ledger already holds the change the reply reports).
            await self._reply(msg, data)
        except nats.errors.Error as exc:
            # Only the reply is lost (the caller's wait runs out): what the operation did
            # stands, so it is counted as what it was and its change is still published.
            self.metrics.replies_lost.inc()
            log.warning(
                "accounting reply could not be sent",
                extra={"op": op, "code": reply.code, "error": bounded(repr(exc))},
            )
        self.metrics.result(op, outcome.code)
        if not reply.ok:
            log.info(
                "accounting refused",
                extra={
                    "op": op,
                    "code": reply.code,
                    "subject": shown(msg.subject),
                    "error": bounded(reply.error or ""),
                },
            )
        if outcome.changed:
            try:
                await self.publish_changed(outcome.changed)
            except Exception:
                log.exception("publishing a change failed", extra={"op": op})

    async def _reply(self, msg: Msg, data: bytes) -> None:
        """The one answer to `msg` (none when its sender asked for none)."""
        if msg.reply:
            await natsconn.publish(self.nc, msg.reply, data)

    async def _answer_invalid(self, msg: Msg, addressed: subjects.AccountingSubject | None) -> None:
        kinds = None if addressed is None else messages.OPS.get(addressed.op)
        kind = messages.AccountingReply if kinds is None else kinds[1]
        error = (
            f"subject {shown(msg.subject)} is not an accounting subject"
            if addressed is None
            else f"subject {shown(msg.subject)} names slot {addressed.slot}, not the node's"
        )
        refusal = kind(ok=False, code=Code.INVALID_REQUEST, error=error, epoch=self.ledger.epoch)
        with contextlib.suppress(Exception):
            await self._reply(msg, messages.encode(refusal))

    def _warn_late(self, op: str) -> None:
        """One warning per LATE_WARN_EVERY seconds, however many requests are read late (a
        replica resumed after a pause reads a socket full of them)."""
        self._late_dropped += 1
        now = time.monotonic()
        if now - self._late_warned_at >= LATE_WARN_EVERY:
            log.warning(
                "requests past their deadline were dropped unanswered (read late, or settled "
                "after losing the partition): this replica was paused, a takeover kept them "
                "too long, or clocks disagree (NTP)",
                extra={"op": op, "dropped": self._late_dropped},
            )
            self._late_warned_at = now
            self._late_dropped = 0

    def _unowned(self, addressed: subjects.AccountingSubject) -> messages.AccountingReply:
        kinds = messages.OPS.get(addressed.op)
        kind = messages.AccountingReply if kinds is None else kinds[1]
        k = self.ownership.partition(addressed.node)
        return kind(
            ok=False,
            code=Code.NODE_UNAVAILABLE,
            error=(
                f"this accounting replica is handing node {shown(addressed.token)}'s partition "
                f"{k} over (a takeover is under way): retry"
            ),
            epoch=self.ledger.epoch,
        )
