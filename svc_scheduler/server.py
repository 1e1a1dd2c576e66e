"""The HTTP(S) listener kube-scheduler and the API server call.

Routes (all POST, JSON): `/filter`, `/prioritize`, `/bind` (extender verbs; the Go field names
as keys), `/webhook` (mutating AdmissionReview) and `/validate` (validating AdmissionReview).
Probes and metrics are not here but on the common health server (`--metrics-port`), like every
numafit service, so a scrape or probe never queues behind scheduling requests.

Contracts for bad input: a body that is not a JSON object of the verb's shape is answered 400
with `{"Error": ...}` (kube-scheduler counts any non-200 as a failed call; the API server a
failed webhook call); a well-formed request whose Pod cannot be read is answered 200 with
`Error` set, as kube-scheduler expects. Nothing a caller sends crashes the service: an
unexpected exception is logged and answered 500. While draining, new requests get 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from shared.service.supervisor import Supervisor
from svc_scheduler.extender import ERROR, Extender
from svc_scheduler.extender_wire import (
    BadInput,
    binding_result,
    encode,
    error_filter_result,
    parse_binding_args,
    parse_extender_args,
)
from svc_scheduler.webhook import PodWebhook, parse_review, review_response

if TYPE_CHECKING:
    from shared.service.health import Readiness
    from svc_scheduler.metrics import SchedulerMetrics

log = logging.getLogger("numafit.scheduler")

MAX_BODY = 64 << 20
"""Non-cache-mode filter requests carry every candidate Node object: thousands of nodes."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type="application/json")


class SchedulerHttp:
    def __init__(
        self,
        extender: Extender,
        admission: PodWebhook,
        *,
        readiness: Readiness,
        metrics: SchedulerMetrics,
        host: str = "0.0.0.0",
        port: int = 8888,
        ssl_context: ssl.SSLContext | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.extender = extender
        self.admission = admission
        self.readiness = readiness
        self.metrics = metrics
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.supervisor = supervisor if supervisor is not None else Supervisor("scheduler-http")
        """Counts the requests in flight (aiohttp runs each in its own task)."""
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._guard])
        app.router.add_post("/filter", self._filter)
        app.router.add_post("/prioritize", self._prioritize)
        app.router.add_post("/bind", self._bind)
        app.router.add_post("/webhook", self._mutate)
        app.router.add_post("/validate", self._validate)
        return app

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{scheme}://{host}:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        await self._site.start()
        server = self._site._server
        sockets = (getattr(server, "sockets", None) or []) if server is not None else []
        if self.port == 0 and sockets:
            self.port = sockets[0].getsockname()[1]
        # The address really listened on (0.0.0.0 in a container), not `url`, which names the
        # loopback address a client on this host would use.
        bound = sockets[0].getsockname()[0] if sockets else self.host
        scheme = "https" if self.ssl_context is not None else "http"
        host = f"[{bound}]" if ":" in bound else bound
        log.info("extender listening", extra={"url": f"{scheme}://{host}:{self.port}"})

    async def stop(self, grace: float) -> None:
        """Stop accepting connections, let in-flight requests finish within `grace`."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self.supervisor.wait_idle()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- plumbing ---------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.readiness.draining:
            return json_response({"Error": "numafit scheduler is shutting down"}, 503)
        with self.supervisor.track():
            try:
                return await handler(request)
            except BadInput as exc:
                return json_response({"Error": str(exc)}, 400)
            except web.HTTPException:
                raise
            except Exception:
                log.exception("request failed", extra={"path": request.path})
                return json_response({"Error": "numafit scheduler internal error"}, 500)

    # --- extender ---------------------------------------------------------------------------

    async def _filter(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        result = ERROR
        try:
            try:
                args = parse_extender_args(await request.read())
            except BadInput as exc:
                return json_response(error_filter_result(None, str(exc)), 400)
            answer, result = await self.extender.filter(args)
            return json_response(answer)
        finally:
            self.metrics.filter_total.labels(result).inc()
            self.metrics.filter_duration.observe(time.perf_counter() - started)

    async def _prioritize(self, request: web.Request) -> web.StreamResponse:
        try:
            args = parse_extender_args(await request.read())
        except BadInput:
            self.metrics.prioritize_total.labels("error").inc()
            raise
        answer = await self.extender.prioritize(args)
        self.metrics.prioritize_total.labels("ok").inc()
        return json_response(answer)

    async def _bind(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        result = "invalid_request"
        try:
            try:
                args = parse_binding_args(await request.read())
            except BadInput as exc:
                return json_response(binding_result(str(exc)), 400)
            answer, result = await self.extender.bind(args)
            return json_response(answer)
        finally:
            self.metrics.bind_total.labels(result).inc()
            self.metrics.bind_duration.observe(time.perf_counter() - started)

    # --- admission --------------------------------------------------------------------------

    async def _mutate(self, request: web.Request) -> web.StreamResponse:
        return await self._review(request, mutate=True)

    async def _validate(self, request: web.Request) -> web.StreamResponse:
        return await self._review(request, mutate=False)

    async def _review(self, request: web.Request, *, mutate: bool) -> web.StreamResponse:
        review = parse_review(await request.read())  # BadInput: answered 400
        decision = await self.admission.decide(review.operation, review.namespace, review.object)
        return json_response(review_response(review, decision, mutate=mutate))


def tls_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM files; None (plain HTTP) when neither is given."""
    if not cert_file and not key_file:
        return None
    if not cert_file or not key_file:
        raise ValueError("--tls-cert-file and --tls-key-file must be given together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
