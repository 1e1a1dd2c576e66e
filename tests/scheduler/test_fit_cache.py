"""The extender's per-node fit cache: a hit is exactly what the fit says (reasons included),
and a node whose revision (or snapshot) changed is fitted again."""

from __future__ import annotations

from shared.core.config import CoreConfig
from shared.core.fit import FitOptions, fit_options
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot
from shared.core.nodes import FitCache, NodePolicy, place_pod
from shared.core.quota import QuotaLedger, QuotaLimit, QuotaProbe
from shared.core.requests import ContainerRequest
from shared.messages import UsageEntry, UsageUpdate
from svc_scheduler.freshness import Freshness, NodeView

A = ContainerKind.APP


def node(name: str, *usage: tuple[int, int, int], mem: int = 40000) -> NodeSnapshot:
    devices = [
        DeviceUsage(DeviceInfo(f"{name}-gpu{i}", i, 10, mem, 100, "NVIDIA A100", i), *u)
        for i, u in enumerate(usage)
    ]
    return NodeSnapshot(name, devices)


def opts() -> FitOptions:
    return fit_options({}, CoreConfig())


REQUEST = ContainerRequest(1, memreq=20000)


def place(
    nodes: dict[str, NodeSnapshot | None], stamps: dict[str, int], cache: FitCache
) -> tuple[str | None, dict[str, str]]:
    placement = place_pod(
        nodes, [REQUEST], [A], opts(), NodePolicy.BINPACK, cache=cache, stamps=stamps
    )
    return placement.chosen, dict(placement.refused)


def test_unchanged_nodes_are_not_fitted_again_and_reasons_stay_exact() -> None:
    nodes: dict[str, NodeSnapshot | None] = {
        "small": node("small", (0, 0, 0), (0, 0, 0), mem=10000),
        "ok": node("ok", (0, 0, 0)),
        "none": None,
    }
    stamps = {"small": 1, "ok": 1, "none": 1}
    uncached = place_pod(nodes, [REQUEST], [A], opts(), NodePolicy.BINPACK)
    cache = FitCache()
    first = place(nodes, stamps, cache)
    assert cache.misses == 3 and cache.hits == 0
    second = place(nodes, stamps, cache)
    assert cache.misses == 3 and cache.hits == 3
    assert first == second == (uncached.chosen, dict(uncached.refused))
    assert second[1]["small"] == "2/2 CardInsufficientMemory"


def test_a_revision_change_invalidates_the_nodes_entry() -> None:
    cache = FitCache()
    state = Freshness()
    full = node("n", (0, 0, 0))
    state.apply_snapshot("e1", [NodeView("n", 3, full)], full=True)

    def decide() -> tuple[str | None, dict[str, str]]:
        view = state.view("n")
        assert view is not None
        return place({"n": view.snapshot}, {"n": view.revision}, cache)

    assert decide() == ("n", {})
    assert decide() == ("n", {})
    assert cache.hits == 1
    # Accounting publishes revision 4: the GPU's memory is nearly all taken.
    state.apply_update(
        UsageUpdate(
            epoch="e1",
            node="n",
            revision=4,
            devices={"n-gpu0": UsageEntry(used=1, usedmem=30000, usedcores=0)},
        )
    )
    assert decide() == (None, {"n": "1/1 CardInsufficientMemory"})
    assert cache.hits == 1 and cache.misses == 2


def test_the_same_stamp_on_another_snapshot_or_another_shape_is_a_miss() -> None:
    cache = FitCache()
    assert place({"n": node("n", (0, 0, 0))}, {"n": 1}, cache) == ("n", {})
    # Same stamp, another snapshot object (never trusted to be the same state).
    busy = node("n", (1, 30000, 0))
    assert place({"n": busy}, {"n": 1}, cache) == (None, {"n": "1/1 CardInsufficientMemory"})
    # Another request shape on the same snapshot is fitted on its own.
    small = place_pod(
        {"n": busy},
        [ContainerRequest(1, memreq=5000)],
        [A],
        opts(),
        NodePolicy.BINPACK,
        cache=cache,
        stamps={"n": 1},
    )
    assert small.chosen == "n"
    assert cache.hits == 0 and cache.misses == 3


def test_nodes_without_a_stamp_and_quota_probed_fits_are_not_cached() -> None:
    cache = FitCache()
    nodes: dict[str, NodeSnapshot | None] = {"a": node("a", (0, 0, 0)), "b": node("b", (0, 0, 0))}
    place(nodes, {"a": 1}, cache)
    place(nodes, {"a": 1}, cache)
    assert cache.hits == 1 and cache.misses == 1 and len(cache) == 1
    probe = QuotaProbe(QuotaLedger({"ml": QuotaLimit(mem=10000)}), "ml", [A], False)
    placement = place_pod(
        nodes, [REQUEST], [A], opts(), NodePolicy.BINPACK, probe, cache=cache, stamps={"a": 1}
    )
    assert placement.chosen is None
    assert set(placement.refused.values()) == {"1/1 ResourceQuotaNotFit"}
    assert cache.hits == 1 and cache.misses == 1


def test_shapes_are_bounded_least_recently_used_first() -> None:
    cache = FitCache(shapes=2)
    nodes: dict[str, NodeSnapshot | None] = {"n": node("n", (0, 0, 0))}
    for mem in (1000, 2000, 3000):
        place_pod(
            nodes,
            [ContainerRequest(1, memreq=mem)],
            [A],
            opts(),
            NodePolicy.BINPACK,
            cache=cache,
            stamps={"n": 1},
        )
    assert len(cache) == 2
    cache.forget("n")
    assert len(cache) == 0
