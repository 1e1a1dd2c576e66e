"""The one retry delay every loop uses: a list or watch of the API server, the first snapshot
from accounting, the inventory write, kubelet registration.

It starts at `initial` seconds, doubles after every failed attempt up to `cap`, and starts over
after a success (`reset`). `jitter` spreads the waits of many clients retrying against the same
server (a fraction: 0.2 waits 80-100 % of the delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

INITIAL = 0.2
"""Seconds of the first wait."""
CAP = 5.0
"""Longest wait, in seconds: a server that is back is found within this."""


class Backoff:
    def __init__(
        self,
        initial: float = INITIAL,
        cap: float = CAP,
        *,
        factor: float = 2.0,
        jitter: float = 0.0,
        random_fraction: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < initial <= cap:
            raise ValueError("backoff needs 0 < initial <= cap")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("backoff jitter is a fraction in [0, 1]")
        self.initial = initial
        self.cap = cap
        self.factor = factor
        self.jitter = jitter
        self._random = random_fraction
        self.delay = initial
        """What the next wait will be (before jitter)."""

    def reset(self) -> None:
        """The attempt succeeded: the next failure waits `initial` again."""
        self.delay = self.initial

    def next_delay(self) -> float:
        """The wait for this failure (jitter applied); the one after it grows."""
        delay = self.delay
        self.delay = min(self.delay * self.factor, self.cap)
        if self.jitter:
            delay *= 1.0 - self.jitter * self._random()
        return delay

    async def wait(self, stop: asyncio.Event | None = None) -> None:
        """Sleep the next delay; returns early once `stop` is set."""
        delay = self.next_delay()
        if stop is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
