"""svc_accounting: the single writer of reservations, serving its operations over NATS.

Start: list nodes, pods and quotas and rebuild the ledger from the annotations (readiness waits
for that), then serve `numafit.accounting.v1.<op>.<node>` and keep the ledger in step with the
API server through watches. Every change of a node is published on `numafit.usage.v1.<node>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import nats.micro
from nats.aio.client import Client
from nats.micro.request import Request
from nats.micro.service import Service

from shared import subjects
from shared.core.config import CoreConfig
from shared.core.errors import CoreError
from shared.core.pods import PodInfo, pod_from_object
from shared.core.quota import limits_from_quotas
from shared.service import kube_io
from shared.service.health import Readiness
from shared.service.inflight import InFlight
from shared.service.kube_io import Kube
from shared.service.tasks import TaskSet
from shared.wire import WireError, dumps, loads_object
from svc_accounting.ledger import Ledger, NodeLedger
from svc_accounting.metrics import AccountingMetrics
from svc_accounting.operations import Operations

log = logging.getLogger("numafit.accounting")

VERSION = "0.1.0"


class AccountingService:
    def __init__(
        self,
        nc: Client,
        kube: Kube,
        *,
        config: CoreConfig | None = None,
        metrics: AccountingMetrics | None = None,
        readiness: Readiness | None = None,
        quota_resync_seconds: float = 30.0,
        write_timeout: float = 2.0,
    ) -> None:
        self.nc = nc
        self.kube = kube
        self.config = config or CoreConfig()
        self.metrics = metrics or AccountingMetrics()
        self.readiness = readiness or Readiness("ledger", "nats")
        self.ledger = Ledger()
        self.ops = Operations(
            self.ledger, kube, write_timeout=write_timeout, on_drift=self._record_drift
        )
        self.quota_resync_seconds = quota_resync_seconds
        self._service: Service | None = None
        self.tasks = TaskSet()
        self.inflight = InFlight()

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        pods_rv, nodes_rv = await self.rebuild()
        self.readiness.set("ledger")
        self.tasks.spawn(self._watch_loop("pods", pods_rv), "watch-pods")
        self.tasks.spawn(self._watch_loop("nodes", nodes_rv), "watch-nodes")
        self.tasks.spawn(self._quota_loop(), "quota-resync")
        service = await nats.micro.add_service(
            self.nc,
            name="numafit-accounting",
            version=VERSION,
            description="numafit accounting: owner of every GPU reservation",
        )
        group = service.add_group(
            name=subjects.ACCOUNTING_PREFIX, queue_group=subjects.ACCOUNTING_QUEUE
        )
        for op in subjects.ACCOUNTING_OPS:
            await group.add_endpoint(name=op, subject=f"{op}.*", handler=self._handler(op))
        await self.nc.flush()
        self._service = service
        self.readiness.set("nats")
        await self.publish(self.ledger.nodes.values())
        log.info(
            "accounting ready",
            extra={
                "epoch": self.ledger.epoch,
                "nodes": len(self.ledger.nodes),
                "pods": len(self.ledger.pod_node),
            },
        )

    async def stop(self, grace: float) -> None:
        """Stop taking requests, finish in-flight ones within `grace`, stop background work."""
        self.readiness.draining = True
        if self._service is not None:
            await self._service.stop()
            self._service = None
        await self.inflight.wait_idle(grace)
        await self.tasks.stop()

    async def on_reconnect(self) -> None:
        """Readers may have missed updates while the connection was down: republish all."""
        await self.publish(list(self.ledger.nodes.values()))

    # --- rebuild and watches ----------------------------------------------------------------

    async def rebuild(self) -> tuple[str, str]:
        """The whole ledger from the API server's annotations (phase-aware, init-released)."""
        nodes, nodes_rv = await self.kube.list_nodes()
        for node in nodes:
            meta = node.get("metadata") or {}
            self.ledger.set_node(meta.get("name", ""), meta.get("annotations") or {})
        await self._resync_quota()
        pods, pods_rv = await self.kube.list_pods()
        for obj in pods:
            self._observe(obj)
        return pods_rv, nodes_rv

    def _observe(self, obj: dict[str, Any], deleted: bool = False) -> set[str]:
        try:
            pod = pod_from_object(obj)
        except CoreError as exc:
            log.warning("pod ignored", extra={"error": str(exc)})
            return set()
        return self.ledger.forget(pod.uid) if deleted else self.ledger.observe(pod)

    async def _watch_loop(self, kind: str, resource_version: str) -> None:
        backoff = 0.2
        while True:
            try:
                async for event_type, obj in self.kube.watch(kind, resource_version):
                    meta = obj.get("metadata") or {}
                    resource_version = meta.get("resourceVersion", resource_version)
                    if event_type == "BOOKMARK":
                        continue
                    if kind == "pods":
                        changed = self._observe(obj, deleted=event_type == "DELETED")
                    else:
                        name = meta.get("name", "")
                        changed = (
                            {name}
                            if event_type != "DELETED"
                            and self.ledger.set_node(name, meta.get("annotations") or {})
                            else set()
                        )
                    if changed:
                        await self.publish(self.ledger.nodes[n] for n in changed)
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except kube_io.Gone:
                log.info("watch expired; relisting", extra={"kind": kind})
                resource_version = await self._relist(kind)
            except Exception as exc:
                log.warning("watch failed; retrying", extra={"kind": kind, "error": repr(exc)})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _relist(self, kind: str) -> str:
        if kind == "nodes":
            nodes, rv = await self.kube.list_nodes()
            changed = {
                n["metadata"]["name"]
                for n in nodes
                if self.ledger.set_node(
                    n["metadata"]["name"], n["metadata"].get("annotations") or {}
                )
            }
        else:
            pods, rv = await self.kube.list_pods()
            seen = set()
            changed = set()
            for obj in pods:
                changed |= self._observe(obj)
                seen.add((obj.get("metadata") or {}).get("uid"))
            for uid in [u for u in self.ledger.pod_node if u not in seen]:
                changed |= self.ledger.forget(uid)
        await self.publish(self.ledger.nodes[n] for n in changed)
        return rv

    async def _resync_quota(self) -> None:
        quotas = await self.kube.list_resource_quotas()
        try:
            self.ledger.set_quota_limits(limits_from_quotas(quotas, self.config))
        except CoreError as exc:
            log.warning("resource quotas ignored", extra={"error": str(exc)})

    async def _quota_loop(self) -> None:
        while True:
            await asyncio.sleep(self.quota_resync_seconds)
            try:
                await self._resync_quota()
            except kube_io.KubeError as exc:
                log.warning("quota resync failed", extra={"error": str(exc)})

    # --- publishing -------------------------------------------------------------------------

    async def publish(self, nodes: Iterable[NodeLedger]) -> None:
        """Each node's revision and per-device usage, for every reader's read model."""
        for node in nodes:
            self.metrics.node(node)
            body = {
                "epoch": self.ledger.epoch,
                "node": node.name,
                "revision": node.revision,
                "devices": node.usage_table(),
            }
            with contextlib.suppress(Exception):  # a broken connection must not fail the op
                await self.nc.publish(subjects.usage(node.name), dumps(body))
        self.metrics.tracked.set(len(self.ledger.pod_node))

    # --- requests ---------------------------------------------------------------------------

    def _handler(self, op: str) -> Any:
        async def handle(request: Request) -> None:
            await self.inflight.spawn(self._serve(op, request), name=f"accounting-{op}")

        return handle

    async def _serve(self, op: str, request: Request) -> None:
        try:
            try:
                body = loads_object(request.data, f"{op} request")
            except WireError as exc:
                reply = {"ok": False, "code": "invalid_request", "error": str(exc)}
                changed: set[str] = set()
            else:
                outcome = await self.ops.handle(op, subjects.last_token(request.subject), body)
                reply, changed = outcome.reply, outcome.changed
            if changed:
                await self.publish(self.ledger.nodes[n] for n in changed if n in self.ledger.nodes)
            self.metrics.commits.labels(op, reply["code"]).inc()
            if not reply["ok"]:
                log.info(
                    "accounting refused",
                    extra={"op": op, "code": reply["code"], "error": reply.get("error")},
                )
            await request.respond(dumps(reply))
        except Exception:
            log.exception("accounting operation failed", extra={"op": op})
            self.metrics.commits.labels(op, "internal_error").inc()
            with contextlib.suppress(Exception):
                await request.respond(
                    dumps({"ok": False, "code": "api_error", "error": "internal error"})
                )

    def _record_drift(self, node: str, pod: PodInfo, message: str) -> None:
        self.metrics.drift.labels(node).inc()
        log.warning(
            "allocation differs from reservation", extra={"pod": pod.key, "detail": message}
        )

        async def record() -> None:
            try:
                async with asyncio.timeout(5):
                    await self.kube.create_event(
                        {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
                        "Warning",
                        "AllocationDiffersFromReservation",
                        message,
                    )
            except (TimeoutError, kube_io.KubeError) as exc:
                log.warning("event not recorded", extra={"pod": pod.key, "error": str(exc)})

        self.tasks.spawn(record(), "drift-event")
