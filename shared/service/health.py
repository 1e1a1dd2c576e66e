"""/healthz, /readyz and /metrics on one small aiohttp server per service.

Liveness never depends on NATS or the API server (a shared outage must not restart every pod);
readiness does: a service is ready once each named condition (ledger rebuilt, subscriptions
flushed, ...) is set.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


class Readiness:
    """Named conditions that must all hold before /readyz answers 200."""

    def __init__(self, *conditions: str) -> None:
        self._state = dict.fromkeys(conditions, False)
        self.draining = False

    def set(self, condition: str, value: bool = True) -> None:
        self._state[condition] = value

    @property
    def ready(self) -> bool:
        return not self.draining and all(self._state.values())

    def missing(self) -> list[str]:
        missing = [name for name, ok in self._state.items() if not ok]
        return ["draining", *missing] if self.draining else missing


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
