"""The device plugin's Prometheus metrics (names fixed by DESIGN.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from svc_refit.metrics import LATENCY_BUCKETS


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.refits = Counter(
            "numafit_deviceplugin_refits",
            "GetPreferredAllocation outcomes by refit mode and result (moved, already_aligned, "
            "fallback, strict_failed, timeout, unmappable, no_mismatch, not_opted_in).",
            ["mode", "result"],
            registry=self.registry,
        )
        self.misaligned = Gauge(
            "numafit_deviceplugin_misaligned_containers",
            "Containers running after a best-effort refit fallback (kubelet's own choice).",
            registry=self.registry,
        )
        self.refit_duration = Histogram(
            "numafit_deviceplugin_refit_duration_seconds",
            "Refit round trip as the plugin sees it.",
            buckets=LATENCY_BUCKETS,
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
