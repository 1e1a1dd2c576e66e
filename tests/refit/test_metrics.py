"""Labelled counters exist at zero from the start, so alert ratios evaluate to 0, not empty.

Before the fix `numafit_refit_requests_total{code="no_fit"}` appeared only after the first
`no_fit`, and a ratio over it had no value until then.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from svc_refit.metrics import RefitMetrics
from tests.design import DESIGN_REFIT_CODES


def test_every_code_and_mode_starts_at_zero() -> None:
    registry = CollectorRegistry()
    RefitMetrics(registry)
    for code in DESIGN_REFIT_CODES:
        for mode in ("best-effort", "strict", "unknown"):
            value = registry.get_sample_value(
                "numafit_refit_requests_total", {"code": code, "mode": mode}
            )
            assert value == 0.0, (code, mode)
    for result in ("ok", "conflict", "no_fit", "quota_exceeded", "deadline_exceeded"):
        assert (
            registry.get_sample_value("numafit_refit_commit_attempts_total", {"result": result})
            == 0.0
        )
    for result in ("recorded", "failed", "dropped"):
        assert registry.get_sample_value("numafit_refit_events_total", {"result": result}) == 0.0
    exposed = generate_latest(registry).decode()
    assert 'numafit_refit_requests_total{code="no_fit",mode="strict"} 0.0' in exposed


def test_a_result_outside_the_known_ones_does_not_make_a_new_series() -> None:
    registry = CollectorRegistry()
    metrics = RefitMetrics(registry)
    metrics.commit("something-accounting-made-up")
    assert (
        registry.get_sample_value("numafit_refit_commit_attempts_total", {"result": "other"}) == 1
    )
    assert (
        registry.get_sample_value(
            "numafit_refit_commit_attempts_total", {"result": "something-accounting-made-up"}
        )
        is None
    )
