"""Which accounting requests reach this replica: its NATS subscriptions.

Subjects carry the node's slot (shared/subjects.py), and a partition is a set of slots
(shared/core/partitions.py), so a replica subscribes to the slots of the partitions it serves
and nothing else: a request is delivered to the one replica that owns its node, never to all.

- One replica (`--partitions 0`): one subscription to every slot, in the queue group
  `numafit-accounting` (a second instance is refused at start; the group keeps a restart in
  place from answering twice while the old process drains).
- Partitioned: the slots of a partition are subscribed once it is served (taken and brought
  up to date, svc_accounting/leases.py) and drained before it is handed over, while this
  replica still holds its key. The next owner subscribes only after it holds the key, so two
  replicas are never subscribed to one partition's subjects at the same time (a replica frozen
  past its lease is the exception the request's deadline and epoch fence: ownership.py).

No queue group for a partition's slots: there is one subscriber, and a second one (a frozen
replica that woke up) must not take requests away from the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import nats.errors

from shared import subjects
from shared.core.partitions import slots_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

log = logging.getLogger("numafit.accounting")

EVERY_SLOT = -1
"""The key of the one subscription of an unpartitioned replica."""
DEFAULT_TIMEOUT = 2.0
"""Seconds a subscribe (its flush) or a drain may take."""


class Routes:
    def __init__(
        self,
        nc: Client,
        handler: Callable[[Msg], Awaitable[None]],
        *,
        partitions: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.nc = nc
        self.handler = handler
        self.partitions = partitions
        self.timeout = timeout
        self._subs: dict[int, Subscription] = {}
        """By slot (EVERY_SLOT: the unpartitioned replica's one subscription)."""
        self._lock = asyncio.Lock()
        """Opening and closing one at a time: a handover never races a takeover's subscribe."""
        self._draining: set[asyncio.Future[None]] = set()

    def slots(self) -> frozenset[int]:
        """The slots subscribed (EVERY_SLOT: all of them, in one subscription)."""
        return frozenset(self._subs)

    async def open_every_slot(self) -> None:
        async with self._lock:
            if EVERY_SLOT not in self._subs:
                self._subs[EVERY_SLOT] = await self.nc.subscribe(
                    subjects.ACCOUNTING_EVERY_SLOT, queue=subjects.ACCOUNTING_QUEUE, cb=self.handler
                )
            await self._flush()

    async def open(self, partitions: Iterable[int]) -> None:
        """Subscribe to the slots of `partitions`, then flush: once this returns the server
        delivers their requests here. Raises the NATS error of a failed subscribe or flush
        (the caller hands the partitions back; what was subscribed is drained again)."""
        wanted = sorted(set(partitions))
        async with self._lock:
            try:
                for k in wanted:
                    for slot in slots_of(k, self.partitions):
                        if slot not in self._subs:
                            self._subs[slot] = await self.nc.subscribe(
                                subjects.accounting_slot(slot), cb=self.handler
                            )
                await self._flush()
            except (nats.errors.Error, TimeoutError, OSError):
                await self._close(wanted)
                raise

    async def _flush(self) -> None:
        async with asyncio.timeout(self.timeout):
            await self.nc.flush()

    async def close(self, partitions: Iterable[int]) -> None:
        """Drain the slots of `partitions`: the server stops delivering them, and what it had
        delivered already is handed to the handler before this returns (bounded: on a broken
        connection the subscriptions are dropped here, the server dropped them already)."""
        async with self._lock:
            await self._close(sorted(set(partitions)))

    async def close_all(self) -> None:
        async with self._lock:
            subs, self._subs = list(self._subs.values()), {}
            await self._drain(subs)

    async def _close(self, partitions: list[int]) -> None:
        subs = [
            sub
            for k in partitions
            for slot in slots_of(k, self.partitions)
            if (sub := self._subs.pop(slot, None)) is not None
        ]
        await self._drain(subs)

    async def _drain(self, subs: list[Subscription]) -> None:
        """Drain `subs` together, waiting at most `timeout`. A drain is never cancelled: cut
        short, nats-py would keep the subscription for its next reconnect. One still under way
        (a reconnect) finishes on its own: the server has no interest from this connection
        meanwhile (it dropped it with the connection, or has the UNSUB)."""
        if not subs:
            return
        if not self.nc.is_connected:
            # Disconnected: the server dropped this connection's interest with it. Dropped here
            # too (a drain's flush could fail mid-way and leave the subscription to be sent
            # again at the next reconnect).
            for sub in subs:
                with contextlib.suppress(nats.errors.Error, OSError):
                    await sub.unsubscribe()
            return
        tasks = [asyncio.ensure_future(_drained(sub)) for sub in subs]
        for task in tasks:  # kept until done (the loop holds tasks weakly)
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
        _, late = await asyncio.wait(tasks, timeout=self.timeout)
        if late:
            log.warning(
                "subscriptions still draining after the timeout",
                extra={"subscriptions": len(late), "timeout_s": self.timeout},
            )


async def _drained(sub: Subscription) -> None:
    try:
        await sub.drain()  # type: ignore[no-untyped-call]  # untyped in nats-py
    except (nats.errors.Error, TimeoutError, OSError) as exc:
        # Closed or reconnecting: the server holds no interest of this connection anyway.
        log.info("subscription dropped without a drain", extra={"error": repr(exc)[:200]})
