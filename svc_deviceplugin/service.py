"""svc_deviceplugin: discovery, kubelet registration, inventory to accounting, refits, health.

The plugin talks only to kubelet (gRPC) and NATS: the pending pod, allocations and the node's
inventory all go through accounting, so a node's credentials never include pod writes.

Its loops (the plugin server with its kubelet re-registration watch, the inventory writer, the
GPU health watch, the reconcile loop, the replay of the consume journal) are eternal tasks of
the plugin's one supervisor: if one ever ends while the plugin is not stopping, readiness fails
for good and the process exits 1 for Kubernetes to restart it.

GPU health: the backend's health watch (NVML XID events, or injected ones on simulated GPUs)
is read in a worker thread. An XID other than the application ones marks its GPU unhealthy for
the plugin's lifetime (as NVIDIA's plugin does; an XID that needs a reset does not heal): its
replicas are sent `Unhealthy` in a new ListAndWatch message, and the register annotation
(written through accounting) carries `health: false` for it, so the scheduler stops placing
there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from shared import messages
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.service.backoff import Backoff
from shared.service.health import Readiness
from shared.service.supervisor import Supervisor
from shared.service.wiring import ServiceSpec
from shared.subjects import shown
from svc_deviceplugin.allocator import Allocator
from svc_deviceplugin.discovery import (
    DiscoveryError,
    GpuInfo,
    HealthEvent,
    HealthWatch,
)
from svc_deviceplugin.inventory import Replica, register_devices, replicas
from svc_deviceplugin.metrics import PluginMetrics
from svc_deviceplugin.server import DevicePluginServicer, PluginServer
from svc_deviceplugin.settings import PluginOptions as PluginOptions  # noqa: TC001 (re-exported)

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.aio.client import Client
    from prometheus_client import CollectorRegistry

    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.deviceplugin")

T = TypeVar("T")

NAME = "numafit-deviceplugin"
CONDITIONS = ("registered",)


def spec(options: PluginOptions) -> ServiceSpec[DevicePluginService]:
    """How every caller (`numafit run`, simulate, the test stacks) builds it. The plugin talks
    only to kubelet and NATS: no Kubernetes client."""

    def build(
        nc: Client, kube: Kube | None, registry: CollectorRegistry, readiness: Readiness
    ) -> DevicePluginService:
        return DevicePluginService(
            nc, options, metrics=PluginMetrics(registry), readiness=readiness
        )

    return ServiceSpec(NAME, CONDITIONS, build, use_kube=False)


class DevicePluginService:
    def __init__(
        self,
        nc: Client,
        options: PluginOptions,
        *,
        metrics: PluginMetrics | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.options = options
        """Everything it is configured with (svc_deviceplugin/settings.py)."""
        self.config = options.config
        self.nc = nc
        self.backend = options.backend
        self.metrics = metrics or PluginMetrics()
        self.readiness = readiness or Readiness(*CONDITIONS)
        self.reconcile_interval = options.reconcile_interval
        self.supervisor = Supervisor("deviceplugin", on_fatal=self.readiness.fail)
        self.gpus: list[GpuInfo] = self.backend.list_gpus()
        self.unhealthy: dict[str, str] = {}
        """GPUs marked unhealthy by a health event: uuid -> what was seen."""
        self.allocator = Allocator(
            self.config, nc, self.metrics, frozenset(g.uuid for g in self.gpus), self.supervisor
        )
        self.servicer = DevicePluginServicer(self.allocator, self.replicas)
        self.server = PluginServer(self.config, self.servicer, self.metrics)
        self.accounting = AccountingClient(nc, self.config.accounting_timeout)
        self.inventory_registered = asyncio.Event()
        """Set once accounting has the current inventory (cleared while a change is unsent)."""
        self.health_watched = asyncio.Event()
        """Set once the health watch is open: events from then on are seen."""
        self._inventory_changed = asyncio.Event()
        self._inventory_changed.set()
        self._stop = asyncio.Event()
        self.metrics.unhealthy_gpus.set(sum(1 for g in self.gpus if not g.healthy))

    def current_gpus(self) -> list[GpuInfo]:
        """The GPUs with their health as the plugin reports it now."""
        return [replace(g, healthy=False) if g.uuid in self.unhealthy else g for g in self.gpus]

    def replicas(self) -> list[Replica]:
        return replicas(self.current_gpus(), self.config.replicas)

    async def start(self) -> None:
        # Before kubelet can call: consumptions an earlier run answered kubelet for and
        # accounting never acknowledged are sent again first, and GetPreferredAllocation
        # knows their entries are no longer to be admitted.
        self.allocator.deferred.load()
        await self.supervisor.start()
        for coro, name in (
            (self.server.run(self._stop), "plugin-server"),
            (self.allocator.deferred.run(self._stop), "consume-journal"),
            (self._inventory_loop(), "inventory"),
            (self._health_loop(), "health"),
            (self._reconcile_loop(), "reconcile"),
        ):
            self.supervisor.spawn(coro, name, eternal=True)
        self.supervisor.spawn(self._ready(), "ready", drain=False)

    async def _ready(self) -> None:
        await self.server.registered.wait()
        self.readiness.set("registered")

    async def stop(self, grace: float) -> None:
        self.readiness.draining = True
        self._stop.set()
        await self.supervisor.stop(grace)
        self.backend.close()

    async def on_reconnect(self) -> None:
        """Accounting may have restarted while we were away: register the inventory again,
        and send journalled consumptions now rather than after the retry delay."""
        self.inventory_registered.clear()
        self._inventory_changed.set()
        self.allocator.deferred.kick()

    # --- inventory --------------------------------------------------------------------------

    async def _inventory_loop(self) -> None:
        """Write the node's GPUs through accounting (HAMi's register annotation) whenever they
        change, retrying until accounting takes them: the plugin serves kubelet meanwhile.
        One writer, and each attempt sends the current state, so the newest always wins."""
        backoff = Backoff()
        while not self._stop.is_set():
            await self._inventory_changed.wait()
            self._inventory_changed.clear()
            gpus = self.current_gpus()
            items = messages.register_items(
                register_devices(gpus, self.config.replicas, self.config.mig_mode)
            )
            if await self._register(items):
                backoff.reset()
                if not self._inventory_changed.is_set():
                    self.inventory_registered.set()
                log.info(
                    "inventory registered",
                    extra={
                        "gpus": len(items),
                        "unhealthy": [g.uuid for g in gpus if not g.healthy],
                    },
                )
                continue
            self._inventory_changed.set()
            await backoff.wait(self._stop)

    async def _register(self, items: tuple[messages.RegisterItem, ...]) -> bool:
        request = messages.RegisterRequest(devices=items, node=self.config.node)
        try:
            reply = await self.accounting.ask(request, messages.RegisterReply)
        except AccountingUnavailable as exc:
            log.info("inventory not registered yet", extra={"error": shown(str(exc), 200)})
            return False
        if reply.ok:
            return True
        log.warning(
            "inventory refused",
            extra={"code": shown(reply.code), "error": shown(reply.error or "", 200)},
        )
        return False

    # --- health -----------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        """Read the backend's health events, one short wait at a time in a worker thread."""
        try:
            watch = await _in_thread(self.backend.watch_health, cleanup=_close_watch)
        except DiscoveryError as exc:
            # As NVIDIA's plugin does: without health events the GPUs stay as discovered and
            # the plugin keeps serving (a crash loop would take the node's GPUs away).
            log.warning(
                "GPU health events unavailable; health checks disabled",
                extra={"error": str(exc)[:300]},
            )
            self.metrics.xid_events.labels("watch_unavailable").inc()
            await self._stop.wait()
            return
        self.health_watched.set()
        try:
            while not self._stop.is_set():
                event = await _in_thread(lambda: watch.wait(self.config.health_wait_ms))
                if event is not None:
                    await self._on_health_event(event)
        finally:
            await asyncio.to_thread(watch.close)

    async def _on_health_event(self, event: HealthEvent) -> None:
        fields = {"uuid": shown(event.uuid or "*"), "xid": event.xid, "reason": event.reason}
        if not event.critical:
            self.metrics.xid_events.labels("ignored").inc()
            log.info("application XID: the GPU stays healthy", extra=fields)
            return
        known = [g.uuid for g in self.gpus]
        if event.uuid is not None and event.uuid not in known:
            self.metrics.xid_events.labels("unknown_gpu").inc()
            log.warning("health event for a GPU this plugin does not serve", extra=fields)
            return
        already = {g.uuid for g in self.current_gpus() if not g.healthy}
        targets = known if event.uuid is None else [event.uuid]
        newly = [uuid for uuid in targets if uuid not in already]
        if not newly:
            self.metrics.xid_events.labels("already_unhealthy").inc()
            log.info("health event for a GPU already unhealthy", extra=fields)
            return
        for uuid in newly:
            self.unhealthy[uuid] = event.reason
        self.metrics.xid_events.labels("marked_unhealthy").inc()
        self.metrics.unhealthy_gpus.set(len(already) + len(newly))
        log.error(
            "GPU unhealthy: its replicas are withdrawn from kubelet and the scheduler",
            extra={**fields, "gpus": newly},
        )
        await self.servicer.notify()
        self.inventory_registered.clear()
        self._inventory_changed.set()

    # --- reconcile --------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        """Keep the fallback-containers gauge to pods accounting still tracks."""
        while not self._stop.is_set():
            await _wait(self._stop, self.reconcile_interval)
            if self._stop.is_set():
                return
            request = messages.SnapshotRequest(node=self.config.node)
            try:
                reply = await self.accounting.ask(request, messages.SnapshotReply)
            except AccountingUnavailable as exc:
                if isinstance(exc.__cause__, messages.MessageError):
                    log.warning("unusable snapshot", extra={"error": shown(str(exc), 200)})
                continue
            if not reply.ok:
                continue  # a refusal says nothing about which pods live
            alive = {p.pod.metadata.uid for n in reply.nodes or () for p in n.pods}
            self.allocator.forget_pods(alive)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


def _close_watch(watch: HealthWatch) -> None:
    watch.close()


async def _in_thread(work: Callable[[], T], *, cleanup: Callable[[T], None] | None = None) -> T:
    """`work()` in a worker thread. If the caller is cancelled meanwhile, the thread is still
    waited for (it is bounded: NVML waits end at their timeout) before the cancellation goes
    on, so what it uses can be released safely; `cleanup` gets a result nobody will use."""
    job = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait([job])
        if cleanup is not None and not job.cancelled() and job.exception() is None:
            await asyncio.to_thread(cleanup, job.result())
        raise
