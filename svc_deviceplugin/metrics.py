"""The device plugin's Prometheus metrics (names fixed: docs/reference/metrics.md).

Every labelled series the plugin can produce is created at zero when the metrics are built,
so dashboards and alerts (`rate()`, `increase()`) see a series from the first scrape, and label
values never come from outside input: anything not listed here is counted as `other`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics_buckets import REFIT_LATENCY_BUCKETS
from shared.service.counters import at_zero

if TYPE_CHECKING:
    from shared.codes import Code

REFIT_RESULTS: dict[str, tuple[str, ...]] = {
    "none": ("no_mismatch", "not_opted_in"),
    "best-effort": (
        "moved",
        "already_aligned",
        "fallback",
        "fallback_refused",
        "timeout",
        "unmappable",
        "no_mismatch",
    ),
    "strict": (
        "moved",
        "already_aligned",
        "fallback_refused",
        "strict_failed",
        "timeout",
        "unmappable",
        "no_mismatch",
    ),
}
"""`numafit_deviceplugin_refits_total{mode, result}`: the results each mode can have."""

ALLOCATION_RESULTS = (
    "ok",
    "unknown_device",
    "accounting_unavailable",
    "deadline_exceeded",
    "conflict",
    "nothing_pending",
    "invalid_request",
    "pod_not_tracked",
    "node_mismatch",
    "api_error",
    "unusable_reply",
    "other",
)
"""`numafit_deviceplugin_allocations_total{result}`: ok, or why the Allocate failed (an
accounting refusal code, or `other` for a code this plugin does not know)."""

DEFER_REASONS = ("accounting_unavailable", "node_unavailable", "deadline_exceeded")
"""`numafit_deviceplugin_consume_deferred_total{reason}`: why an Allocate's consume was left
to the journal (no answer in time, a takeover under way, accounting out of budget)."""
REPLAY_RESULTS = ("recorded", "retry", "dropped")
JOURNAL_ERRORS = ("write_failed", "full", "unreadable")

PREFERENCES = ("reservation", "refit", "fallback", "distinct", "none")
"""`numafit_deviceplugin_preferences_total{source}`: what a container's GetPreferredAllocation
answer came from (the reservation, a refit's move, the fallback rule on accounting's usage,
distinct GPUs unjudged, or nothing)."""
REUSE_RESULTS = ("same", "moved", "unmoved")
"""`numafit_deviceplugin_init_reuses_total{result}`: an Allocate naming replicas kubelet took
over from the pod's init container, by what became of the container's reservation."""

CALL_METHODS = ("GetPreferredAllocation", "Allocate")
XID_ACTIONS = (
    "marked_unhealthy",
    "already_unhealthy",
    "ignored",
    "unknown_gpu",
    "watch_unavailable",
)


def allocation_result(code: Code | None) -> str:
    """The `result` label for an accounting reply code (bounded to the known values; None,
    a code this build does not know, is `other`)."""
    return code.value if code is not None and code.value in ALLOCATION_RESULTS else "other"


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.refits = Counter(
            "numafit_deviceplugin_refits",
            "GetPreferredAllocation outcomes by refit mode and result (moved, already_aligned, "
            "fallback, fallback_refused, strict_failed, timeout, unmappable, no_mismatch, "
            "not_opted_in).",
            ["mode", "result"],
            registry=self.registry,
        )
        self.fallback_containers = Gauge(
            "numafit_deviceplugin_fallback_containers",
            "Containers running on kubelet's own choice of GPUs after a best-effort refit was "
            "refused or unanswered (no responders, transport error, timeout); accounting "
            "follows what runs.",
            registry=self.registry,
        )
        self.misaligned = Gauge(
            "numafit_deviceplugin_misaligned_containers",
            "Deprecated: same as numafit_deviceplugin_fallback_containers. It counts best-effort "
            "fallbacks, not NUMA misalignment, which a device plugin cannot see (kubelet never "
            "tells it where a container's CPUs are).",
            registry=self.registry,
        )
        self.refit_duration = Histogram(
            "numafit_deviceplugin_refit_duration_seconds",
            "Refit round trip as the plugin sees it.",
            buckets=REFIT_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.allocations = Counter(
            "numafit_deviceplugin_allocations",
            "Allocate calls by result (ok or the error class).",
            ["result"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "numafit_deviceplugin_registrations",
            "Successful registrations with kubelet (more than one means kubelet restarted).",
            registry=self.registry,
        )
        self.call_duration = Histogram(
            "numafit_deviceplugin_kubelet_call_duration_seconds",
            "Wall time of kubelet's calls into the plugin, every hop included (bounded by "
            "--refit-timeout-ms plus a small margin).",
            ["method"],
            buckets=REFIT_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.deadline_exceeded = Counter(
            "numafit_deviceplugin_call_deadline_exceeded",
            "kubelet calls cut short by their deadline (a hop did not end in time).",
            ["method"],
            registry=self.registry,
        )
        self.xid_events = Counter(
            "numafit_deviceplugin_xid_events",
            "GPU health events by what the plugin did: marked_unhealthy, already_unhealthy, "
            "ignored (an application XID: 13, 31, 43, 45, 68, 109), unknown_gpu, watch_unavailable "
            "(the backend offers no health events: health checks disabled).",
            ["action"],
            registry=self.registry,
        )
        self.unhealthy_gpus = Gauge(
            "numafit_deviceplugin_unhealthy_gpus",
            "GPUs of this node reported Unhealthy to kubelet and health false to the scheduler.",
            registry=self.registry,
        )
        self.consume_deferred = Counter(
            "numafit_deviceplugin_consume_deferred",
            "Allocate calls answered from the pending entry GetPreferredAllocation fetched "
            "because accounting did not record the consumption in time (reason: "
            "accounting_unavailable, node_unavailable, deadline_exceeded); the consumption is "
            "journalled and sent again until accounting acknowledges it. Also counted in "
            'numafit_deviceplugin_allocations_total{result="ok"}.',
            ["reason"],
            registry=self.registry,
        )
        self.journal_entries = Gauge(
            "numafit_deviceplugin_consume_journal_entries",
            "Consumptions kubelet was answered for that accounting has not acknowledged yet "
            "(each keeps the node's allocation lock held until it is recorded).",
            registry=self.registry,
        )
        self.consume_replays = Counter(
            "numafit_deviceplugin_consume_replays",
            "Journalled consumptions sent again, by result: recorded (accounting acknowledged "
            "it), retry (no answer or a passing refusal), dropped (refused for good: the pod "
            "is gone or the entry does not match).",
            ["result"],
            registry=self.registry,
        )
        self.journal_errors = Counter(
            "numafit_deviceplugin_consume_journal_errors",
            "Journal problems: write_failed (the file could not be written; the record is "
            "kept in memory), full (no room: the Allocate failed), unreadable (the file an "
            "earlier run left was set aside at start).",
            ["kind"],
            registry=self.registry,
        )
        self.preferences = Counter(
            "numafit_deviceplugin_preferences",
            "GetPreferredAllocation container answers by what they came from: reservation, "
            "refit, fallback (the pod's own fit on the offered GPUs, on accounting's usage), "
            "distinct (distinct GPUs, not judged: no usage at hand), none.",
            ["source"],
            registry=self.registry,
        )
        self.init_reuses = Counter(
            "numafit_deviceplugin_init_reuses",
            "Allocate calls (no GetPreferredAllocation before them) naming replicas kubelet took "
            "over from the pod's init container, by result: same (reserved there already), "
            "moved (a refit moved the reservation there first), unmoved (it could not move: "
            "accounting records what runs).",
            ["result"],
            registry=self.registry,
        )
        at_zero(self.preferences, PREFERENCES)
        at_zero(self.init_reuses, REUSE_RESULTS)
        for mode, results in REFIT_RESULTS.items():
            at_zero(self.refits, (mode,), results)
        at_zero(self.allocations, ALLOCATION_RESULTS)
        at_zero(self.call_duration, CALL_METHODS)
        at_zero(self.deadline_exceeded, CALL_METHODS)
        at_zero(self.xid_events, XID_ACTIONS)
        at_zero(self.consume_deferred, DEFER_REASONS)
        at_zero(self.consume_replays, REPLAY_RESULTS)
        at_zero(self.journal_errors, JOURNAL_ERRORS)

    def set_fallback_containers(self, count: int) -> None:
        """The fallback gauge and its deprecated alias, always the same value."""
        self.fallback_containers.set(count)
        self.misaligned.set(count)
