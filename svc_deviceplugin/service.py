"""svc_deviceplugin: discovery, kubelet registration, inventory to accounting, refits.

The plugin talks only to kubelet (gRPC) and NATS: the pending pod, allocations and the node's
inventory all go through accounting, so a node's credentials never include pod writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client

from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core import codec
from shared.service.health import Readiness
from shared.service.tasks import TaskSet
from svc_deviceplugin.allocator import Allocator
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.discovery import GpuBackend, GpuInfo
from svc_deviceplugin.inventory import Replica, register_devices, replicas
from svc_deviceplugin.metrics import PluginMetrics
from svc_deviceplugin.server import DevicePluginServicer, PluginServer

log = logging.getLogger("numafit.deviceplugin")


class DevicePluginService:
    def __init__(
        self,
        config: PluginConfig,
        nc: Client,
        backend: GpuBackend,
        *,
        metrics: PluginMetrics | None = None,
        readiness: Readiness | None = None,
        reconcile_interval: float = 30.0,
    ) -> None:
        self.config = config
        self.nc = nc
        self.backend = backend
        self.metrics = metrics or PluginMetrics()
        self.readiness = readiness or Readiness("registered")
        self.reconcile_interval = reconcile_interval
        self.gpus: list[GpuInfo] = backend.list_gpus()
        self.allocator = Allocator(config, nc, self.metrics, frozenset(g.uuid for g in self.gpus))
        self.servicer = DevicePluginServicer(self.allocator, self.replicas)
        self.server = PluginServer(config, self.servicer, self.metrics)
        self.accounting = AccountingClient(nc, config.accounting_timeout)
        self.inventory_registered = asyncio.Event()
        self._stop = asyncio.Event()
        self.tasks = TaskSet()

    def replicas(self) -> list[Replica]:
        return replicas(self.gpus, self.config.replicas)

    async def start(self) -> None:
        for coro, name in (
            (self.server.run(self._stop), "plugin-server"),
            (self._register_inventory(), "inventory"),
            (self._health_loop(), "health"),
            (self._reconcile_loop(), "reconcile"),
        ):
            self.tasks.spawn(coro, name)
        self.tasks.spawn(self._ready(), "ready")

    async def _ready(self) -> None:
        await self.server.registered.wait()
        self.readiness.set("registered")

    async def stop(self, grace: float) -> None:
        self.readiness.draining = True
        self._stop.set()
        await self.tasks.stop(grace)
        self.backend.close()

    async def on_reconnect(self) -> None:
        """Accounting may have restarted while we were away: register the inventory again."""
        self.inventory_registered.clear()
        self.tasks.spawn(self._register_inventory(), "inventory")

    async def _register_inventory(self) -> None:
        """Write the node's GPUs through accounting (HAMi's register annotation), retrying
        until accounting answers: the plugin serves kubelet meanwhile."""
        items = [
            codec.register_item(d)
            for d in register_devices(self.gpus, self.config.replicas, self.config.mig_mode)
        ]
        backoff = 0.2
        while not self._stop.is_set():
            try:
                reply = await self.accounting.call("register", self.config.node, {"devices": items})
            except AccountingUnavailable as exc:
                log.info("inventory not registered yet", extra={"error": str(exc)})
            else:
                if reply.get("ok"):
                    self.inventory_registered.set()
                    log.info("inventory registered", extra={"gpus": len(items)})
                    return
                log.warning("inventory refused", extra={"error": reply.get("error")})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._stop.wait()
            backoff = min(backoff * 2, 5.0)

    async def _health_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.health_interval):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                gpus = await asyncio.to_thread(self.backend.list_gpus)
            except Exception as exc:
                log.warning("health check failed", extra={"error": str(exc)})
                continue
            if [(g.uuid, g.healthy) for g in gpus] != [(g.uuid, g.healthy) for g in self.gpus]:
                self.gpus = gpus
                log.warning(
                    "GPU health changed",
                    extra={"unhealthy": [g.uuid for g in gpus if not g.healthy]},
                )
                await self.servicer.notify()
                await self._register_inventory()

    async def _reconcile_loop(self) -> None:
        """Keep the misaligned-containers gauge to pods accounting still tracks."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.reconcile_interval):
                    await self._stop.wait()
            if self._stop.is_set():
                return
            try:
                reply = await self.accounting.snapshot(self.config.node)
            except AccountingUnavailable:
                continue
            alive = {
                p["pod"]["metadata"]["uid"]
                for n in reply.get("nodes") or []
                for p in n.get("pods") or []
            }
            self.allocator.forget_pods(alive)
