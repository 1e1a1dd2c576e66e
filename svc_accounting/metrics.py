"""Accounting's Prometheus metrics (names fixed: docs/reference/metrics.md), on the service's
own registry.

Labelled counters start at zero for every label value the service can produce, so alert ratios
read 0 rather than "no data" after a restart. Per-node and per-GPU series are removed when the
node (or one of its GPUs) goes, so a cluster's churn does not leave stale series behind.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared import codes, subjects
from shared.codes import Code
from shared.service.counters import at_zero

if TYPE_CHECKING:
    from svc_accounting.leases import OwnershipChange
    from svc_accounting.ledger import NodeLedger

OWNERSHIP_CHANGES = ("acquired", "released", "lost")
WRITE_KINDS = ("patch", "binding")
TIMING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds: a request's steps take milliseconds when all is well, seconds when a node or the
API server is the bottleneck."""

INTERNAL_ERROR = "internal_error"
"""The `result` of an operation that failed inside accounting (answered `api_error`)."""
RESULTS = (*(c.value for c in Code if c in codes.ACCOUNTING), INTERNAL_ERROR)
"""Every `result` label of numafit_accounting_commits_total: `ok`, a refusal code (every code
an accounting reply carries, `shared.codes.ACCOUNTING`) or `internal_error`."""


@dataclass
class _NodeSeries:
    revision: Gauge
    drift: Counter
    devices: dict[str, tuple[Gauge, Gauge, Gauge, Gauge]] = field(default_factory=dict)
    """Memory, cores, slots and memory over-commit series per GPU."""
    last: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    """The values last set per GPU."""


class AccountingMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.commits = Counter(
            "numafit_accounting_commits",
            "Accounting operations by operation and result (ok or the refusal code).",
            ["op", "result"],
            registry=self.registry,
        )
        at_zero(self.commits, subjects.ACCOUNTING_OPS, RESULTS)
        self.memory = Gauge(
            "numafit_accounting_device_memory_reserved_mib",
            "GPU memory reserved per device, phase-aware (MiB).",
            ["node", "uuid"],
            registry=self.registry,
        )
        self.cores = Gauge(
            "numafit_accounting_device_cores_reserved",
            "GPU cores reserved per device, phase-aware (percent of one GPU).",
            ["node", "uuid"],
            registry=self.registry,
        )
        self.slots = Gauge(
            "numafit_accounting_device_slots_reserved",
            "GPU replica slots reserved per device.",
            ["node", "uuid"],
            registry=self.registry,
        )
        self.overcommitted = Gauge(
            "numafit_accounting_device_memory_overcommitted_mib",
            "GPU memory reserved above the GPU's memory, per device (MiB; 0 when it fits). "
            "Accounting follows what runs, so kubelet's choice after a best-effort refit "
            "fallback (or for a pod not opted in) can over-commit a GPU.",
            ["node", "uuid"],
            registry=self.registry,
        )
        self.revision = Gauge(
            "numafit_accounting_ledger_revision",
            "Revision of each node's ledger (grows with every change).",
            ["node"],
            registry=self.registry,
        )
        self.drift = Counter(
            "numafit_accounting_allocation_drift",
            "Allocations where kubelet gave other GPUs than reserved; the ledger followed kubelet.",
            ["node"],
            registry=self.registry,
        )
        self.tracked = Gauge(
            "numafit_accounting_tracked_pods",
            "Pods with a reservation in the ledger.",
            registry=self.registry,
        )
        self.held = Gauge(
            "numafit_accounting_held_reservations",
            "Filter reservations held in the ledger, not yet written to their pod by a bind.",
            registry=self.registry,
        )
        self.expired = Counter(
            "numafit_accounting_reservations_expired",
            "Held reservations released because no bind came within --reservation-ttl.",
            registry=self.registry,
        )
        self.partitions_total = Gauge(
            "numafit_accounting_partitions_total",
            "Partitions the nodes are spread over (0: one replica owns every node).",
            registry=self.registry,
        )
        self.partitions_owned = Gauge(
            "numafit_accounting_partitions_owned",
            "Partitions this replica serves now.",
            registry=self.registry,
        )
        self.ownership_changes = Counter(
            "numafit_accounting_ownership_changes",
            "Partition ownership changes of this replica: acquired, released (handed over) or "
            "lost (renewals failed).",
            ["change"],
            registry=self.registry,
        )
        at_zero(self.ownership_changes, OWNERSHIP_CHANGES)
        self.takeover = Histogram(
            "numafit_accounting_takeover_duration_seconds",
            "Time from taking partitions' leases to serving them (ledger brought up to date).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.unowned = Counter(
            "numafit_accounting_unowned_requests",
            "Requests refused because no replica served the node's partition (a takeover).",
            registry=self.registry,
        )
        self.replies_lost = Counter(
            "numafit_accounting_replies_lost",
            "Replies accounting could not send (the connection broke under them); what the "
            "operation did stands, and its change is published as usual.",
            registry=self.registry,
        )
        self.unknown_writes = Counter(
            "numafit_accounting_unknown_writes",
            "Writes whose answer did not come in time, by how they were settled: fenced (a "
            "guarded write of accounting's own made the late one impossible), landed, changed "
            "(the pod changed meanwhile, so it could not land), gone (the pod was deleted), "
            "superseded (a takeover found a previous owner's recorded write and the pod had "
            "moved on: it can no longer land), unknown (the partition changed hands while it "
            "was settled and the pod changed: not answered).",
            ["outcome"],
            registry=self.registry,
        )
        self.operation_seconds = Histogram(
            "numafit_accounting_operation_duration_seconds",
            "Time from a request's arrival to its answer, by operation.",
            ["op"],
            buckets=TIMING_BUCKETS,
            registry=self.registry,
        )
        self.node_wait_seconds = Histogram(
            "numafit_accounting_node_wait_duration_seconds",
            "Time a request waited for its node (one operation that may write at a time per "
            "node), by operation.",
            ["op"],
            buckets=TIMING_BUCKETS,
            registry=self.registry,
        )
        self.write_seconds = Histogram(
            "numafit_accounting_api_write_duration_seconds",
            "Time of each answered write to the API server: patch (a guarded annotation "
            "patch) or binding (a Binding carrying the reservation).",
            ["kind"],
            buckets=TIMING_BUCKETS,
            registry=self.registry,
        )
        at_zero(self.operation_seconds, subjects.ACCOUNTING_OPS)
        at_zero(self.node_wait_seconds, subjects.ACCOUNTING_OPS)
        at_zero(self.write_seconds, WRITE_KINDS)
        self.late_requests = Counter(
            "numafit_accounting_late_requests",
            "Requests refused unserved because their deadline had passed when they were "
            "served (a paused replica, a takeover, a busy node, or clocks apart).",
            registry=self.registry,
        )
        self._devices: dict[str, set[str]] = {}
        """The GPU label values set per node, so that they can be removed again."""
        self._children: dict[str, _NodeSeries] = {}
        """Each node's labelled series, looked up once."""

    def timing(self, step: str, what: str, seconds: float) -> None:
        """One step's duration (Operations.on_timing)."""
        histogram = {
            "operation": self.operation_seconds,
            "node_wait": self.node_wait_seconds,
            "write": self.write_seconds,
        }.get(step)
        if histogram is not None and (what in subjects.ACCOUNTING_OPS or what in WRITE_KINDS):
            histogram.labels(what).observe(max(seconds, 0.0))

    def ownership_change(self, change: OwnershipChange) -> None:
        self.ownership_changes.labels(change.change).inc()

    def result(self, op: str, code: Code | None) -> None:
        """Count one operation: its reply's code, or None when it failed inside accounting."""
        if op not in subjects.ACCOUNTING_OPS:
            return
        label = code.value if code is not None and code in codes.ACCOUNTING else INTERNAL_ERROR
        self.commits.labels(op, label).inc()

    def node(self, node: NodeLedger) -> None:
        """The node's revision and per-GPU usage (called on every publish: the label lookups
        are cached per node, and a GPU whose usage did not change is not touched)."""
        name = node.name
        children = self._children.get(name)
        if children is None:
            children = self._children[name] = _NodeSeries(
                self.revision.labels(name), self.drift.labels(name)
            )
        children.revision.set(node.revision)
        snapshot = node.snapshot
        seen: set[str] = set()
        if snapshot is not None:
            for device in snapshot.devices:
                uuid = device.info.id
                seen.add(uuid)
                over = max(device.usedmem - device.info.devmem, 0)
                values = (device.usedmem, device.usedcores, device.used, over)
                if children.last.get(uuid) == values:
                    continue
                series = children.devices.get(uuid)
                if series is None:
                    series = children.devices[uuid] = (
                        self.memory.labels(name, uuid),
                        self.cores.labels(name, uuid),
                        self.slots.labels(name, uuid),
                        self.overcommitted.labels(name, uuid),
                    )
                for gauge, value in zip(series, values, strict=True):
                    gauge.set(value)
                children.last[uuid] = values
        for uuid in self._devices.get(name, set()) - seen:
            self._remove_device(name, uuid)
        self._devices[name] = seen

    def node_gone(self, name: str) -> None:
        """The node left the ledger: remove every series labelled with it."""
        for uuid in self._devices.pop(name, set()):
            self._remove_device(name, uuid)
        self._children.pop(name, None)
        for metric in (self.revision, self.drift):
            with contextlib.suppress(KeyError):
                metric.remove(name)

    def _remove_device(self, node: str, uuid: str) -> None:
        children = self._children.get(node)
        if children is not None:
            children.devices.pop(uuid, None)
            children.last.pop(uuid, None)
        for gauge in (self.memory, self.cores, self.slots, self.overcommitted):
            with contextlib.suppress(KeyError):
                gauge.remove(node, uuid)
