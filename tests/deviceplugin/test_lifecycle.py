"""The plugin's life: its loops are eternal (one ending fails readiness and stops the process
with exit 1), its metrics exist at zero from the start, and its node name is checked."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest

from shared.service import natsconn
from shared.service.health import Readiness
from shared.service.runner import ServiceFailed, serve
from shared.service.settings import CommonSettings
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import DiscoveryError, GpuInfo, SimulatedBackend
from svc_deviceplugin.metrics import PluginMetrics
from svc_deviceplugin.service import DevicePluginService
from svc_deviceplugin.settings import PluginOptions
from tests.deviceplugin.stack import DEFAULT_GPUS
from tests.integration.harness import wait_for

# --- an eternal loop that ends fails the plugin --------------------------------------------


class BrokenHealth:
    """A backend whose health watch dies: the health loop ends with an exception."""

    def __init__(self) -> None:
        self.inner = SimulatedBackend(DEFAULT_GPUS)

    def list_gpus(self) -> list[GpuInfo]:
        return self.inner.list_gpus()

    def watch_health(self) -> Any:
        raise RuntimeError("the health watch broke")

    def close(self) -> None:
        return None


async def test_a_dead_health_loop_fails_readiness(nats_url: str) -> None:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    nc = (await natsconn.connect(nats_url, "deviceplugin")).client
    readiness = Readiness("registered")
    plugin = DevicePluginService(
        nc,
        PluginOptions(PluginConfig(node="broken-node", directory=directory), BrokenHealth()),
        readiness=readiness,
    )
    try:
        await plugin.start()
        async with asyncio.timeout(5):
            await readiness.failed.wait()
        assert not readiness.ready
        assert readiness.failure is not None and "health" in readiness.failure
    finally:
        await plugin.stop(1.0)
        await nc.close()


async def test_a_dead_loop_stops_the_service_with_a_failure(nats_url: str) -> None:
    """Through the run loop every service shares: `serve` raises ServiceFailed (exit 1)."""
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    settings = CommonSettings(nats_url, None, "127.0.0.1", 0, "info", "json", 1.0)
    readiness = Readiness("registered")

    def factory(nc: Any, kube: Any, registry: Any, ready: Readiness) -> DevicePluginService:
        config = PluginConfig(node="broken-node", directory=directory)
        return DevicePluginService(nc, PluginOptions(config, BrokenHealth()), readiness=ready)

    with pytest.raises(ServiceFailed, match="background task health ended"):
        async with asyncio.timeout(15):
            await serve("numafit-deviceplugin", settings, factory, readiness, use_kube=False)


class NoHealthEvents(BrokenHealth):
    """A backend (driver) that offers no health events at all."""

    def watch_health(self) -> Any:
        raise DiscoveryError("NVML event set cannot be created: Not Supported")


async def test_no_health_events_disables_health_checks_but_keeps_serving(nats_url: str) -> None:
    """As NVIDIA's plugin: a driver without events is not a reason to crash-loop."""
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    nc = (await natsconn.connect(nats_url, "deviceplugin")).client
    readiness = Readiness("registered")
    plugin = DevicePluginService(
        nc,
        PluginOptions(PluginConfig(node="no-events-node", directory=directory), NoHealthEvents()),
        readiness=readiness,
    )
    try:
        await plugin.start()
        registry = plugin.metrics.registry

        def disabled() -> bool:
            value = registry.get_sample_value(
                "numafit_deviceplugin_xid_events_total", {"action": "watch_unavailable"}
            )
            return value == 1

        await wait_for(disabled, within=5)
        assert readiness.failure is None
        assert all(g.healthy for g in plugin.current_gpus())
    finally:
        await plugin.stop(1.0)
        await nc.close()


def test_labelled_counters_exist_at_zero_from_the_start() -> None:
    metrics = PluginMetrics()

    def value(name: str, **labels: str) -> float | None:
        sample: float | None = metrics.registry.get_sample_value(name, labels)
        return sample

    refits = {
        "none": ["no_mismatch", "not_opted_in"],
        "best-effort": [
            "moved",
            "already_aligned",
            "fallback",
            "timeout",
            "unmappable",
            "no_mismatch",
        ],
        "strict": ["moved", "already_aligned", "strict_failed", "timeout", "unmappable"],
    }
    for mode, results in refits.items():
        for result in results:
            assert value("numafit_deviceplugin_refits_total", mode=mode, result=result) == 0.0
    for result in ["ok", "unknown_device", "accounting_unavailable", "deadline_exceeded"]:
        assert value("numafit_deviceplugin_allocations_total", result=result) == 0.0
    for action in ["marked_unhealthy", "ignored"]:
        assert value("numafit_deviceplugin_xid_events_total", action=action) == 0.0
    assert value("numafit_deviceplugin_unhealthy_gpus") == 0.0


@pytest.mark.parametrize("node", ["Node_1", "node-1.", "n" * 300, "node 1"])
def test_a_node_name_that_is_not_a_kubernetes_name_is_refused(node: str) -> None:
    with pytest.raises(ValueError, match="node name"):
        PluginConfig(node=node)
