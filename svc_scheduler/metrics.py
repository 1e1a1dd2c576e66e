"""svc_scheduler's Prometheus metrics (the filter names are fixed: docs/reference/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.core import webhook_rules
from shared.service.counters import at_zero
from svc_scheduler.topology import RESULTS as PREDICTION_RESULTS

FILTER_RESULTS = ("fit", "no_fit", "not_gpu", "deferred", "error")
RESERVE_RESULTS = ("ok", "conflict", "quota_exceeded", "node_unavailable", "no_fit", "unavailable")
BIND_RESULTS = (
    "ok",
    "invalid_request",
    "accounting_unavailable",
    "binding_failed",
    "conflict",
    "pod_not_tracked",
    "node_mismatch",
    "lock_wait_timeout",
)
DENIALS = (
    webhook_rules.OWNED_ANNOTATION,
    webhook_rules.INVALID_NUMA_ALIGNMENT,
    webhook_rules.INVALID_SCORING_WEIGHTS,
    webhook_rules.INVALID_ANNOTATION,
    webhook_rules.INVALID_REQUEST,
    webhook_rules.QUOTA_EXCEEDED,
    webhook_rules.INVALID_POD,
)

# Resolve 0.5 ms (a filter answered from the read model) .. 2 s (a filter that waited for
# accounting), under kube-scheduler's default 5 s extender timeout.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.filter_duration = Histogram(
            "numafit_scheduler_filter_duration_seconds",
            "Extender /filter handling time, from request to answer (reserve included).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.filter_total = Counter(
            "numafit_scheduler_filter",
            "Extender /filter calls by result: fit (reserved on a node), no_fit (no candidate "
            "holds the pod), not_gpu (passed through), deferred (a transient refusal, answered "
            "by keeping a node and failing the bind, so that kube-scheduler backs the pod "
            "off), other_scheduler (a GPU pod of another scheduler, refused), error (Error "
            "set in the answer).",
            ["result"],
            registry=self.registry,
        )
        self.reserve_attempts = Counter(
            "numafit_scheduler_reserve_attempts",
            "Reserve commits sent to accounting, by result (ok, conflict, or the refusal code).",
            ["result"],
            registry=self.registry,
        )
        self.prioritize_total = Counter(
            "numafit_scheduler_prioritize",
            "Extender /prioritize calls by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.bind_total = Counter(
            "numafit_scheduler_bind",
            "Extender /bind calls by result (ok, or the step that failed).",
            ["result"],
            registry=self.registry,
        )
        self.bind_duration = Histogram(
            "numafit_scheduler_bind_duration_seconds",
            "Extender /bind handling time (bind-phase write and Binding creation).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.webhook_total = Counter(
            "numafit_scheduler_webhook",
            "Admission reviews by result (allowed, mutated, denied) and reason.",
            ["result", "reason"],
            registry=self.registry,
        )
        self.snapshots = Counter(
            "numafit_scheduler_read_model_snapshots",
            "Snapshots the read model took from accounting, by scope (all, node).",
            ["scope"],
            registry=self.registry,
        )
        self.numa_predictions = Counter(
            "numafit_scheduler_numa_predictions",
            "GPU containers placed, by how the NUMA prediction from NodeResourceTopology "
            "turned out: hit (ran on the GPUs reserved for it), miss (needed a refit, kubelet "
            "gave other GPUs, or the pod failed admission), none (nothing predicted: the node "
            "publishes no NodeResourceTopology or its policy is none).",
            ["result"],
            registry=self.registry,
        )
        self.topology_ignored = Counter(
            "numafit_scheduler_topology_ignored",
            "NodeResourceTopology objects that could not be read (their node is scheduled as "
            "without one).",
            registry=self.registry,
        )
        at_zero(self.filter_total, FILTER_RESULTS)
        at_zero(self.numa_predictions, PREDICTION_RESULTS)
        at_zero(self.reserve_attempts, RESERVE_RESULTS)
        at_zero(self.prioritize_total, ("ok", "error"))
        at_zero(self.bind_total, BIND_RESULTS)
        at_zero(self.snapshots, ("all", "node"))
        at_zero(self.webhook_total, ("allowed", "mutated"), (webhook_rules.ALLOWED,))
        at_zero(self.webhook_total, ("denied",), DENIALS)
        self.nodes = Gauge(
            "numafit_scheduler_read_model_nodes",
            "Nodes the read model knows (with or without a GPU inventory).",
            registry=self.registry,
        )
        self.topology_nodes = Gauge(
            "numafit_scheduler_topology_nodes",
            "Nodes whose NodeResourceTopology the scheduler predicts NUMA placement from.",
            registry=self.registry,
        )
