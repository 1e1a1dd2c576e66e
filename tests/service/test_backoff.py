"""The one retry delay of every loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from shared.service.backoff import Backoff


def test_the_delay_doubles_up_to_the_cap_and_starts_over_after_a_success() -> None:
    backoff = Backoff()
    assert [backoff.next_delay() for _ in range(7)] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    backoff.reset()
    assert backoff.next_delay() == 0.2


def test_jitter_only_shortens_a_wait_by_at_most_its_fraction() -> None:
    low = Backoff(1.0, 8.0, jitter=0.25, random_fraction=lambda: 1.0)
    high = Backoff(1.0, 8.0, jitter=0.25, random_fraction=lambda: 0.0)
    assert [low.next_delay() for _ in range(3)] == [0.75, 1.5, 3.0]
    assert [high.next_delay() for _ in range(3)] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize(("initial", "cap", "jitter"), [(0, 5, 0), (6, 5, 0), (1, 5, 1.5)])
def test_nonsense_is_refused(initial: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(initial, cap, jitter=jitter)


async def test_a_wait_ends_early_when_the_loop_is_told_to_stop() -> None:
    stop = asyncio.Event()
    backoff = Backoff(5.0, 5.0)
    asyncio.get_running_loop().call_later(0.02, stop.set)
    started = time.monotonic()
    await backoff.wait(stop)
    assert time.monotonic() - started < 1.0
