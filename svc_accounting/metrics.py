"""Accounting's Prometheus metrics (names fixed by DESIGN.md), on the service's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from svc_accounting.ledger import NodeLedger


class AccountingMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.commits = Counter(
            "numafit_accounting_commits",
            "Accounting operations by operation and result (ok or the refusal code).",
            ["op", "result"],
            registry=self.registry,
        )
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

    def node(self, node: NodeLedger) -> None:
        self.revision.labels(node.name).set(node.revision)
        snapshot = node.snapshot
        if snapshot is None:
            return
        for device in snapshot.devices:
            self.memory.labels(node.name, device.info.id).set(device.usedmem)
            self.cores.labels(node.name, device.info.id).set(device.usedcores)
            self.slots.labels(node.name, device.info.id).set(device.used)
