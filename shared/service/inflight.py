"""Concurrent request handling with a drain.

NATS delivers a subscription's messages to its callback one after another, so a handler that
awaits I/O (an API patch, another service) would hold up every request behind it. Handlers
therefore only `spawn` the work: each request runs in its own task, at most `limit` at once,
and a drain waits for them (bounded by a grace period) before the service closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any


class InFlight:
    def __init__(self, limit: int = 256) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[None]] = set()

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._idle.set()

    async def spawn(self, work: Coroutine[Any, Any, None], name: str = "request") -> None:
        """Run `work` in its own task; waits only when `limit` requests are already running
        (back-pressure on the subscription rather than unbounded tasks)."""
        await self._slots.acquire()
        self.count += 1
        self._idle.clear()

        async def run() -> None:
            try:
                await work
            finally:
                self._slots.release()
                self.count -= 1
                if self.count == 0:
                    self._idle.set()

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self, grace: float) -> bool:
        """True when every request finished within `grace` seconds; the rest are cancelled."""
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
        except TimeoutError:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            return False
        return True
