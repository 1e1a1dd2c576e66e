"""Signals and deadlines.

SIGTERM/SIGINT only set an event; the service's main coroutine reacts to it (fail readiness,
stop taking requests, finish in-flight ones within the grace period, close clients).
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


@dataclass(frozen=True, slots=True)
class Deadline:
    """An absolute point on the monotonic clock, derived from a caller's remaining budget."""

    at: float

    @classmethod
    def after_ms(cls, ms: float) -> Deadline:
        return cls(time.monotonic() + ms / 1000.0)

    def remaining(self) -> float:
        return max(self.at - time.monotonic(), 0.0)

    def remaining_ms(self) -> int:
        return int(self.remaining() * 1000)

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at
