"""The premise of NumafitUnexplainedAllocationDrift, checked on the running system: every
allocation accounting counts as drift (kubelet gave other GPUs than reserved) is one the device
plugin counted, in the series the alert subtracts, when it let kubelet pick. If a change made
drift that the plugin does not count that way, the alert would fire by design again."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml

from shared.simulate.report import public, simulate
from shared.simulate.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "helm" / "numafit" / "files" / "alerts.yaml"
DRIFT = "numafit_accounting_allocation_drift_total"
REFITS = "numafit_deviceplugin_refits_total"

MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def explaining_selector() -> list[tuple[str, str, str]]:
    """The label matchers of the plugin series the alert subtracts from the drift."""
    rules = yaml.safe_load(ALERTS.read_text())
    (expr,) = [
        r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "NumafitUnexplainedAllocationDrift"
    ]
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


@pytest.mark.parametrize(
    ("scenario", "drifts"),
    [
        # A pod not opted in, a best-effort fallback, a strict refusal, refits that moved.
        ("shared/data/demo-scenario.yaml", 2),
        ("examples/best-effort-fallback.yaml", 2),
        ("examples/strict-refusal.yaml", 1),
        # Every mismatch refitted: no drift, and nothing counted as kubelet's choice.
        ("examples/init-and-sidecar.yaml", 0),
    ],
)
def test_every_drift_is_one_the_plugin_counted_as_kubelets_choice(
    scenario: str, drifts: int
) -> None:
    metrics: dict[str, float] = public(asyncio.run(simulate(load_scenario(ROOT / scenario))))[
        "metrics"
    ]
    matchers = explaining_selector()
    drift = sum(v for k, v in metrics.items() if k.startswith(DRIFT + "{"))
    explained = sum(
        v
        for k, v in metrics.items()
        if k.startswith(REFITS + "{") and matches(labels_of(k), matchers)
    )
    assert drift == explained == drifts
    # Strict refusals allocate nothing, so they explain nothing: the selector leaves them out.
    strict = {k: v for k, v in metrics.items() if k.startswith(REFITS + '{mode="strict"')}
    assert not any(matches(labels_of(k), matchers) for k in strict)
