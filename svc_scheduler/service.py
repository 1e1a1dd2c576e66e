"""svc_scheduler: the kube-scheduler extender and the admission webhook, over HTTP(S).

Start: subscribe to accounting's usage updates and take the first snapshot (readiness waits
for it: a filter before it would refuse every node), then listen. Stop (SIGTERM): readiness
fails, the listener closes, in-flight requests finish within the grace period.
"""

from __future__ import annotations

import logging
import ssl

from nats.aio.client import Client

from shared.accounting_client import AccountingClient
from shared.core.config import CoreConfig
from shared.service.health import Readiness
from shared.service.kube_io import Kube
from svc_scheduler.extender import DEFAULT_REQUEST_TIMEOUT, Extender
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.read_model import ReadModel
from svc_scheduler.server import SchedulerHttp
from svc_scheduler.webhook import DEFAULT_SCHEDULER_NAME, PodAdmission, kube_quota_source

log = logging.getLogger("numafit.scheduler")

READ_MODEL = "read-model"
HTTP = "http"


class SchedulerService:
    def __init__(
        self,
        nc: Client,
        kube: Kube | None,
        *,
        config: CoreConfig | None = None,
        metrics: SchedulerMetrics | None = None,
        readiness: Readiness | None = None,
        scheduler_name: str = DEFAULT_SCHEDULER_NAME,
        host: str = "0.0.0.0",
        port: int = 8888,
        ssl_context: ssl.SSLContext | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> None:
        self.config = config or CoreConfig()
        self.metrics = metrics or SchedulerMetrics()
        self.readiness = readiness or Readiness(READ_MODEL, HTTP)
        self.accounting = AccountingClient(nc)
        self.read_model = ReadModel(
            nc,
            self.accounting,
            self.metrics,
            on_ready=lambda: self.readiness.set(READ_MODEL),
        )
        self.extender = Extender(
            self.read_model,
            self.accounting,
            kube,
            config=self.config,
            metrics=self.metrics,
            request_timeout=request_timeout,
        )
        self.admission = PodAdmission(
            config=self.config,
            scheduler_name=scheduler_name,
            quota_source=kube_quota_source(kube, self.config) if kube is not None else None,
            metrics=self.metrics,
        )
        self.http = SchedulerHttp(
            self.extender,
            self.admission,
            readiness=self.readiness,
            metrics=self.metrics,
            host=host,
            port=port,
            ssl_context=ssl_context,
        )

    @property
    def url(self) -> str:
        return self.http.url

    async def start(self) -> None:
        await self.read_model.start()
        await self.http.start()
        self.readiness.set(HTTP)

    async def stop(self, grace: float) -> None:
        self.readiness.draining = True
        await self.http.stop(grace)
        await self.extender.drain(grace)
        await self.read_model.stop()

    async def on_reconnect(self) -> None:
        await self.read_model.on_reconnect()
