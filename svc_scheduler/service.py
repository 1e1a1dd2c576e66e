"""svc_scheduler: the kube-scheduler extender and the admission webhook, over HTTP(S).

Start: subscribe to accounting's usage updates and take the first snapshot (readiness waits
for it: a filter before it would refuse every node), follow NodeResourceTopology objects (the
NUMA predictions) and Nodes (kubelet versions), neither waited for, then listen. Stop
(SIGTERM): readiness fails, the listener closes, in-flight requests finish within the grace
period, then the Events they record; the first sync and the snapshot fetches are cancelled.
One supervisor owns all of it: its requests (counted), the read model's tasks and the Events.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from shared.accounting_client import AccountingClient
from shared.service.health import Readiness
from shared.service.supervisor import Supervisor
from shared.service.wiring import ServiceSpec
from svc_scheduler.extender import Extender
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.node_watch import NodeKubelets, NodeWatch
from svc_scheduler.read_model import ReadModel
from svc_scheduler.server import SchedulerHttp
from svc_scheduler.settings import SchedulerOptions as SchedulerOptions  # re-exported
from svc_scheduler.topology import TopologyState
from svc_scheduler.topology_watch import TopologyWatch
from svc_scheduler.webhook import PodWebhook, kube_quota_source, parse_scheduler_names

if TYPE_CHECKING:
    from nats.aio.client import Client
    from prometheus_client import CollectorRegistry

    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.scheduler")

NAME = "numafit-scheduler"
READ_MODEL = "read-model"
HTTP = "http"
CONDITIONS = (READ_MODEL, HTTP)


def spec(options: SchedulerOptions | None = None) -> ServiceSpec[SchedulerService]:
    """How every caller (`numafit run`, simulate, bench, the test harnesses) builds it."""
    chosen = options if options is not None else SchedulerOptions()

    def build(
        nc: Client, kube: Kube | None, registry: CollectorRegistry, readiness: Readiness
    ) -> SchedulerService:
        return SchedulerService(
            nc, kube, chosen, metrics=SchedulerMetrics(registry), readiness=readiness
        )

    return ServiceSpec(NAME, CONDITIONS, build)


class SchedulerService:
    def __init__(
        self,
        nc: Client,
        kube: Kube | None,
        options: SchedulerOptions,
        *,
        metrics: SchedulerMetrics | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.options = options
        """Everything it is configured with (svc_scheduler/settings.py)."""
        self.config = options.config
        self.scheduler_names = parse_scheduler_names(options.scheduler_names)
        self.metrics = metrics or SchedulerMetrics()
        self.readiness = readiness or Readiness(*CONDITIONS)
        self.supervisor = Supervisor("scheduler", on_fatal=self.readiness.fail)
        self.accounting = AccountingClient(nc)
        self.read_model = ReadModel(
            nc,
            self.accounting,
            self.metrics,
            on_ready=lambda: self.readiness.set(READ_MODEL),
            supervisor=self.supervisor,
        )
        self.topology = TopologyWatch(kube, TopologyState(), self.metrics, self.supervisor)
        """NodeResourceTopology, followed for the extender's NUMA predictions (not a readiness
        condition: a node without it is scheduled as without the feature)."""
        self.nodes = NodeWatch(kube, NodeKubelets(), self.supervisor)
        """Nodes' kubelet versions, for what kubelet itself would reject (not a readiness
        condition: a node not seen yet is scheduled as before)."""
        self.extender = Extender(
            self.read_model,
            self.accounting,
            kube,
            config=self.config,
            metrics=self.metrics,
            request_timeout=options.request_timeout,
            supervisor=self.supervisor,
            topology=self.topology.state,
            scheduler_names=self.scheduler_names,
            kubelets=self.nodes.state,
        )
        self.admission = PodWebhook(
            config=self.config,
            scheduler_names=self.scheduler_names,
            quota_source=kube_quota_source(kube, self.config) if kube is not None else None,
            metrics=self.metrics,
        )
        self.http = SchedulerHttp(
            self.extender,
            self.admission,
            readiness=self.readiness,
            metrics=self.metrics,
            host=options.host,
            port=options.port,
            ssl_context=options.ssl_context,
            supervisor=self.supervisor,
        )

    @property
    def url(self) -> str:
        return self.http.url

    async def start(self) -> None:
        await self.supervisor.start()
        await self.read_model.start()
        self.topology.start()
        self.nodes.start()
        await self.http.start()
        self.readiness.set(HTTP)

    async def stop(self, grace: float) -> None:
        """One grace period: the listener's requests, then what the supervisor still runs."""
        self.readiness.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await self.http.stop(grace)
        await self.supervisor.stop(max(deadline - loop.time(), 0.0))
        await self.read_model.stop()

    async def on_reconnect(self) -> None:
        await self.read_model.on_reconnect()
