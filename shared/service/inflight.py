"""Counting in-flight requests so that a drain can wait for them (bounded by a grace period)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class InFlight:
    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

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

    async def wait_idle(self, grace: float) -> bool:
        """True when every request finished within `grace` seconds."""
        try:
            async with asyncio.timeout(grace):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
