"""Consumptions accounting has not acknowledged yet: asked again until it does.

An Allocate answered from the pending entry while accounting was away (see
`svc_deviceplugin.journal`) leaves a record; this loop sends each record's `consume` again,
naming the pod and container explicitly (by then the node's pending pod may be another), with a
growing delay between passes, until accounting answers. A replica that took the node over
learns of the consumption this way. Accounting answers a consume of an entry already consumed
on the same GPUs with `ok` (the first attempt may have landed before its answer was lost), so
asking again never counts twice.

What an answer does to a record: `ok` removes it; a refusal that asking again cannot change
(the pod is gone, the entry does not match) removes it with an error log line; anything else
(no answer, `node_unavailable`, `conflict`, `deadline_exceeded`, `api_error`, a code this build
does not know) keeps it for the next pass. Records survive a plugin restart: the journal is
read at start and the loop runs them first.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from typing import TYPE_CHECKING

from shared import messages
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.service.backoff import Backoff
from shared.subjects import shown

if TYPE_CHECKING:
    from svc_deviceplugin.journal import ConsumeJournal, DeferredConsume
    from svc_deviceplugin.metrics import PluginMetrics

log = logging.getLogger("numafit.deviceplugin")

FIRST_RETRY_S = 0.2
"""The first pass after a deferral: a takeover answers `node_unavailable` within about 1 s and
serves within the lease TTL, so retries start soon and back off to `RETRY_CAP_S`."""
RETRY_CAP_S = 5.0
FINAL = frozenset(
    {
        Code.POD_NOT_TRACKED,
        Code.NODE_MISMATCH,
        Code.INVALID_REQUEST,
        Code.ANNOTATION_INVALID,
        Code.NOTHING_PENDING,
        Code.UNAUTHORIZED,
    }
)
"""Refusals asking again cannot change: the record is dropped (logged as an error)."""


class Replay(enum.Enum):
    RECORDED = "recorded"
    RETRY = "retry"
    DROPPED = "dropped"


class DeferredConsumes:
    def __init__(
        self,
        journal: ConsumeJournal,
        accounting: AccountingClient,
        metrics: PluginMetrics,
        node: str,
        timeout: float,
    ) -> None:
        self.journal = journal
        self.accounting = accounting
        self.metrics = metrics
        self.node = node
        self.timeout = timeout
        """Seconds one replayed consume may wait for accounting."""
        self._wake = asyncio.Event()
        self._backoff = Backoff(FIRST_RETRY_S, RETRY_CAP_S)
        self._attempts: dict[tuple[str, int], int] = {}
        self._in_flight: set[tuple[str, int]] = set()
        """Records being sent now (the loop, or an Allocate replaying first): never twice at
        once, so that one acknowledgement is counted once."""

    def __len__(self) -> int:
        return len(self.journal)

    def load(self) -> None:
        """The records an earlier run left: retried first."""
        loaded = self.journal.load()
        if self.journal.unreadable:
            self.metrics.journal_errors.labels("unreadable").inc()
        self._gauge()
        if loaded:
            log.warning(
                "consume journal replayed: consumptions accounting has not acknowledged",
                extra={
                    "entries": len(loaded),
                    "pods": sorted({f"{r.pod_namespace}/{r.pod_name}" for r in loaded}),
                },
            )
            self.kick()

    async def add(self, record: DeferredConsume) -> bool:
        """Keep `record` until accounting acknowledges it (`JournalFull`: not kept); True
        when it is on disk."""
        durable = await self.journal.add(record)
        if not durable and self.journal.path is not None:
            self.metrics.journal_errors.labels("write_failed").inc()
        self._gauge()
        self._wake.set()  # the loop starts its first pass after FIRST_RETRY_S
        return durable

    def kick(self) -> None:
        """Accounting may be back (it answered, NATS reconnected): the next pass now."""
        self._backoff.reset()
        self._wake.set()

    def _gauge(self) -> None:
        self.metrics.journal_entries.set(len(self.journal))

    async def run(self, stop: asyncio.Event) -> None:
        """Replay the journal until `stop`: a pass whenever there is something to replay,
        the delay between passes growing while records stay."""
        while not stop.is_set():
            if not len(self.journal):
                await _first(stop, self._wake, None)
                self._wake.clear()
                continue
            # A kick while a pass ran (accounting answered meanwhile) cuts this wait short.
            await _first(stop, self._wake, self._backoff.next_delay())
            if stop.is_set():
                return
            self._wake.clear()
            if await self.replay_once():
                self._backoff.reset()

    async def replay_once(self, budget: float | None = None) -> bool:
        """One consume per record, oldest first (each within the accounting timeout; all of
        them within `budget` seconds when given); stops at the first one accounting did not
        answer (the others would not be answered either). True when every record was settled."""
        deadline = None if budget is None else time.monotonic() + budget
        for record in self.journal:
            left = self.timeout
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
            if left <= 0.02:
                return False
            if record.key in self._in_flight:
                return False  # being sent by another caller: not settled yet
            self._in_flight.add(record.key)
            try:
                outcome = await self._replay(record, left)
            finally:
                self._in_flight.discard(record.key)
            if outcome is Replay.RETRY:
                return False
        return not len(self.journal)

    async def _replay(self, record: DeferredConsume, budget: float) -> Replay:
        where = {
            "pod": f"{record.pod_namespace}/{record.pod_name}",
            "pod_uid": record.pod_uid,
            "container": record.container_index,
        }
        attempt = self._attempts.get(record.key, 0) + 1
        self._attempts[record.key] = attempt
        request = messages.ConsumeRequest(
            devices=record.devices,
            pod_uid=record.pod_uid,
            container_index=record.container_index,
            node=self.node,
        )
        try:
            reply = await self.accounting.ask(request, messages.ConsumeReply, budget)
        except AccountingUnavailable as exc:
            return self._retry(where, attempt, "unavailable", shown(str(exc), 200))
        code = Code.parse(reply.code, Code.API_ERROR) if not reply.ok else Code.OK
        if not reply.ok and code not in FINAL:
            return self._retry(where, attempt, shown(reply.code, 64), shown(reply.error or "", 200))
        await self.journal.remove(record.key)
        self._attempts.pop(record.key, None)
        self._gauge()
        waited = round(max(time.time() - record.deferred_at, 0.0), 3)
        if reply.ok:
            self.metrics.consume_replays.labels(Replay.RECORDED.value).inc()
            log.info(
                "deferred consume recorded by accounting",
                extra={**where, "attempts": attempt, "waited_s": waited},
            )
            if reply.container_devices not in (None, record.container_devices):
                # Allocate answered kubelet from the pending entry; accounting recorded other
                # amounts. The ledger follows accounting; this says the two disagreed.
                log.error(
                    "deferred consume recorded other amounts than Allocate answered",
                    extra={
                        **where,
                        "answered": record.container_devices,
                        "recorded": shown(reply.container_devices or "", 200),
                    },
                )
            return Replay.RECORDED
        self.metrics.consume_replays.labels(Replay.DROPPED.value).inc()
        log.error(
            "deferred consume refused for good; dropped",
            extra={
                **where,
                "code": code.value,
                "error": shown(reply.error or "", 200),
                "attempts": attempt,
                "waited_s": waited,
            },
        )
        return Replay.DROPPED

    def _retry(self, where: dict[str, object], attempt: int, code: str, error: str) -> Replay:
        self.metrics.consume_replays.labels(Replay.RETRY.value).inc()
        # One line per pass at most (the passes back off to RETRY_CAP_S).
        log.info(
            "deferred consume not recorded yet; asking again later",
            extra={**where, "attempt": attempt, "code": code, "error": error},
        )
        return Replay.RETRY


async def _first(stop: asyncio.Event, wake: asyncio.Event, seconds: float | None) -> None:
    """Until `stop` or `wake` is set, or `seconds` have passed (None: no limit)."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waits, return_exceptions=True)
