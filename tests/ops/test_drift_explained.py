"""The premise of NumafitUnexplainedAllocationDrift, checked on the running system: every
allocation accounting counts as drift (kubelet gave other GPUs than reserved) is one the device
plugin did not select devices for (a pod not opted in, a best-effort fallback, devices kubelet
reused from an init container without asking), so the alert's count of unexplained drift stays
at zero. If a change made drift where the plugin selected, the alert would fire by design
again."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml

from shared.tools.simulate.report import public, simulate
from shared.tools.simulate.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "helm" / "numafit" / "files" / "alerts.yaml"
DRIFT = "numafit_accounting_allocation_drift_total"
REFITS = "numafit_deviceplugin_refits_total"
ALLOCATIONS = "numafit_deviceplugin_allocations_total"

MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def selected_selector() -> list[tuple[str, str, str]]:
    """The label matchers of the plugin's outcomes that selected the devices (the alert takes
    their count from all the plugin's allocations)."""
    rules = yaml.safe_load(ALERTS.read_text())
    (expr,) = [
        r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "NumafitUnexplainedAllocationDrift"
    ]
    assert f"increase({ALLOCATIONS}[1h])" in expr  # every allocation, whatever its result
    selectors = set(re.findall(REFITS + r"\{([^}]*)\}", expr))
    assert len(selectors) == 1, f"one selector of {REFITS} expected: {selectors}"
    (selector,) = selectors
    return MATCHER.findall(selector)


def matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    """PromQL's label matching: regular expressions are anchored at both ends."""
    for name, op, value in matchers:
        got = labels.get(name, "")
        ok = {
            "=": got == value,
            "!=": got != value,
            "=~": re.fullmatch(value, got) is not None,
            "!~": re.fullmatch(value, got) is None,
        }[op]
        if not ok:
            return False
    return True


def labels_of(key: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', key.partition("{")[2]))


def test_the_matcher_reads_promql_matchers() -> None:
    matchers = MATCHER.findall('mode=~"none|best-effort",result!="moved"')
    assert matches({"mode": "none", "result": "fallback"}, matchers)
    assert not matches({"mode": "strict", "result": "fallback"}, matchers)
    assert not matches({"mode": "none-x", "result": "fallback"}, matchers)  # anchored
    assert not matches({"mode": "none", "result": "moved"}, matchers)


def total(metrics: dict[str, float], name: str, matchers: list[tuple[str, str, str]]) -> float:
    return sum(
        v
        for k, v in metrics.items()
        if k.startswith(name + "{") and matches(labels_of(k), matchers)
    )


@pytest.mark.parametrize(
    ("scenario", "drifts"),
    [
        # Pods not opted in, a best-effort fallback, a strict refusal, refits that moved.
        ("shared/data/demo-scenario.yaml", True),
        ("examples/best-effort-fallback.yaml", True),
        ("examples/strict-refusal.yaml", True),
        # Init containers and sidecars: refits for each container.
        ("examples/init-and-sidecar.yaml", False),
    ],
)
def test_no_drift_where_the_plugin_selected_the_devices(scenario: str, drifts: bool) -> None:
    metrics: dict[str, float] = public(asyncio.run(simulate(load_scenario(ROOT / scenario))))[
        "metrics"
    ]
    drift = total(metrics, DRIFT, [])
    allocated = total(metrics, ALLOCATIONS, [])
    selected = total(metrics, REFITS, selected_selector())
    assert allocated > 0
    # The alert's count of unexplained drift, without its slack.
    assert drift - (allocated - selected) <= 0, (drift, allocated, selected)
    if drifts:
        assert drift > 0
    # Outcomes that kubelet may override (not opted in, fallbacks) are not selections.
    for result in ("not_opted_in", "fallback", "timeout", "strict_failed", "unmappable"):
        assert not matches({"result": result}, selected_selector()), result
