"""Keeping a service's long-lived state out of the cyclic garbage collector's view.

A full collection re-scans every object the collector tracks. The state a service builds at
start-up (a ledger, a read model of every node) is large and lives as long as the process, so
it is moved into the permanent generation (`gc.freeze`) once it is built: frozen objects are
never scanned, and reference counting still frees them when they are dropped. Measured with a
5000-node scheduler read model: a 40-50 ms collection every ninth /filter while the model was
in the collector's view, 3-5 ms once frozen.

That state is renewed while the service runs (a full snapshot after a reconnect or an
accounting restart replaces every node's view; updates replace them one by one), and what
replaces it is in the collector's view again. So when a full collection turns slow again, the
heap is settled anew: unfrozen, collected (which also frees cycles that became garbage while
frozen: nothing leaks), frozen. That costs one full collection, at most once per interval, in
place of one per handful of requests (measured: every node of 5000 cordoned, so the next filter
took a full snapshot, brought the 40-90 ms collections back every ninth filter until the next
settle, and none after it).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from shared.service.health import Readiness

log = logging.getLogger("numafit")

SLOW_COLLECTION = 0.01
"""Seconds: a full collection this long means the long-lived state is in view again."""
RESETTLE_INTERVAL = 10.0
"""Seconds between two settles of a running service, at least."""
OLDEST = 2
"""CPython's oldest generation: its collections are the full ones."""


def settle_heap() -> None:
    """Collect, then move every object that survives out of the collector's view."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class HeapKeeper:
    """Settles the heap once the service is ready, and again whenever a full collection turns
    slow (at most once per `interval`). Its collector callback only measures; the settling
    itself runs on the event loop (a collection cannot be started from inside another)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        slow: float = SLOW_COLLECTION,
        interval: float = RESETTLE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loop = loop
        self.slow = slow
        self.interval = interval
        self.clock = clock
        self.settles = 0
        self._last = clock()
        self._started = 0.0
        self._pending = False

    @property
    def pending(self) -> bool:
        """A settle is scheduled on the loop and has not run yet."""
        return self._pending

    def settle(self) -> None:
        started = time.perf_counter()
        self._pending = True  # the settle's own full collection must not ask for another
        try:
            settle_heap()
        finally:
            self._last = self.clock()
            self._pending = False
        self.settles += 1
        log.debug(
            "heap settled",
            extra={
                "frozen": gc.get_freeze_count(),
                "ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )

    async def run(self, readiness: Readiness) -> None:
        """Settle once every readiness condition has held (what a service loads after its
        `start` returned, the scheduler's first snapshot of every node, is start-up state
        too), then watch the full collections until cancelled."""
        await readiness.complete.wait()
        self.settle()
        gc.callbacks.append(self._observe)
        try:
            await asyncio.Event().wait()  # until cancelled with the service
        finally:
            gc.callbacks.remove(self._observe)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if info.get("generation") != OLDEST or self._pending:
            return  # only full collections tell that the long-lived state is in view
        if time.perf_counter() - self._started < self.slow:
            return
        if self.clock() - self._last < self.interval:
            return
        self._pending = True
        try:
            # Any thread may run a collection; the settle belongs to the loop's thread.
            self.loop.call_soon_threadsafe(self.settle)
        except RuntimeError:  # the loop has closed: nothing left to keep
            self._pending = False
