"""The heap keeper: the long-lived state is frozen once the service is ready, and frozen anew
when a full collection turns slow again (the state was renewed meanwhile), at most once per
interval. Frozen means out of the cyclic collector's view: `gc.get_objects()` no longer lists
it. Each test unfreezes at the end, so the rest of the session collects as usual."""

from __future__ import annotations

import asyncio
import gc
from typing import TYPE_CHECKING

import pytest

from shared.service.health import Readiness
from shared.service.heap import HeapKeeper

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def frozen(obj: object) -> bool:
    """True when the cyclic GC no longer looks at `obj` (moved out by `gc.freeze`)."""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def keeper(clock: Clock) -> AsyncIterator[HeapKeeper]:
    """A keeper for which every full collection is slow, settled once (the service ready)."""
    kept = HeapKeeper(asyncio.get_running_loop(), slow=0.0, interval=60.0, clock=clock)
    readiness = Readiness("loaded")
    task = asyncio.create_task(kept.run(readiness))
    readiness.set("loaded")
    try:
        async with asyncio.timeout(5):
            while kept.settles == 0:  # noqa: ASYNC110 - the task under test
                await asyncio.sleep(0.01)
        yield kept
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.unfreeze()


async def wait_until(predicate: object) -> None:
    assert callable(predicate)
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 - state the collector's callback changes
            await asyncio.sleep(0.01)


async def test_nothing_is_settled_before_the_service_is_ready(clock: Clock) -> None:
    kept = HeapKeeper(asyncio.get_running_loop(), clock=clock)
    readiness = Readiness("loaded")
    task = asyncio.create_task(kept.run(readiness))
    state = [[1], [2]]
    try:
        await asyncio.sleep(0)  # the keeper runs up to its wait
        assert kept.settles == 0 and not frozen(state[0])
        readiness.set("loaded")
        await wait_until(lambda: frozen(state[0]))
        assert kept.settles == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.unfreeze()


async def test_a_slow_full_collection_settles_the_renewed_state(
    keeper: HeapKeeper, clock: Clock
) -> None:
    renewed = [[n] for n in range(100)]  # built after the first settle: in view
    assert not frozen(renewed[0])
    clock.now += 60.0
    gc.collect()  # a full collection, slow by the keeper's measure
    assert keeper.pending
    await wait_until(lambda: frozen(renewed[0]))
    assert keeper.settles == 2 and not keeper.pending


async def test_the_heap_is_settled_at_most_once_per_interval(
    keeper: HeapKeeper, clock: Clock
) -> None:
    renewed = [[n] for n in range(100)]
    clock.now += 59.0
    gc.collect()
    assert not keeper.pending  # too soon after the last settle
    assert not frozen(renewed[0])
    clock.now += 1.0
    gc.collect()
    assert keeper.pending
    await wait_until(lambda: frozen(renewed[0]))


async def test_young_collections_do_not_count(keeper: HeapKeeper, clock: Clock) -> None:
    clock.now += 60.0
    gc.collect(0)
    gc.collect(1)
    assert not keeper.pending
    gc.collect(2)
    assert keeper.pending


async def test_a_settle_frees_what_became_garbage_while_frozen(keeper: HeapKeeper) -> None:
    """Unfrozen before the collection: a cycle frozen while alive is freed once dropped."""

    class Node:
        other: Node | None = None

    collected: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collected.append(info["collected"])

    a, b = Node(), Node()
    a.other, b.other = b, a
    keeper.settle()  # the cycle, alive, frozen with the rest
    assert frozen(a)
    del a, b
    gc.callbacks.append(note)
    try:
        keeper.settle()
    finally:
        gc.callbacks.remove(note)
    assert sum(collected) >= 2


async def test_the_callback_goes_with_the_keeper(clock: Clock) -> None:
    kept = HeapKeeper(asyncio.get_running_loop(), clock=clock)
    readiness = Readiness()
    task = asyncio.create_task(kept.run(readiness))
    try:
        await wait_until(lambda: kept.settles == 1)
        assert len([c for c in gc.callbacks if getattr(c, "__self__", None) is kept]) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.unfreeze()
    assert not [c for c in gc.callbacks if getattr(c, "__self__", None) is kept]
