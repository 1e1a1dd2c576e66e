"""The run loop every service shares.

health server up -> NATS and Kubernetes clients -> the service built (its package's spec) ->
service.start() -> wait for SIGTERM (or a failure: the NATS connection closed for good, an
eternal task ended) -> readiness fails, service.stop(grace) finishes in-flight work -> NATS
drained (bounded) -> clients closed. The whole shutdown fits in one grace period; a failure
ends the process with exit 1. Every task the loop itself starts lives in a TaskGroup (the
API server probe in a Supervisor of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from shared.service import natsconn
from shared.service.health import HealthServer, Readiness
from shared.service.heap import HeapKeeper
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from shared.service.lifecycle import stop_on_signals
from shared.service.logs import configure_logging
from shared.service.supervisor import Supervisor
from shared.service.wiring import Factory, Service, ServiceSpec, reconnect_hook

if TYPE_CHECKING:
    from shared.service.settings import CommonSettings

__all__ = [
    "KUBE_API",
    "Factory",
    "Service",
    "ServiceFailed",
    "ServiceSpec",
    "probe_kube",
    "run",
    "serve",
    "serve_spec",
]

log = logging.getLogger("numafit")


class ServiceFailed(Exception):
    """The service stopped because it could no longer do its job (exit 1)."""


async def serve_spec(
    spec: ServiceSpec[Any], settings: CommonSettings, stop: asyncio.Event | None = None
) -> None:
    """Run the service `spec` describes until `stop` (SIGTERM/SIGINT when not given)."""
    await serve(spec.name, settings, spec.build, spec.readiness(), stop, use_kube=spec.use_kube)


async def serve(
    name: str,
    settings: CommonSettings,
    factory: Factory,
    readiness: Readiness,
    stop: asyncio.Event | None = None,
    *,
    use_kube: bool = True,
) -> None:
    """Run one service until `stop` is set (by SIGTERM/SIGINT when not given). `use_kube`
    False: the service gets no Kubernetes client at all (the device plugin)."""
    registry = CollectorRegistry(auto_describe=True)
    health = HealthServer(registry, readiness, settings.metrics_host, settings.metrics_port)
    await health.start()
    if stop is None:
        stop = asyncio.Event()
        stop_on_signals(stop)
    log.info("starting", extra={"service": name, "metrics_port": health.port})
    connection: natsconn.NatsConnection | None = None
    api = None
    try:
        connection = await natsconn.connect(
            settings.nats_url,
            name,
            initial_timeout=settings.nats_connect_timeout,
            inbox_prefix=settings.nats_inbox_prefix,
            on_closed=readiness.fail,
        )
        if use_kube:
            api = await api_client(settings.kubeconfig)
        kube = Kube(api, name) if api is not None else None
        made = factory(connection.client, kube, registry, readiness)
        service = await made if isinstance(made, Awaitable) else made
        hook = reconnect_hook(service)
        if hook is not None:
            connection.on_reconnect(hook)
        try:
            await _until_failed(service.start(), readiness)
            async with Supervisor(f"{name}-runner", on_fatal=readiness.fail) as tasks:
                # The probe is the loop's own eternal task: should it ever end, the service
                # fails. The heap keeper freezes the state start-up built, once it is ready.
                if api is not None:
                    tasks.spawn(probe_kube(api, readiness), "kube-api-probe", eternal=True)
                keeper = HeapKeeper(asyncio.get_running_loop())
                tasks.spawn(keeper.run(readiness), "heap-keeper")
                await _first(stop.wait(), readiness.failed.wait())
        finally:
            await _stop(service, name, settings.grace_seconds, readiness)
    finally:
        if connection is not None:
            await connection.close()
        if api is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await api.close()
        await health.stop()
        log.info("stopped", extra={"service": name})
    if readiness.failure is not None:
        raise ServiceFailed(readiness.failure)


async def _stop(service: Service, name: str, grace: float, readiness: Readiness) -> None:
    """One grace period for the whole stop (a start-up cut short is stopped the same way):
    what the service does not finish in time is cancelled, and the NATS drain and client
    close after it are bounded on their own."""
    readiness.draining = True
    log.info("draining", extra={"service": name, "grace_seconds": grace})
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(grace):
            await service.stop(grace * 0.9)


KUBE_API = "kube-api"
"""The readiness condition of every service with a Kubernetes client."""
KUBE_PROBE_PERIOD = 5.0
KUBE_PROBE_TIMEOUT = 2.0


async def probe_kube(
    api: client.ApiClient, readiness: Readiness, period: float = KUBE_PROBE_PERIOD
) -> None:
    """Keep `kube-api` readiness in step with whether the API server answers `/version`.

    Accounting cannot rebuild or write while the API server is unreachable, so the refit and
    the scheduler (webhook and extender) could not do their job either: all three say so
    together, from the same probe. Liveness is unaffected (an API outage must not restart
    every pod).
    """
    versions = client.VersionApi(api)
    reachable: bool | None = None
    while True:
        try:
            async with asyncio.timeout(KUBE_PROBE_TIMEOUT):
                await versions.get_code()
            ok = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure to answer means: unreachable for us
            ok = False
            error = str(exc)[:200] or type(exc).__name__
        if ok != reachable:
            readiness.set(KUBE_API, ok)
            if ok:
                log.info("kubernetes api reachable")
            else:
                log.warning("kubernetes api unreachable; not ready", extra={"error": error})
            reachable = ok
        await asyncio.sleep(period)


async def _first(*waits: Coroutine[Any, Any, object]) -> None:
    """Return when the first of `waits` finishes; cancel the others."""
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(w) for w in waits]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()


async def _until_failed(work: Coroutine[Any, Any, None], readiness: Readiness) -> None:
    """Run `work` (start-up), abandoning it when the service fails meanwhile. An exception of
    `work` is raised as it is (not inside an ExceptionGroup): it is what `run` reports."""
    errors: list[Exception] = []

    async def starting() -> None:
        try:
            await work
        except Exception as exc:
            errors.append(exc)

    async with asyncio.TaskGroup() as group:
        task = group.create_task(starting(), name="start-up")
        failed = group.create_task(readiness.failed.wait(), name="start-up-watch")
        await asyncio.wait([task, failed], return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        task.cancel()
    if errors:
        raise errors[0]
    if task.cancelled():
        raise ServiceFailed(readiness.failure or "start-up cancelled")


def run(coro: Awaitable[None], log_level: str, log_format: str) -> int:
    configure_logging(log_level, log_format)
    try:
        asyncio.run(_main(coro))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        log.error(
            "service failed", extra={"error": str(exc)}, exc_info=log.isEnabledFor(logging.DEBUG)
        )
        return 1
    return 0


async def _main(coro: Awaitable[None]) -> None:
    await coro
