"""The one task supervisor of every service: its children, what is critical, back-pressure,
and one grace period at stop."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from shared.service.supervisor import Supervisor


class Failures:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


async def test_an_eternal_task_that_raises_returns_or_is_cancelled_is_fatal() -> None:
    failures = Failures()
    async with Supervisor("svc", on_fatal=failures) as sup:

        async def broken() -> None:
            raise RuntimeError("bug")

        async def done() -> None:
            return None

        sup.spawn(broken(), "raises", eternal=True)
        sup.spawn(done(), "returns", eternal=True)
        forever = sup.spawn(asyncio.Event().wait(), "cancelled", eternal=True)
        await asyncio.sleep(0)
        forever.cancel()
        await asyncio.sleep(0.01)
        assert sorted(failures.reasons) == [
            "background task cancelled ended (cancelled)",
            "background task raises ended (RuntimeError('bug'))",
            "background task returns ended (returned)",
        ]


async def test_eternal_tasks_ended_by_the_stop_are_no_failure() -> None:
    failures = Failures()
    sup = Supervisor("svc", on_fatal=failures)
    await sup.start()
    task = sup.spawn(asyncio.Event().wait(), "watch", eternal=True)
    await sup.stop(1.0)
    assert task.cancelled()
    assert failures.reasons == []


async def test_a_crashing_task_is_logged_and_its_siblings_keep_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = Failures()
    release = asyncio.Event()
    async with Supervisor("svc", on_fatal=failures) as sup:

        async def crash() -> None:
            raise ValueError("boom")

        async def sibling() -> str:
            await release.wait()
            return "finished"

        survivor = sup.spawn(sibling(), "sibling")
        watch = sup.spawn(asyncio.Event().wait(), "watch", eternal=True)
        with caplog.at_level(logging.ERROR, logger="numafit"):
            crashed = sup.spawn(crash(), "crash")
            await asyncio.wait([crashed])
        release.set()
        assert await survivor == "finished"
        assert crashed.result() is None
        assert not watch.done()
        assert [r.getMessage() for r in caplog.records] == ["task failed"]
    assert failures.reasons == []


async def test_requests_beyond_the_limit_wait_for_a_free_slot() -> None:
    release = asyncio.Event()

    async def blocked() -> None:
        await release.wait()

    async with Supervisor("svc", limit=2) as sup:
        for _ in range(2):
            assert await sup.request(blocked())
        third = asyncio.ensure_future(sup.request(blocked()))
        await asyncio.sleep(0.01)
        assert not third.done()  # back-pressure on the caller, not one more task
        assert sup.requests == 2
        release.set()
        assert await third
        async with asyncio.timeout(1):
            await sup.wait_idle()
        assert sup.requests == 0


async def test_stop_is_one_grace_period_for_requests_and_finite_tasks() -> None:
    sup = Supervisor("svc")
    await sup.start()
    finished: list[str] = []

    async def work(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        finished.append(name)

    await sup.request(work("quick request", 0.05))
    await sup.request(work("stuck request", 10))
    sup.spawn(work("quick event", 0.1), "event")
    sup.spawn(work("stuck event", 10), "event")
    started = time.monotonic()
    await sup.stop(0.3)
    elapsed = time.monotonic() - started
    assert sorted(finished) == ["quick event", "quick request"]
    assert 0.3 <= elapsed < 0.6  # one grace period, not one per kind
    stats = sup.statistics()
    assert (stats.eternal, stats.finite, stats.helpers, stats.requests) == (0, 0, 0, 0)


async def test_eternal_tasks_run_until_the_requests_finish_then_stop_at_once() -> None:
    sup = Supervisor("svc")
    await sup.start()
    order: list[str] = []

    async def watch() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append("watch cancelled")

    async def request() -> None:
        await asyncio.sleep(0.05)
        order.append("request finished")

    sup.spawn(watch(), "watch", eternal=True)
    sup.spawn(asyncio.Event().wait(), "fetch", drain=False)
    await sup.request(request())
    started = time.monotonic()
    await sup.stop(5.0)
    assert order == ["request finished", "watch cancelled"]
    assert time.monotonic() - started < 1.0  # neither waited for the grace period


async def test_no_request_is_taken_once_the_stop_began() -> None:
    sup = Supervisor("svc")
    await sup.start()
    ran: list[str] = []

    async def request() -> None:
        ran.append("ran")

    stopping = asyncio.ensure_future(sup.stop(1.0))
    await asyncio.sleep(0)
    assert not await sup.request(request())  # closed unrun (no "never awaited" warning)
    await stopping
    assert not await sup.request(request())
    gc.collect()
    assert ran == []


async def test_nothing_is_spawned_outside_the_group() -> None:
    sup = Supervisor("svc")

    async def work() -> None:
        return None

    with pytest.raises(RuntimeError, match="not started"):
        sup.spawn(work(), "early")
    await sup.start()
    await sup.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        sup.spawn(work(), "late")
    assert not sup.running


async def test_submitted_work_hands_its_exception_to_whoever_awaits_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Supervisor("svc") as sup:

        async def fetch() -> int:
            raise LookupError("accounting refused")

        async def value() -> int:
            return 7

        with caplog.at_level(logging.ERROR, logger="numafit"):
            with pytest.raises(LookupError, match="refused"):
                await asyncio.shield(sup.submit(fetch(), "snapshot"))
            assert await asyncio.shield(sup.submit(value(), "snapshot")) == 7
        assert caplog.records == []  # the caller's to report, not a task failure
        pending = sup.submit(asyncio.Event().wait(), "snapshot")
    assert pending.cancelled()  # cancelled with the stop


async def test_tracked_requests_are_waited_for_at_stop() -> None:
    sup = Supervisor("svc")
    await sup.start()
    release = asyncio.Event()
    done: list[str] = []

    async def handler() -> None:  # as aiohttp runs it, in a task of its own
        with sup.track():
            await release.wait()
            done.append("answered")

    outside = asyncio.ensure_future(handler())
    await asyncio.sleep(0)
    assert sup.requests == 1
    stopping = asyncio.ensure_future(sup.stop(2.0))
    await asyncio.sleep(0.05)
    assert not stopping.done()
    release.set()
    await stopping
    await outside
    assert done == ["answered"]


async def test_a_cancelled_stop_still_closes_the_group() -> None:
    sup = Supervisor("svc")
    await sup.start()
    task = sup.spawn(asyncio.sleep(10), "event")
    stopping = asyncio.ensure_future(sup.stop(10.0))
    await asyncio.sleep(0.01)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    await asyncio.sleep(0.01)
    assert task.cancelled()
    assert not sup.running
