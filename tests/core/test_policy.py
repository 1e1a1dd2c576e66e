"""Scoring weights and ordering policies (reference d.3, d.4)."""

from __future__ import annotations

import pytest

from shared.core.errors import AnnotationError
from shared.core.model import DeviceInfo, DeviceUsage
from shared.core.policy import (
    ScoringWeights,
    device_score,
    order_devices,
    parse_policy,
    parse_scoring_weights,
)
from shared.core.requests import ContainerRequest


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, ScoringWeights(1, 1, 1)),
        ("slot=1,core=2,memory=3", ScoringWeights(1, 2, 3)),
        ("memory=0, slot=5 ,core=0", ScoringWeights(5, 0, 0)),
    ],
)
def test_scoring_weights_parse(text: str | None, expected: ScoringWeights) -> None:
    assert parse_scoring_weights(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "slot=1,core=1",
        "slot=1,core=1,memory=1,slot=1",
        "slot=1,slot=1,memory=1",
        "slot=-1,core=1,memory=1",
        "slot=a,core=1,memory=1",
        "slot=0,core=0,memory=0",
        "gpu=1,core=1,memory=1",
        "slot:1,core=1,memory=1",
        "slot=1.5,core=1,memory=1",
    ],
)
def test_scoring_weights_refuse_invalid_values(text: str) -> None:
    with pytest.raises(AnnotationError):
        parse_scoring_weights(text)


def usage(
    uuid: str, numa: int, used: int = 0, mem: int = 0, cores: int = 0, index: int = 0
) -> DeviceUsage:
    return DeviceUsage(
        DeviceInfo(uuid, index, 10, 40000, 100, "NVIDIA A100", numa), used, mem, cores
    )


def test_score_formula() -> None:
    device = usage("a", 0, used=1, mem=10000, cores=50)
    request = ContainerRequest(1, memreq=10000, coresreq=10)
    # 10 * (2/10 + 60/100 + 20000/40000) = 13
    assert device_score(device, request, ScoringWeights()) == pytest.approx(13.0)
    assert device_score(device, request, ScoringWeights(0, 0, 1)) == pytest.approx(5.0)


def preferred(policy: str, devices: list[DeviceUsage], numa_bind: bool = False) -> list[str]:
    request = ContainerRequest(1, memreq=1000)
    ordered = order_devices(devices, request, parse_policy(policy), numa_bind, ScoringWeights())
    return [d.info.id for d in reversed(ordered)]  # most preferred first


def test_spread_prefers_least_used_and_binpack_most_used() -> None:
    devices = [usage("idle", 0, index=0), usage("busy", 0, used=5, mem=30000, cores=50, index=1)]
    assert preferred("spread", devices) == ["idle", "busy"]
    assert preferred("binpack", devices) == ["busy", "idle"]


def test_mutex_prefers_idle_devices() -> None:
    devices = [usage("idle", 0, index=1), usage("busy", 0, used=1, index=0)]
    assert preferred("mutex", devices)[0] == "idle"


def test_numa_bind_keeps_numa_runs_contiguous() -> None:
    devices = [
        usage("n0-busy", 0, used=3, mem=20000, index=0),
        usage("n1-idle", 1, index=1),
        usage("n0-idle", 0, index=2),
        usage("n1-busy", 1, used=3, mem=20000, index=3),
    ]
    spread = preferred("spread", devices, numa_bind=True)
    binpack = preferred("binpack", devices, numa_bind=True)
    assert [u[:2] for u in spread] == ["n1", "n1", "n0", "n0"]
    assert spread[:2] == ["n1-idle", "n1-busy"]
    assert [u[:2] for u in binpack] == ["n0", "n0", "n1", "n1"]
    assert binpack[:2] == ["n0-busy", "n0-idle"]


def test_chains_apply_keys_in_written_order() -> None:
    devices = [
        usage("n0-idle", 0, index=0),
        usage("n1-busy", 1, used=5, mem=20000, index=1),
        usage("n1-idle", 1, index=2),
    ]
    # numa ascending first (walked from the end: highest NUMA first), then binpack inside.
    assert preferred("numa,binpack", devices) == ["n1-busy", "n1-idle", "n0-idle"]
    assert preferred("binpack,numa", devices)[0] == "n1-busy"
    assert preferred("spread,mutex", devices)[-1] == "n1-busy"  # unknown names are not keys
    policy = parse_policy("Spread, mutex")
    assert policy.mutex and policy.chain == ("spread",)
    assert parse_policy("numa").chain == ("numa",)
    assert parse_policy("spread").chain is None
