"""svc_refit's Prometheus metrics (names fixed: docs/reference/metrics.md).

Every labelled counter is created at zero for each label value it can take, so that alert
ratios (refusals over requests, say) evaluate to 0 rather than to nothing before the first one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared import codes
from shared.codes import Code
from shared.metrics_buckets import REFIT_LATENCY_BUCKETS
from shared.service import events
from shared.service.counters import at_zero

MODES = ("best-effort", "strict", "unknown")
"""`mode` label values: the request's mode, `unknown` when the request did not parse."""
CODES = tuple(code.value for code in Code if code in codes.REFIT)
"""`code` label values: every code a refit reply may carry (in docs/reference/refit-codes.md's
order)."""
COMMIT_RESULTS = (
    Code.OK.value,
    "unavailable",
    "other",
    *(c.value for c in Code if c in codes.REFIT and c is not Code.MOVED),
)
"""`result` of a move sent to accounting: `ok`, a refusal code, `unavailable` (no answer),
`other` (a code outside that list)."""
EVENT_RESULTS = events.RESULTS
UNCERTAIN_OUTCOMES = ("landed", "not_landed", "unknown")


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
            buckets=REFIT_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.commit_attempts = Counter(
            "numafit_refit_commit_attempts",
            "Moves sent to accounting, by result (ok, conflict, or the refusal code).",
            ["result"],
            registry=self.registry,
        )
        self.snapshots = Counter(
            "numafit_refit_snapshots",
            "Node snapshots the read model fetched from accounting (shared by concurrent refits).",
            registry=self.registry,
        )
        self.uncertain = Counter(
            "numafit_refit_uncertain_commits",
            "Moves whose answer was lost or inconclusive, by what the check afterwards found "
            "(landed: answered moved; not_landed; unknown: no budget left to check).",
            ["outcome"],
            registry=self.registry,
        )
        self.events = Counter(
            "numafit_refit_events",
            "Kubernetes Events for refit outcomes, by result (recorded, failed, dropped: too "
            "many still being recorded).",
            ["result"],
            registry=self.registry,
        )
        self.replies_lost = Counter(
            "numafit_refit_replies_lost",
            "Refit replies that could not be sent (the connection broke under them); the "
            "device plugin's wait runs out and it falls back as for any lost answer.",
            registry=self.registry,
        )
        self.nodes = Gauge(
            "numafit_refit_read_model_nodes",
            "Nodes svc_refit's read model currently holds.",
            registry=self.registry,
        )
        at_zero(self.requests, CODES, MODES)
        at_zero(self.commit_attempts, COMMIT_RESULTS)
        at_zero(self.events, EVENT_RESULTS)
        at_zero(self.uncertain, UNCERTAIN_OUTCOMES)

    def commit(self, result: str) -> None:
        self.commit_attempts.labels(result if result in COMMIT_RESULTS else "other").inc()
