"""svc_refit's Prometheus metrics (names fixed by DESIGN.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# Resolve 1 ms .. 2 s (the refit budget) with boundaries at the thresholds alerts use.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 5.0)


class RefitMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "numafit_refit_requests",
            "Refit requests by reply code and mode.",
            ["code", "mode"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "numafit_refit_duration_seconds",
            "Refit handling time inside svc_refit, from receipt to reply.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.commit_attempts = Counter(
            "numafit_refit_commit_attempts",
            "Moves sent to accounting, by result (ok, conflict, or the refusal code).",
            ["result"],
            registry=self.registry,
        )
