"""The single writer's commit check (shared/core/commit_check.py): the fit's own rules, judged on
the end state a reserve or move would write, phase-aware, with the pod's own usage taken out."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import fit as f
from shared.core.accounting import track_pod
from shared.core.commit_check import check_commit
from shared.core.fit import FitOptions, fit_pod
from shared.core.model import (
    ContainerDevice,
    ContainerKind,
    DeviceInfo,
    NodeSnapshot,
    Usage,
    snapshot_of,
)
from shared.core.pods import pod_from_object
from shared.core.policy import parse_policy
from shared.core.quota import QuotaLedger, QuotaLimit
from shared.core.requests import ContainerRequest
from tests.builders import container, pod

S, I, A = ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP  # noqa: E741


def info(uuid: str, **kw: Any) -> DeviceInfo:
    fields: dict[str, Any] = {
        "index": 0,
        "count": 10,
        "devmem": 40000,
        "devcore": 100,
        "type": "NVIDIA A100",
        "numa": 0,
    }
    fields.update(kw)
    return DeviceInfo(uuid, **fields)


def node(*devices: DeviceInfo, others: dict[str, Usage] | None = None, cordon: str = "") -> Any:
    snapshot = snapshot_of("node-1", devices, {cordon} if cordon else ())
    if others:
        snapshot.add_pod_usage(others)
    return snapshot


def row(uuid: str, mem: int, cores: int = 0) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid, "NVIDIA", mem, cores),)


def test_an_over_commit_of_memory_is_refused_with_hamis_reason() -> None:
    # GPU-b holds 20000 of 40000 MiB for another pod: 22000 more would make it 42000/40000.
    snapshot = node(info("GPU-a"), info("GPU-b"), others={"GPU-b": Usage(20000, 0, 1)})
    verdict = check_commit(snapshot, None, [row("GPU-b", 22000)], [A], False)
    assert not verdict.ok
    assert verdict.reasons == {f.CARD_INSUFFICIENT_MEMORY: 1}
    assert verdict.reason_text == "1/1 CardInsufficientMemory"


def test_a_reservation_that_fits_exactly_is_accepted() -> None:
    snapshot = node(info("GPU-b"), others={"GPU-b": Usage(20000, 70, 9)})
    verdict = check_commit(snapshot, None, [row("GPU-b", 20000, 30)], [A], False)
    assert verdict.ok and verdict.reasons == {}


def test_cores_and_slots_are_checked_per_device() -> None:
    snapshot = node(info("GPU-b", count=2), others={"GPU-b": Usage(1000, 80, 1)})
    assert check_commit(snapshot, None, [row("GPU-b", 1000, 30)], [A], False).reasons == {
        f.CARD_INSUFFICIENT_CORE: 1
    }
    two_apps = [row("GPU-b", 1000, 10), row("GPU-b", 1000, 10)]
    assert check_commit(snapshot, None, two_apps, [A, A], False).reasons == {
        f.CARD_TIME_SLICING_EXHAUSTED: 1
    }


def test_a_whole_card_needs_the_card_alone() -> None:
    used = node(info("GPU-b"), others={"GPU-b": Usage(1000, 0, 1)})
    assert check_commit(used, None, [row("GPU-b", 1000, 100)], [A], False).reasons == {
        f.EXCLUSIVE_CONFLICT: 1
    }
    # A 100-core init container and two 0-core apps on one free card: the fit places them
    # (the init runs alone), so the commit check accepts them.
    free = node(info("GPU-b"))
    rows = [row("GPU-b", 5000, 100), row("GPU-b", 1000), row("GPU-b", 1000)]
    assert check_commit(free, None, rows, [I, A, A], False).ok


def test_device_state_is_checked_as_the_fit_does() -> None:
    sick = node(info("GPU-b", health=False))
    assert check_commit(sick, None, [row("GPU-b", 1)], [A], False).reasons == {f.CARD_NOT_HEALTH: 1}
    cordoned = node(info("GPU-b"), cordon="GPU-b")
    assert check_commit(cordoned, None, [row("GPU-b", 1)], [A], False).reasons == {
        f.CARD_CORDONED: 1
    }
    assert check_commit(node(info("GPU-a")), None, [row("GPU-x", 1)], [A], False).reasons == {
        f.CARD_UUID_MISMATCH: 1
    }


def test_phases_are_counted_as_they_run_not_summed() -> None:
    # init 30000 then app 20000 on one card beside 10000 of another pod: the peak is 40000.
    snapshot = node(info("GPU-b"), others={"GPU-b": Usage(10000, 0, 1)})
    rows = [row("GPU-b", 30000), row("GPU-b", 20000)]
    assert check_commit(snapshot, None, rows, [I, A], False).ok
    # A sidecar runs beside the init container declared after it: 10000 + 25000 > 30000 left.
    with_sidecar = [row("GPU-b", 10000), row("GPU-b", 25000), row("GPU-b", 1)]
    assert check_commit(snapshot, None, with_sidecar, [S, I, A], False).reasons == {
        f.CARD_INSUFFICIENT_MEMORY: 1
    }
    # Once the init phase is released only the sidecar and the app count.
    assert check_commit(snapshot, None, with_sidecar, [S, I, A], True).ok


def tracked_on(allocated: str, **kw: Any) -> Any:
    obj = pod(
        "p",
        init=[container("prep")],
        containers=[container("main")],
        namespace="ml",
        allocated=allocated,
        **kw,
    )
    tracked = track_pod(pod_from_object(obj))
    assert tracked is not None
    return tracked


def test_the_pods_own_usage_is_taken_out_and_only_growth_is_judged() -> None:
    # The worked example: prep on GPU-b (30000), main on GPU-a (20000); main moves to GPU-b.
    tracked = tracked_on("GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;")
    snapshot = node(info("GPU-a"), info("GPU-b", index=1), others={"GPU-b": Usage(10000, 40, 1)})
    snapshot.add_pod_usage(tracked.usage)
    moved = [row("GPU-b", 30000, 60), row("GPU-b", 20000, 30)]
    verdict = check_commit(snapshot, tracked, moved, tracked.pod.kinds, tracked.released)
    assert verdict.ok and verdict.considered == 0  # GPU-b's peak does not grow: nothing added
    # Moving onto a card that cannot take it, though its own old usage there is gone.
    full = node(info("GPU-a"), info("GPU-b", index=1), others={"GPU-b": Usage(25000, 0, 1)})
    full.add_pod_usage(tracked.usage)
    bigger = [row("GPU-b", 30000, 60), row("GPU-b", 20000, 30)]
    tight = tracked_on("GPU-b,NVIDIA,10000,60:;GPU-a,NVIDIA,20000,30:;")
    assert check_commit(full, tight, bigger, tight.pod.kinds, False).reasons == {
        f.CARD_INSUFFICIENT_MEMORY: 1
    }
    # Leaving a cordoned card is never refused: only devices the commit adds to are judged.
    cordoned = node(info("GPU-a"), info("GPU-b", index=1), cordon="GPU-a")
    cordoned.add_pod_usage(tracked.usage)
    away = [row("GPU-b", 30000, 60), row("GPU-b", 20000, 30)]
    assert check_commit(cordoned, tracked, away, tracked.pod.kinds, False).ok


def test_the_snapshot_given_is_not_modified() -> None:
    snapshot = node(info("GPU-b"), others={"GPU-b": Usage(20000, 0, 1)})
    before = snapshot.usage_table()
    check_commit(snapshot, None, [row("GPU-b", 30000, 100)], [A], False)
    assert snapshot.usage_table() == before


def test_quota_excludes_the_pods_own_usage() -> None:
    tracked = tracked_on("GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;")
    quota = QuotaLedger({"ml": QuotaLimit(mem=32000)})
    quota.add("ml", tracked.usage)  # 50000 counted: its own, excluded when re-placed
    snapshot = node(info("GPU-a"), info("GPU-b", index=1))
    snapshot.add_pod_usage(tracked.usage)
    same_total = [row("GPU-b", 30000, 60), row("GPU-b", 20000, 30)]
    assert check_commit(
        snapshot, tracked, same_total, tracked.pod.kinds, False, namespace="ml", quota=quota
    ).ok
    more = [row("GPU-b", 33000, 60), row("GPU-b", 20000, 30)]
    verdict = check_commit(
        snapshot, tracked, more, tracked.pod.kinds, False, namespace="ml", quota=quota
    )
    assert verdict.reasons == {f.RESOURCE_QUOTA_NOT_FIT: 1} and verdict.quota_only


# --- the property: never refuse what the fit itself placed; never accept an over-commit ------

_kinds = st.lists(st.sampled_from([S, I, A]), min_size=1, max_size=4).map(
    lambda ks: sorted(ks, key=lambda k: k is A)  # HAMi's layout: init containers first
)
_request = st.builds(
    ContainerRequest,
    nums=st.integers(1, 2),
    memreq=st.integers(0, 20000),
    coresreq=st.sampled_from([0, 10, 30, 50, 100]),
)
_others = st.lists(
    st.tuples(st.integers(0, 30000), st.sampled_from([0, 20, 50, 100]), st.integers(0, 3)),
    min_size=3,
    max_size=3,
)


def _node_with(others: list[tuple[int, int, int]]) -> NodeSnapshot:
    devices = [info(f"GPU-{i}", index=i, count=4, numa=i % 2) for i in range(3)]
    snapshot = snapshot_of("node-1", devices)
    for device, (mem, cores, slots) in zip(snapshot.devices, others, strict=True):
        if slots:
            device.add(Usage(mem, cores, slots))
    return snapshot


@settings(max_examples=300, deadline=None)
@given(_kinds, st.data(), _others, st.sampled_from(["spread", "binpack"]))
def test_whatever_the_fit_places_the_commit_check_accepts(
    kinds: list[ContainerKind], data: st.DataObject, others: list[tuple[int, int, int]], policy: str
) -> None:
    requests = [data.draw(_request) for _ in kinds]
    snapshot = _node_with(others)
    placed = fit_pod(snapshot, requests, kinds, FitOptions(parse_policy(policy)))
    if placed.ok:
        verdict = check_commit(snapshot, None, list(placed.rows), kinds, False)
        assert verdict.ok, (verdict.reasons, placed.rows)


@settings(max_examples=300, deadline=None)
@given(_kinds, st.data(), _others)
def test_an_accepted_commit_never_exceeds_a_device(
    kinds: list[ContainerKind], data: st.DataObject, others: list[tuple[int, int, int]]
) -> None:
    rows = [
        tuple(
            ContainerDevice(f"GPU-{g}", "NVIDIA", data.draw(st.integers(0, 25000)), c)
            for g, c in data.draw(
                st.lists(
                    st.tuples(st.integers(0, 2), st.sampled_from([0, 30, 60, 100])),
                    max_size=2,
                    unique_by=lambda t: t[0],
                )
            )
        )
        for _ in kinds
    ]
    snapshot = _node_with(others)
    verdict = check_commit(snapshot, None, rows, kinds, False)
    if verdict.ok:
        after = snapshot.copy()
        from shared.core.accounting import effective

        after.add_pod_usage(effective(kinds, rows, False))
        for device in after.devices:
            assert device.usedmem <= device.info.devmem
            assert device.usedcores <= device.info.devcore
            assert device.used <= device.info.count
