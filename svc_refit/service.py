"""svc_refit: answers `numafit.refit.v1.<node>` (queue group `numafit-refit`).

Per request: screen the input (nothing from a request becomes a subject, a log line or a reply
text unchecked or unbounded), validate (HAMi's order, via the core), decide on the read model,
commit through accounting's `move` naming the node revision and the pod's resourceVersion the
decision saw, recompute on `conflict` while `timeoutMs` allows, reply, and record an Event.

One deadline per request, from `timeoutMs`, bounds every hop: the snapshot (shared with the
other refits of the node), the wait for moves in flight, the move, and the check of an
unanswered move. Accounting is given less time than the refit waits for its answer, so that a
commit's success reply gets home; when the answer is lost anyway, one snapshot tells whether
the move landed, and the reply says `moved` if it did. Nothing is committed after the deadline:
accounting refuses to write with too little left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import nats.errors
import nats.micro

from shared import messages, subjects
from shared.accounting_client import AccountingClient
from shared.codes import Code
from shared.core import codec
from shared.messages import MessageError, RefitReply
from shared.service import natsconn
from shared.service.events import EventRecorder
from shared.service.health import Readiness
from shared.service.lifecycle import Deadline
from shared.service.supervisor import Supervisor
from shared.service.wiring import ServiceSpec
from svc_refit.metrics import RefitMetrics
from svc_refit.outcomes import MAX_REASON, cut, failed, invalid
from svc_refit.read_model import ReadModel
from svc_refit.refitter import Attempt, Refitter, reply_reserve
from svc_refit.screen import screen
from svc_refit.settings import RefitOptions as RefitOptions  # re-exported

if TYPE_CHECKING:
    from collections.abc import Callable

    from nats.aio.client import Client
    from nats.micro.request import Request
    from nats.micro.service import Service
    from prometheus_client import CollectorRegistry

    from shared.core.refit import Event, RefitDecision, RefitInput
    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.refit")

NAME = "numafit-refit"
VERSION = "0.1.0"
CONDITIONS = ("nats",)
MAX_BODY = 1 << 20  # HAMi reads request bodies through a 1 MiB limit
EVENT_TIMEOUT = 2.0
"""Seconds one Event may take to record; it is recorded after the reply, never before it."""
MAX_PENDING_EVENTS = 256
"""Events still being recorded beyond which new ones are dropped (and counted)."""


class _Answer(NamedTuple):
    """What `_decide` concluded, for `_serve` to send and record."""

    reply: RefitReply
    mode: str
    event_for: tuple[dict[str, str], Event] | None = None
    logged: tuple[RefitInput, RefitDecision] | None = None
    settle: Callable[[], None] = lambda: None
    """The bookkeeping to settle once the reply is sent (`Attempt.settle`)."""


def spec(options: RefitOptions | None = None) -> ServiceSpec[RefitService]:
    """How every caller (`numafit run`, simulate, bench, the test harnesses) builds it."""
    chosen = options if options is not None else RefitOptions()

    def build(
        nc: Client, kube: Kube | None, registry: CollectorRegistry, readiness: Readiness
    ) -> RefitService:
        return RefitService(nc, kube, chosen, metrics=RefitMetrics(registry), readiness=readiness)

    return ServiceSpec(NAME, CONDITIONS, build)


class RefitService:
    def __init__(
        self,
        nc: Client,
        kube: Kube | None,
        options: RefitOptions,
        *,
        metrics: RefitMetrics | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.nc = nc
        self.kube = kube
        self.options = options
        """Everything it is configured with (svc_refit/settings.py)."""
        self.config = options.config
        self.metrics = metrics or RefitMetrics()
        self.readiness = readiness or Readiness(*CONDITIONS)
        self.accounting = AccountingClient(nc)
        self.supervisor = Supervisor("refit", on_fatal=self.readiness.fail)
        self.read_model = ReadModel(
            nc, self.accounting, self.supervisor, on_fetch=self.metrics.snapshots.inc
        )
        self.refitter = Refitter(self.read_model, self.accounting, self.config, self.metrics)
        self._service: Service | None = None
        self.events = EventRecorder(
            kube,
            self.supervisor,
            timeout=EVENT_TIMEOUT,
            limit=MAX_PENDING_EVENTS,
            on_result=lambda result: self.metrics.events.labels(result).inc(),
            task_name="refit-event",
            logger=log,
        )

    async def start(self) -> None:
        await self.supervisor.start()
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
        service, self._service = self._service, None
        await natsconn.stop_service(self.nc, service)
        # One grace period: requests finish, then the Events they record.
        await self.supervisor.stop(grace)
        await self.read_model.stop()

    async def on_reconnect(self) -> None:
        """Usage updates may have been missed while disconnected: refetch before trusting."""
        self.read_model.mark_all_stale()

    # --- one request ------------------------------------------------------------------------

    async def _handle(self, request: Request) -> None:
        await self.supervisor.request(self._serve(request), name="refit")

    async def _serve(self, request: Request) -> None:
        started = time.perf_counter()
        mode = "unknown"
        try:
            answer = await self._decide(request)
            reply, mode = answer.reply, answer.mode
            try:
                reason = reply.failure_reason
                if reason is not None and len(reason) > MAX_REASON:
                    reply = msgspec.structs.replace(reply, failure_reason=cut(reason))
                # The one answer to the device plugin, after the move's reply from accounting:
                # plain request-reply, each hop answering the request it was asked.
                await self._respond(request, reply)
            finally:
                # The read model takes a landed move in before anything else, whatever
                # happened since the decision: a claim left behind would hold the pod.
                answer.settle()
            # Logged, counted and recorded after the answer: kubelet's admission waits on it.
            if answer.logged is not None:
                self._log(*answer.logged)
            self.metrics.requests.labels(reply.code, mode).inc()
            if answer.event_for is not None:
                self._record_event(*answer.event_for)
        except Exception:
            log.exception("refit failed unexpectedly")
            self.metrics.requests.labels(Code.API_ERROR.value, mode).inc()
            with contextlib.suppress(Exception):
                internal = failed(Code.API_ERROR, "internal error")
                await request.respond(messages.encode(RefitReply.from_decision(internal)))
        finally:
            self.metrics.duration.observe(time.perf_counter() - started)
            self.metrics.nodes.set(len(self.read_model))

    async def _respond(self, request: Request, reply: RefitReply) -> None:
        """Send the reply; a connection that breaks under it loses only the reply (the
        decision stands and is logged and counted as what it was)."""
        try:
            await natsconn.respond(request, messages.encode(reply))
        except nats.errors.Error as exc:
            self.metrics.replies_lost.inc()
            log.warning(
                "refit reply could not be sent",
                extra={"code": reply.code, "error": cut(repr(exc), 200)},
            )
            return
        # nats-py writes the reply from its flusher task: let it run now, before the
        # bookkeeping that follows, instead of after it.
        await asyncio.sleep(0)

    async def _decide(self, request: Request) -> _Answer:
        """The reply, the mode label, the Event to record, what to log once answered, the
        bookkeeping to settle once the reply is sent."""
        if len(request.data) > MAX_BODY:
            return _Answer(invalid(f"refit request larger than {MAX_BODY} bytes"), "unknown")
        try:
            parsed = messages.decode(request.data, messages.RefitRequest).to_core()
        except MessageError as exc:
            return _Answer(invalid(cut(str(exc), 200)), "unknown")
        mode = parsed.mode.value
        screened = screen(parsed, subjects.last_token(request.subject))
        if screened is not None:
            level = logging.WARNING if screened.code is Code.UNAUTHORIZED else logging.INFO
            log.log(
                level,
                "refit request rejected",
                extra={"code": screened.code.value, "reason": screened.failure_reason},
            )
            return _Answer(RefitReply.from_decision(screened), mode)
        deadline = Deadline.after_ms(parsed.timeout_ms)
        attempt = Attempt(parsed, deadline, reply_reserve(parsed.timeout_ms / 1000.0))
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout_at(loop.time() + attempt.left()):
                decision = await self.refitter.decide_and_commit(attempt)
        except TimeoutError:
            decision = failed(Code.DEADLINE_EXCEEDED, "refit budget spent")
        except BaseException:
            attempt.settle()
            raise
        event_for = (
            (attempt.pod_ref, decision.event) if attempt.pod_ref and decision.event else None
        )
        return _Answer(
            RefitReply.from_decision(decision),
            mode,
            event_for,
            (parsed, decision),
            attempt.settle,
        )

    def _log(self, request: RefitInput, decision: RefitDecision) -> None:
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
            fields["reason"] = cut(decision.failure_reason)
            log.info("refit refused", extra=fields)

    def _record_event(self, pod: dict[str, str], event: Event) -> None:
        """Record after the reply, bounded (EVENT_TIMEOUT) and capped (MAX_PENDING_EVENTS)."""
        self.events.record(pod, event.type, event.reason, cut(event.message))
