"""The node lock as the extender lives with it: binds that wait for it, and nodes to prefer.

HAMi's lock (shared/core/lock.py) lets one pod per node be allocating at a time: accounting
refuses to bind a second there until the device plugin has consumed the first pod's entry.
kube-scheduler v1.28 parks a pod its extender's *filter* refuses (FailedNodes,
FailedAndUnresolvableNodes or Error alike) in its unschedulable pool, from which only a
cluster event (a Node added or changed, an assigned pod deleted, ...) or the five-minute flush
takes it out; the lock's release is no such event. A failed *bind* instead puts the pod on its
backoff (1 s, doubling to 10 s). So a lock never refuses a pod at filter time: the filter
reserves on the policy's best node, preferring nodes where no other pod is allocating or about
to be bound (`PendingBinds`), and the bind waits for the lock (`NodeGates`): it is bound within
milliseconds of the lock's release, or, if the lock outlasts the bind's budget, fails, and
kube-scheduler tries it again after its backoff.

Waiting binds take turns per node, in the order they came (asyncio.Lock is fair), so that one
release is answered by one bind-phase request to accounting, not by one per waiting pod; each
wakes on the node's next usage update (accounting publishes one when the lock is released).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

RECHECK = 0.5
"""Seconds a waiting bind sleeps at most without a usage update of its node: an update lost
(a reconnect) costs at most this, not the bind's whole budget."""
BIND_EXPECTED_WITHIN = 10.0
"""Seconds a reservation of this extender's counts as a bind to come on its node: after that
kube-scheduler has given the pod up (its bind would have come within milliseconds)."""
REMEMBERED = 8192
"""Most reservations awaiting their bind remembered (older ones are forgotten first)."""


class NodeGates:
    """Per node: the binds waiting for its lock, one trying at a time, and a signal of the
    node's next change."""

    def __init__(self) -> None:
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        self._changed: dict[str, asyncio.Event] = {}

    @contextlib.asynccontextmanager
    async def turn(self, node: str, within: float) -> AsyncIterator[bool]:
        """This bind's turn on `node` (True), or False when `within` seconds passed first."""
        lock, users = self._turns.get(node) or (asyncio.Lock(), 0)
        self._turns[node] = (lock, users + 1)
        acquired = False
        try:
            try:
                async with asyncio.timeout(max(within, 0.0)):
                    await lock.acquire()
                acquired = True
            except TimeoutError:
                pass
            yield acquired
        finally:
            if acquired:
                lock.release()
            lock, users = self._turns[node]
            if users <= 1:
                del self._turns[node]
            else:
                self._turns[node] = (lock, users - 1)

    def armed(self, node: str) -> asyncio.Event:
        """An event set by the node's next change: taken *before* asking accounting, so that
        a release published while the answer travels is not missed."""
        event = self._changed.get(node)
        if event is None:
            event = self._changed[node] = asyncio.Event()
        return event

    def changed(self, node: str) -> None:
        """The node's usage changed (an update or a snapshot): wake its waiting bind."""
        event = self._changed.pop(node, None)
        if event is not None:
            event.set()

    async def wait(self, event: asyncio.Event, within: float) -> None:
        """Until `event` or `within` seconds (at most RECHECK)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(min(within, RECHECK), 0.0)):
                await event.wait()

    def waiting(self, node: str) -> int:
        """Binds on `node` taking their turn or waiting for it."""
        entry = self._turns.get(node)
        return 0 if entry is None else entry[1]


class PendingBinds:
    """The reservations this extender made whose bind has not ended yet, by node: a node with
    one is about to lock for that pod, so another pod prefers a node without."""

    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[str, str, float]] = {}

    def add(self, uid: str, key: str, node: str, now: float | None = None) -> None:
        """Pod `uid` (`key`: namespace/name) reserved on `node`, its bind to come."""
        self._by_uid.pop(uid, None)
        self._by_uid[uid] = (node, key, time.monotonic() if now is None else now)
        while len(self._by_uid) > REMEMBERED:
            del self._by_uid[next(iter(self._by_uid))]

    def done(self, uid: str) -> None:
        self._by_uid.pop(uid, None)

    def queued(self, exclude_uid: str, now: float | None = None) -> dict[str, int]:
        """Node -> how many other pods' binds are to come there."""
        counts: dict[str, int] = {}
        moment = time.monotonic() if now is None else now
        for uid, (node, _, since) in self._by_uid.items():
            if uid != exclude_uid and moment - since <= BIND_EXPECTED_WITHIN:
                counts[node] = counts.get(node, 0) + 1
        return counts

    def busy(self, exclude_uid: str, now: float | None = None) -> dict[str, str]:
        """Node -> why it is busy, for the nodes with another pod's bind to come."""
        moment = time.monotonic() if now is None else now
        busy: dict[str, str] = {}
        stale = []
        for uid, (node, key, since) in self._by_uid.items():
            if moment - since > BIND_EXPECTED_WITHIN:
                stale.append(uid)
            elif uid != exclude_uid:
                busy.setdefault(node, f"node is about to allocate pod {key}")
        for uid in stale:
            del self._by_uid[uid]
        return busy
