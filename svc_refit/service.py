"""svc_refit: answers `numafit.refit.v1.<node>` (queue group `numafit-refit`).

Per request: validate (HAMi's order, via the core), decide on the read model, commit through
accounting's `move` at the revision the decision was computed on, recompute on `conflict` while
`timeoutMs` allows, reply, and record an Event on the pod. Nothing is committed after the
deadline: accounting receives the remaining budget and refuses to write with too little left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import nats.micro
from nats.aio.client import Client
from nats.micro.request import Request
from nats.micro.service import Service

from shared import subjects
from shared.accounting_client import REPLY_MARGIN, AccountingClient, AccountingUnavailable
from shared.core import codec, keys
from shared.core.config import CoreConfig
from shared.core.refit import (
    Code,
    Event,
    RefitDecision,
    RefitRequest,
    RequestShapeError,
    decide_refit,
    parse_refit_request,
    refused,
)
from shared.service import kube_io
from shared.service.health import Readiness
from shared.service.inflight import InFlight
from shared.service.kube_io import Kube
from shared.service.lifecycle import Deadline
from shared.service.tasks import TaskSet
from shared.wire import WireError, dumps, loads_object
from svc_refit.metrics import RefitMetrics
from svc_refit.read_model import ReadModel

log = logging.getLogger("numafit.refit")

VERSION = "0.1.0"
MAX_BODY = 1 << 20  # HAMi reads request bodies through a 1 MiB limit


class RefitService:
    def __init__(
        self,
        nc: Client,
        kube: Kube | None,
        *,
        config: CoreConfig | None = None,
        metrics: RefitMetrics | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.nc = nc
        self.kube = kube
        self.config = config or CoreConfig()
        self.metrics = metrics or RefitMetrics()
        self.readiness = readiness or Readiness("nats")
        self.accounting = AccountingClient(nc)
        self.read_model = ReadModel(nc, self.accounting)
        self._service: Service | None = None
        self.tasks = TaskSet()
        self.inflight = InFlight()

    async def start(self) -> None:
        await self.read_model.start()
        service = await nats.micro.add_service(
            self.nc,
            name="numafit-refit",
            version=VERSION,
            description="numafit NUMA refit: moves a pending reservation onto kubelet's GPUs",
        )
        await service.add_endpoint(
            name="refit",
            subject=subjects.REFIT_WILDCARD,
            queue_group=subjects.REFIT_QUEUE,
            handler=self._handle,
        )
        await self.nc.flush()
        self._service = service
        self.readiness.set("nats")
        log.info("refit ready")

    async def stop(self, grace: float) -> None:
        self.readiness.draining = True
        if self._service is not None:
            await self._service.stop()
            self._service = None
        await self.inflight.wait_idle(grace)
        await self.read_model.stop()
        await self.tasks.stop(grace)  # events still being recorded

    # --- one request ------------------------------------------------------------------------

    async def _handle(self, request: Request) -> None:
        await self.inflight.spawn(self._serve(request), name="refit")

    async def _serve(self, request: Request) -> None:
        started = time.perf_counter()
        mode = "unknown"
        try:
            reply, mode, event_for = await self._decide(request)
            await request.respond(dumps(reply))
            self.metrics.requests.labels(reply["code"], mode).inc()
            if event_for is not None:
                self._record_event(*event_for)
        except Exception:
            log.exception("refit failed unexpectedly")
            self.metrics.requests.labels("api_error", mode).inc()
            with contextlib.suppress(Exception):
                await request.respond(dumps(_failed(Code.API_ERROR, "internal error").reply()))
        finally:
            self.metrics.duration.observe(time.perf_counter() - started)

    async def _decide(
        self, request: Request
    ) -> tuple[dict[str, Any], str, tuple[dict[str, str], Event] | None]:
        if len(request.data) > MAX_BODY:
            return _invalid(f"refit request larger than {MAX_BODY} bytes"), "unknown", None
        try:
            parsed = parse_refit_request(loads_object(request.data, "refit request"))
        except (WireError, RequestShapeError) as exc:
            return _invalid(str(exc)), "unknown", None
        mode = parsed.mode.value
        token = subjects.last_token(request.subject)
        if parsed.node_name and subjects.node_token(parsed.node_name) != token:
            # A node may only ask on its own subject (per-node NATS permissions rely on it).
            decision = refused(
                Code.UNAUTHORIZED,
                f"request for node {parsed.node_name} arrived on the subject of {token}",
                event=False,
            )
            return decision.reply(), mode, None
        deadline = Deadline.after_ms(parsed.timeout_ms)
        decision, pod_ref = await self._decide_and_commit(parsed, deadline)
        self._log(parsed, decision)
        event_for = (pod_ref, decision.event) if pod_ref and decision.event else None
        return decision.reply(), mode, event_for

    async def _decide_and_commit(
        self, request: RefitRequest, deadline: Deadline
    ) -> tuple[RefitDecision, dict[str, str] | None]:
        pod_ref: dict[str, str] | None = None
        while True:
            budget = deadline.remaining() - REPLY_MARGIN
            if budget <= 0:
                return _failed(Code.DEADLINE_EXCEEDED, "refit budget spent"), pod_ref
            # Rows 1-5 need no state: decide them before asking accounting for anything.
            early = decide_refit(request, pods={}, node=None, config=self.config)
            if early.code is not Code.POD_NOT_TRACKED:
                return early, None
            try:
                view = await self.read_model.view(
                    request.node_name, request.pod_uid, request.pod_namespace, budget
                )
            except AccountingUnavailable as exc:
                return _failed(Code.API_ERROR, f"accounting unavailable: {exc}"), pod_ref
            except WireError as exc:
                return _failed(Code.API_ERROR, f"bad snapshot from accounting: {exc}"), pod_ref
            pods = {view.pod.uid: view.pod} if view.pod is not None else {}
            if view.pod is not None:
                pod_ref = {
                    "namespace": view.pod.pod.namespace,
                    "name": view.pod.pod.name,
                    "uid": view.pod.uid,
                }
            decision = decide_refit(
                request,
                pods=pods,
                node=view.node.snapshot(),
                quota=view.quota,
                config=self.config,
            )
            if decision.code is not Code.MOVED or decision.annotations is None:
                return decision, pod_ref
            budget = deadline.remaining() - REPLY_MARGIN
            if budget <= 0:
                return _failed(Code.DEADLINE_EXCEEDED, "refit budget spent before commit"), pod_ref
            try:
                reply = await self.accounting.call(
                    "move",
                    request.node_name,
                    {
                        "podUID": request.pod_uid,
                        "revision": view.node.revision,
                        "containerIndex": request.container_index,
                        "toAllocate": decision.annotations[keys.TO_ALLOCATE],
                        "allocated": decision.annotations[keys.ALLOCATED],
                    },
                    budget,
                )
            except AccountingUnavailable as exc:
                # The move may or may not have landed; accounting's ledger and the pod's
                # annotations stay the truth, and Allocate records what kubelet really runs.
                self.metrics.commit_attempts.labels("unavailable").inc()
                return _failed(Code.DEADLINE_EXCEEDED, f"commit unanswered: {exc}"), pod_ref
            result = str(reply.get("code", "api_error"))
            self.metrics.commit_attempts.labels(result).inc()
            if reply.get("ok"):
                return decision, pod_ref
            if result == Code.CONFLICT.value:
                self.read_model.invalidate(request.node_name)
                continue  # recompute on fresh state while the budget allows
            code = Code(result) if result in Code._value2member_map_ else Code.API_ERROR
            return _failed(code, str(reply.get("error", "commit refused"))), pod_ref

    def _log(self, request: RefitRequest, decision: RefitDecision) -> None:
        fields = {
            "pod": f"{request.pod_namespace}/{request.pod_name}",
            "node": request.node_name,
            "container": request.container_index,
            "mode": request.mode.value,
            "code": decision.code.value,
        }
        if decision.succeeded:
            fields["devices"] = codec.encode_container(decision.container_devices)
            log.info("refit succeeded", extra=fields)
        else:
            fields["reason"] = decision.failure_reason
            log.info("refit refused", extra=fields)

    def _record_event(self, pod: dict[str, str], event: Event) -> None:
        if self.kube is None:
            return
        kube = self.kube

        async def record() -> None:
            try:
                async with asyncio.timeout(5):
                    await kube.create_event(pod, event.type, event.reason, event.message)
            except (TimeoutError, kube_io.KubeError) as exc:
                log.warning("event not recorded", extra={"pod": pod["name"], "error": str(exc)})

        self.tasks.spawn(record(), "refit-event")


def _invalid(message: str) -> dict[str, Any]:
    return {"succeeded": False, "code": Code.INVALID_REQUEST.value, "failureReason": message}


def _failed(code: Code, message: str) -> RefitDecision:
    return RefitDecision(
        False, code, failure_reason=message, event=Event("Warning", "NumaRefitFailed", message)
    )
