"""/healthz, /readyz and /metrics on one small aiohttp server per service.

Liveness never depends on NATS or the API server (a shared outage must not restart every pod);
readiness does: a service is ready once each named condition (ledger rebuilt, subscriptions
flushed, ...) is set. A service that can no longer do its job at all (its NATS connection closed
for good, an eternal loop ended) calls `Readiness.fail`: readiness fails for good and the run
loop stops the process with exit 1, so Kubernetes restarts it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.exposition import choose_encoder

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("numafit")


class Readiness:
    """Named conditions that must all hold before /readyz answers 200."""

    def __init__(self, *conditions: str) -> None:
        self._state = dict.fromkeys(conditions, False)
        self.draining = False
        self.failure: str | None = None
        self._failed: asyncio.Event | None = None
        self._complete: asyncio.Event | None = None

    def fail(self, reason: str) -> None:
        """The service cannot do its job any more: not ready from now on, and the run loop
        (waiting on `failed`) stops the process with exit 1. The first reason is kept."""
        if self.failure is not None:
            return
        self.failure = reason
        log.error("service failed; stopping", extra={"reason": reason})
        self.failed.set()

    @property
    def failed(self) -> asyncio.Event:
        """Set once `fail` was called (created lazily: it binds to the running loop)."""
        if self._failed is None:
            self._failed = asyncio.Event()
            if self.failure is not None:
                self._failed.set()
        return self._failed

    @property
    def complete(self) -> asyncio.Event:
        """Set once every condition has held (at least once; created lazily like `failed`)."""
        if self._complete is None:
            self._complete = asyncio.Event()
            if all(self._state.values()):
                self._complete.set()
        return self._complete

    def set(self, condition: str, value: bool = True) -> None:
        self._state[condition] = value
        if value and self._complete is not None and all(self._state.values()):
            self._complete.set()

    @property
    def ready(self) -> bool:
        return self.failure is None and not self.draining and all(self._state.values())

    def missing(self) -> list[str]:
        missing = [name for name, ok in self._state.items() if not ok]
        if self.draining:
            missing.insert(0, "draining")
        if self.failure is not None:
            missing.insert(0, f"failed ({self.failure})")
        return missing


class HealthServer:
    def __init__(
        self, registry: CollectorRegistry, readiness: Readiness, host: str, port: int
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None:
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if self.readiness.ready:
            return web.Response(text="ready\n")
        return web.Response(
            status=503, text="not ready: " + ", ".join(self.readiness.missing()) + "\n"
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(self.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response
