"""Node scoring and node choice (HAMi's ComputeDefaultScore and node policies), pure."""

from __future__ import annotations

import pytest

from shared.core import keys
from shared.core.config import CoreConfig
from shared.core.fit import FitOptions, fit_options
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot, Usage
from shared.core.nodes import (
    NODE_UNREGISTERED,
    NodePolicy,
    extender_priority,
    node_score,
    parse_node_policy,
    place_pod,
    rank_nodes,
    without_pod,
)
from shared.core.quota import QuotaLedger, QuotaLimit, QuotaProbe
from shared.core.requests import ContainerRequest

A, I, S = ContainerKind.APP, ContainerKind.INIT, ContainerKind.SIDECAR  # noqa: E741


def node(name: str, *usage: tuple[int, int, int], mem: int = 40000) -> NodeSnapshot:
    devices = [
        DeviceUsage(DeviceInfo(f"{name}-gpu{i}", i, 10, mem, 100, "NVIDIA A100", i), *u)
        for i, u in enumerate(usage)
    ]
    return NodeSnapshot(name, devices)


def opts() -> FitOptions:
    return fit_options({}, CoreConfig())


def test_node_score_is_hamis_default_score() -> None:
    # 2 GPUs: slots 3/20, cores 50/200, memory 20000/80000 -> 10 * (0.15 + 0.25 + 0.25)
    assert node_score(node("n", (2, 20000, 50), (1, 0, 0))) == pytest.approx(6.5)
    assert node_score(node("idle", (0, 0, 0))) == 0.0
    assert node_score(node("full", (10, 40000, 100))) == pytest.approx(30.0)
    assert node_score(NodeSnapshot("empty", [])) == 0.0


@pytest.mark.parametrize(
    ("annotation", "default", "expected"),
    [
        (None, "binpack", NodePolicy.BINPACK),
        (None, "spread", NodePolicy.SPREAD),
        (" Spread ", "binpack", NodePolicy.SPREAD),
        ("binpack", "spread", NodePolicy.BINPACK),
        ("anything-else", "spread", NodePolicy.BINPACK),
    ],
)
def test_node_policy_from_annotation_or_default(
    annotation: str | None, default: str, expected: NodePolicy
) -> None:
    annotations = {keys.NODE_POLICY: annotation} if annotation is not None else {}
    config = CoreConfig(node_scheduler_policy=default)
    assert parse_node_policy(annotations, config) is expected


def test_rank_binpack_prefers_most_used_spread_least_used_ties_by_name() -> None:
    scores = {"b": 5.0, "a": 5.0, "c": 9.0, "d": 1.0}
    assert rank_nodes(scores, NodePolicy.BINPACK) == ["c", "a", "b", "d"]
    assert rank_nodes(scores, NodePolicy.SPREAD) == ["d", "a", "b", "c"]


def test_extender_priority_is_absolute_and_policy_oriented() -> None:
    assert extender_priority(0.0, NodePolicy.BINPACK) == 0
    assert extender_priority(30.0, NodePolicy.BINPACK) == 10
    assert extender_priority(15.0, NodePolicy.BINPACK) == 5
    assert extender_priority(0.0, NodePolicy.SPREAD) == 10
    assert extender_priority(30.0, NodePolicy.SPREAD) == 0
    assert extender_priority(99.0, NodePolicy.BINPACK) == 10  # clamped


def test_place_pod_binpack_picks_the_fuller_node_after_placing() -> None:
    nodes = {
        "idle": node("idle", (0, 0, 0)),
        "busy": node("busy", (1, 10000, 10)),
    }
    request = ContainerRequest(1, memreq=10000, coresreq=10)
    placement = place_pod(nodes, [request], [A], opts(), NodePolicy.BINPACK)
    assert placement.chosen == "busy"
    assert placement.ranked == ["busy", "idle"]
    assert placement.rows[0][0].uuid == "busy-gpu0"
    spread = place_pod(nodes, [request], [A], opts(), NodePolicy.SPREAD)
    assert spread.chosen == "idle"


def test_place_pod_refuses_with_hamis_reason_per_node() -> None:
    nodes = {
        "small": node("small", (0, 0, 0), (0, 0, 0), mem=10000),
        "ok": node("ok", (0, 0, 0)),
        "none": None,
    }
    request = ContainerRequest(1, memreq=20000)
    placement = place_pod(nodes, [request], [A], opts(), NodePolicy.BINPACK)
    assert placement.chosen == "ok"
    assert placement.refused == {
        "small": "2/2 CardInsufficientMemory",
        "none": NODE_UNREGISTERED,
    }


def test_place_pod_counts_phases_init_and_app_share_a_gpu() -> None:
    # e.7: init 30 GB + app 20 GB never run together: fits one 40 GB GPU; a sidecar does not.
    nodes = {"n": node("n", (0, 0, 0))}
    init, app = ContainerRequest(1, memreq=30000), ContainerRequest(1, memreq=20000)
    assert place_pod(nodes, [init, app], [I, A], opts(), NodePolicy.BINPACK).chosen == "n"
    refused = place_pod(nodes, [init, app], [S, A], opts(), NodePolicy.BINPACK)
    assert refused.chosen is None
    assert refused.refused == {"n": "1/1 CardInsufficientMemory"}


def test_place_pod_quota_probe_refuses_every_device() -> None:
    ledger = QuotaLedger({"ml": QuotaLimit(mem=10000)})
    probe = QuotaProbe(ledger, "ml", [A], False)
    nodes = {"n": node("n", (0, 0, 0), (0, 0, 0))}
    placement = place_pod(
        nodes, [ContainerRequest(1, memreq=20000)], [A], opts(), NodePolicy.BINPACK, probe
    )
    assert placement.refused == {"n": "2/2 ResourceQuotaNotFit"}


def test_without_pod_takes_a_stored_reservation_out_of_a_copy() -> None:
    original = node("n", (2, 30000, 60))
    cleaned = without_pod(original, {"n-gpu0": Usage(20000, 30, 0), "other": Usage(1, 1, 1)})
    assert cleaned.devices[0].as_dict() == {"used": 1, "usedmem": 10000, "usedcores": 30}
    assert original.devices[0].as_dict() == {"used": 2, "usedmem": 30000, "usedcores": 60}
