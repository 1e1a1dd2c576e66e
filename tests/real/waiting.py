"""Polling a condition owned by another process (the API server, kube-scheduler, a service),
bounded: a test that never sees it fails with what it last saw instead of hanging."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

INTERVAL = 0.2
"""Seconds between checks: API round trips on loopback take milliseconds, a scheduling cycle
tens of them."""


class NotReached(AssertionError):
    pass


def poll(
    condition: Callable[[], T | None],
    *,
    within: float,
    what: str,
    last: Callable[[], object] | None = None,
) -> T:
    """The first truthy value of `condition()` within `within` seconds; else `NotReached`
    naming `what` and, if given, `last()` (what was seen instead)."""
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f"; last seen: {last()}" if last is not None else ""
            raise NotReached(f"{what}: not within {within:.0f} s{seen}")
        time.sleep(INTERVAL)  # polling foreign state, bounded by `within`
