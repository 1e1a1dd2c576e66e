"""Kubernetes Events recorded in the background: bounded in time and in number, counted, never
outliving the service."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, cast

from shared.service import kube_io
from shared.service.events import EventRecorder, SpamFilter
from shared.service.supervisor import Supervisor

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.service.kube_io import Kube

POD = {"namespace": "ml", "name": "train", "uid": "u-1"}


class FakeKube:
    """`create_event` only: hangs while `hang` is set, fails with `error` when given."""

    def __init__(self) -> None:
        self.hang = False
        self.error: Exception | None = None
        self.events: list[tuple[str, str, str]] = []

    async def create_event(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str
    ) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        self.events.append((involved["name"], event_type, reason))


def recorder(
    kube: FakeKube | None, sup: Supervisor, results: list[str], **options: Any
) -> EventRecorder:
    return EventRecorder(
        cast("Kube | None", kube), sup, on_result=results.append, task_name="test-event", **options
    )


async def test_an_event_is_recorded_in_the_background_and_counted() -> None:
    kube = FakeKube()
    results: list[str] = []
    async with Supervisor("svc") as sup:
        events = recorder(kube, sup, results)
        assert events.record(POD, "Normal", "NumaRefitSucceed", "moved")
        assert kube.events == []  # not yet: record never waits for the write
        async with asyncio.timeout(1):
            while not results:  # noqa: ASYNC110 - the background write under test
                await asyncio.sleep(0.005)
    assert kube.events == [("train", "Normal", "NumaRefitSucceed")]
    assert results == ["recorded"]


async def test_a_slow_or_failing_write_is_given_up_and_counted_failed() -> None:
    kube = FakeKube()
    results: list[str] = []
    async with Supervisor("svc") as sup:
        events = recorder(kube, sup, results, timeout=0.05)
        kube.hang = True
        events.record(POD, "Warning", "NumaRefitFailed", "slow")
        await asyncio.sleep(0.15)
        kube.hang, kube.error = False, kube_io.KubeError("403 forbidden")
        events.record(POD, "Warning", "NumaRefitFailed", "refused")
        await asyncio.sleep(0.02)
    assert results == ["failed", "failed"]


async def test_beyond_the_limit_an_event_is_dropped_and_counted() -> None:
    kube = FakeKube()
    results: list[str] = []
    kube.hang = True
    async with Supervisor("svc") as sup:
        events = recorder(kube, sup, results, limit=2)
        assert events.record(POD, "Warning", "BindingFailed", "1")
        assert events.record(POD, "Warning", "BindingFailed", "2")
        assert not events.record(POD, "Warning", "BindingFailed", "3")
        assert results == ["dropped"]
        assert events.in_flight == 2


async def test_no_event_outlives_the_service() -> None:
    kube = FakeKube()
    results: list[str] = []
    kube.hang = True
    sup = Supervisor("svc")
    await sup.start()
    events = recorder(kube, sup, results)
    events.record(POD, "Warning", "AllocationDiffersFromReservation", "drift")
    assert [t for t in asyncio.all_tasks() if t.get_name() == "test-event"]
    await sup.stop(0.05)
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "test-event"]
    assert not events.record(POD, "Warning", "AllocationDiffersFromReservation", "late")
    await asyncio.sleep(0)
    assert events.in_flight == 0


async def test_without_a_kubernetes_client_nothing_is_recorded() -> None:
    results: list[str] = []
    async with Supervisor("svc") as sup:
        assert not recorder(None, sup, results).record(POD, "Normal", "X", "y")
    assert results == []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_object_gets_its_burst_then_one_event_per_refill() -> None:
    clock = Clock()
    spam = SpamFilter(burst=3, refill_seconds=300.0, clock=clock)
    assert [spam.allow("u-1") for _ in range(4)] == [True, True, True, False]
    assert spam.allow("u-2")  # another object has its own bucket
    clock.now += 299.0
    assert not spam.allow("u-1")
    clock.now += 1.0
    assert spam.allow("u-1") and not spam.allow("u-1")


def test_the_filter_remembers_a_bounded_number_of_objects() -> None:
    spam = SpamFilter(burst=1, keys=2, clock=Clock())
    assert spam.allow("a") and spam.allow("b") and spam.allow("c")
    assert spam.allow("a")  # "a" was forgotten (least recently used): a fresh bucket


async def test_events_beyond_an_objects_burst_are_throttled_not_written() -> None:
    kube = FakeKube()
    results: list[str] = []
    async with Supervisor("svc") as sup:
        events = recorder(kube, sup, results, spam=SpamFilter(burst=2, clock=Clock()))
        assert events.record(POD, "Normal", "NumaRefitSucceed", "moved")
        assert events.record(POD, "Normal", "NumaRefitSucceed", "moved")
        assert not events.record(POD, "Normal", "NumaRefitSucceed", "moved")
        assert events.record({**POD, "uid": "u-2"}, "Normal", "NumaRefitSucceed", "moved")
        async with asyncio.timeout(1):
            while results.count("recorded") < 3:  # noqa: ASYNC110 - the background writes
                await asyncio.sleep(0.005)
    assert results.count("throttled") == 1
    assert len(kube.events) == 3
