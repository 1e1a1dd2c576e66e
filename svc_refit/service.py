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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import msgspec
import nats.errors
import nats.micro

from shared import codes, messages, subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core import codec, keys
from shared.core.nodes import usage_growth
from shared.core.refit import (
    Event,
    RefitDecision,
    RefitInput,
    check_request,
    decide_refit,
    refused,
)
from shared.messages import MessageError, MoveReply, MoveRequest, RefitReply
from shared.service import natsconn
from shared.service.events import EventRecorder
from shared.service.health import Readiness
from shared.service.lifecycle import Deadline
from shared.service.supervisor import Supervisor
from shared.service.wiring import ServiceSpec
from svc_refit.metrics import RefitMetrics
from svc_refit.read_model import (
    ReadModel,
    SnapshotRefused,
    View,
    committed,
    with_claims,
)
from svc_refit.settings import RefitOptions as RefitOptions  # re-exported

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from nats.aio.client import Client
    from nats.micro.request import Request
    from nats.micro.service import Service
    from prometheus_client import CollectorRegistry

    from shared.core.accounting import TrackedPod
    from shared.core.model import ContainerEntry
    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.refit")

NAME = "numafit-refit"
VERSION = "0.1.0"
CONDITIONS = ("nats",)
MAX_BODY = 1 << 20  # HAMi reads request bodies through a 1 MiB limit
MAX_REASON = 512
"""Longest failureReason a reply carries (anything echoed from input is cut well before)."""
MAX_DEVICE_TYPE = 64
EVENT_TIMEOUT = 2.0
"""Seconds one Event may take to record; it is recorded after the reply, never before it."""
MAX_PENDING_EVENTS = 256
"""Events still being recorded beyond which new ones are dropped (and counted)."""
MAX_CONFLICTS = 8
"""Recomputations after `conflict` before the refit gives up with `conflict`."""
LANDING_WAIT = 0.25
"""Longest wait for the node's next change before the second look at an unanswered move."""
MIN_COMMIT_BUDGET = 0.02
"""Below this, accounting would refuse to write anyway (its MIN_WRITE_BUDGET)."""


def _share(timeout: float, fraction: float, low: float, high: float) -> float:
    return min(max(timeout * fraction, low), high)


def reply_reserve(timeout: float) -> float:
    """Seconds kept back at the end of the budget for the reply's trip to the device plugin."""
    return _share(timeout, 0.025, 0.01, 0.05)


def accounting_margin(timeout: float) -> float:
    """How much earlier than the refit stops waiting accounting must have answered a move."""
    return _share(timeout, 0.1, 0.02, 0.2)


def verify_reserve(timeout: float) -> float:
    """Seconds kept after a move's wait for one snapshot telling whether it landed."""
    return _share(timeout, 0.1, 0.02, 0.2)


@dataclass
class _Attempt:
    """What one request learned on its way (kept when its deadline cancels it)."""

    request: RefitInput
    deadline: Deadline
    reserve: float
    started: float = field(default_factory=time.monotonic)
    pod_ref: dict[str, str] | None = None
    after_reply: list[Callable[[], None]] = field(default_factory=list)
    """Bookkeeping of a landed move, run once the reply is on its way (`settle`)."""

    def settle(self) -> None:
        """Run (once) what was kept for after the reply; every step runs, whatever fails."""
        steps, self.after_reply = self.after_reply, []
        with contextlib.ExitStack() as stack:
            for step in reversed(steps):
                stack.callback(step)

    @property
    def timeout(self) -> float:
        return self.request.timeout_ms / 1000.0

    def left(self) -> float:
        """Seconds the request may still spend before its reply must leave."""
        return self.deadline.remaining() - self.reserve


class _Answer(NamedTuple):
    """What `_decide` concluded, for `_serve` to send and record."""

    reply: RefitReply
    mode: str
    event_for: tuple[dict[str, str], Event] | None = None
    logged: tuple[RefitInput, RefitDecision] | None = None
    settle: Callable[[], None] = lambda: None
    """The bookkeeping to settle once the reply is sent (`_Attempt.settle`)."""


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
                    reply = msgspec.structs.replace(reply, failure_reason=_cut(reason))
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
                failed = _failed(Code.API_ERROR, "internal error")
                await request.respond(messages.encode(RefitReply.from_decision(failed)))
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
                extra={"code": reply.code, "error": _cut(repr(exc), 200)},
            )
            return
        # nats-py writes the reply from its flusher task: let it run now, before the
        # bookkeeping that follows, instead of after it.
        await asyncio.sleep(0)

    async def _decide(self, request: Request) -> _Answer:
        """The reply, the mode label, the Event to record, what to log once answered, the
        bookkeeping to settle once the reply is sent."""
        if len(request.data) > MAX_BODY:
            return _Answer(_invalid(f"refit request larger than {MAX_BODY} bytes"), "unknown")
        try:
            parsed = messages.decode(request.data, messages.RefitRequest).to_core()
        except MessageError as exc:
            return _Answer(_invalid(_cut(str(exc), 200)), "unknown")
        mode = parsed.mode.value
        screened = _screen(parsed, subjects.last_token(request.subject))
        if screened is not None:
            level = logging.WARNING if screened.code is Code.UNAUTHORIZED else logging.INFO
            log.log(
                level,
                "refit request rejected",
                extra={"code": screened.code.value, "reason": screened.failure_reason},
            )
            return _Answer(RefitReply.from_decision(screened), mode)
        deadline = Deadline.after_ms(parsed.timeout_ms)
        attempt = _Attempt(parsed, deadline, reply_reserve(parsed.timeout_ms / 1000.0))
        try:
            loop = asyncio.get_running_loop()
            async with asyncio.timeout_at(loop.time() + attempt.left()):
                decision = await self._decide_and_commit(attempt)
        except TimeoutError:
            decision = _failed(Code.DEADLINE_EXCEEDED, "refit budget spent")
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

    async def _decide_and_commit(self, attempt: _Attempt) -> RefitDecision:
        request = attempt.request
        # Rows 1-5 need no state: decide them before asking anyone for anything.
        early = check_request(request)
        if early is not None:
            return early
        node, uid = request.node_name, request.pod_uid
        quota_checked = False
        conflicts = 0
        while True:
            if attempt.left() <= 0:
                return _failed(Code.DEADLINE_EXCEEDED, "refit budget spent")
            if self.read_model.moving(node, uid):
                # An earlier move of this pod is in flight (its requester gave up and asked
                # again, say): decide on the pod only once that move has settled.
                wait = attempt.left() - verify_reserve(attempt.timeout) - MIN_COMMIT_BUDGET
                if await self.read_model.wait_change(node, wait):
                    continue
                return _failed(Code.DEADLINE_EXCEEDED, "an earlier move of this pod is in flight")
            try:
                view = await self.read_model.view(
                    node, uid, request.pod_namespace, attempt.deadline, attempt.reserve
                )
            except SnapshotRefused as exc:
                return _from_accounting(exc.code, f"accounting refused a snapshot: {exc}")
            except AccountingUnavailable as exc:
                code = Code.DEADLINE_EXCEEDED if attempt.left() <= 0 else Code.API_ERROR
                return _failed(code, f"accounting unavailable: {_cut(str(exc), 200)}")
            except MessageError as exc:
                return _failed(Code.API_ERROR, f"bad snapshot from accounting: {_cut(str(exc))}")
            if view.pod is not None:
                attempt.pod_ref = {
                    "namespace": view.pod.pod.namespace,
                    "name": view.pod.pod.name,
                    "uid": view.pod.uid,
                }
            decision = self._decide_on(request, view)
            if decision.code in (Code.NO_FIT, Code.QUOTA_EXCEEDED) and self.read_model.claims(
                node, excluding=uid
            ):
                # Refused only because of moves still in flight? Then wait for them to settle
                # (one may fail and give the capacity back) and decide again.
                free = self._decide_on(request, view, claims=False)
                if free.code is Code.MOVED:
                    wait = attempt.left() - verify_reserve(attempt.timeout) - MIN_COMMIT_BUDGET
                    if await self.read_model.wait_change(node, wait):
                        continue
                    return decision  # the capacity is still held by those moves
            if (
                decision.code is Code.QUOTA_EXCEEDED
                and not quota_checked
                and view.quota_at < attempt.started
            ):
                # Refuse by quota only on the quota as it is now, not as it was cached.
                quota_checked = True
                with contextlib.suppress(AccountingUnavailable, SnapshotRefused, MessageError):
                    await self.read_model.refresh_quota(
                        node, request.pod_namespace, attempt.deadline, attempt.reserve
                    )
                    continue
                return decision
            if decision.code is not Code.MOVED or view.pod is None:
                return decision
            outcome = await self._commit(attempt, view, decision)
            if outcome is not None:
                return outcome
            conflicts += 1
            if conflicts > MAX_CONFLICTS:
                return _failed(Code.CONFLICT, f"the node kept changing ({conflicts} conflicts)")

    def _decide_on(self, request: RefitInput, view: View, *, claims: bool = True) -> RefitDecision:
        usage = view.usage
        if usage is not None and claims:
            held = self.read_model.claims(request.node_name, excluding=request.pod_uid)
            if held:
                usage = with_claims(usage, held)
        pods = {view.pod.uid: view.pod} if view.pod is not None else {}
        return decide_refit(request, pods=pods, node=usage, quota=view.quota, config=self.config)

    async def _commit(
        self, attempt: _Attempt, view: View, decision: RefitDecision
    ) -> RefitDecision | None:
        """Send the move; the decision's outcome, or None to recompute (`conflict`)."""
        request, tracked = attempt.request, view.pod
        assert tracked is not None
        assert decision.annotations is not None
        node = request.node_name
        margin = accounting_margin(attempt.timeout)
        wait = attempt.left() - verify_reserve(attempt.timeout)
        if wait - margin < MIN_COMMIT_BUDGET:
            return _failed(Code.DEADLINE_EXCEEDED, "refit budget spent before commit")
        move = MoveRequest(
            pod_uid=request.pod_uid,
            revision=view.revision,
            epoch=view.epoch or None,  # fencing: the revision counts in this epoch only
            pod_resource_version=tracked.pod.resource_version,
            container_index=request.container_index,
            to_allocate=decision.annotations[keys.TO_ALLOCATE],
            allocated=decision.annotations[keys.ALLOCATED],
            node=node,
        )
        claim = usage_growth(tracked.usage, decision.stored_usage or {})
        lost = ""
        reply: MoveReply | None = None
        held = contextlib.ExitStack()
        held.enter_context(self.read_model.claim(node, request.pod_uid, claim))
        try:
            reply = await self.accounting.ask(move, MoveReply, wait, margin=margin)
        except AccountingUnavailable as exc:
            lost = _cut(str(exc), 200)
        except BaseException:
            held.close()
            raise
        if reply is not None and reply.ok:
            # The read model takes the landed move in once the reply is on its way (the
            # device plugin does not wait for it); until then the claim keeps the move's
            # usage counted for every other refit of the node. The claim goes last.
            landed = reply
            attempt.after_reply += [
                lambda: self._committed(node, tracked, decision, landed),
                held.close,
            ]
        else:
            held.close()
        if reply is None:
            self.metrics.commit("unavailable")
            return await self._verify(
                attempt, decision, Code.DEADLINE_EXCEEDED, f"commit unanswered: {lost}"
            )
        if reply.ok:
            self.metrics.commit(Code.OK.value)
            return decision
        self.metrics.commit(reply.code)  # a code this build does not know counts as `other`
        result = Code.parse(reply.code)
        error = _cut(reply.error or "commit refused", 300)
        if result is Code.CONFLICT:
            self.read_model.mark_stale(node)  # recompute on fresh state while the budget allows
            return None
        if result in codes.UNCERTAIN:
            # The write may have reached the API server before accounting gave up on it.
            return await self._verify(attempt, decision, result, error)
        if result in (Code.NO_FIT, Code.QUOTA_EXCEEDED):
            self.read_model.mark_stale(node)  # accounting saw usage we did not
        return _from_accounting(
            result, error, _fit_reasons(reply.fit_reasons), decision.previous_devices
        )

    def _committed(
        self, node: str, tracked: TrackedPod, decision: RefitDecision, reply: MoveReply
    ) -> None:
        resource_version = reply.pod_resource_version
        assert decision.annotations is not None
        updated = (
            committed(tracked, decision.annotations, resource_version) if resource_version else None
        )
        if reply.revision is None:
            self.read_model.mark_stale(node)
        elif updated is None or not self.read_model.own_commit(
            node, reply.epoch or "", reply.revision, tracked.usage, updated.usage
        ):
            self.read_model.expect(node, reply.revision)
        if updated is not None:
            self.read_model.replace_pod(node, updated)
        else:
            self.read_model.forget_pod(node, tracked.uid)

    async def _verify(
        self, attempt: _Attempt, decision: RefitDecision, code: Code, message: str
    ) -> RefitDecision:
        """A move's answer was lost or inconclusive: did it land? A snapshot of the pod's entry
        now and, when it does not show the move yet, once more after the node's next change
        (a write that outlived accounting's patience reaches its ledger through the watch),
        all within what is left of the budget."""
        request = attempt.request
        node = request.node_name
        checked = False
        for check in range(2):
            if attempt.left() <= 0.005:
                break
            if check and not await self.read_model.wait_change(
                node, min(attempt.left() - 0.005, LANDING_WAIT)
            ):
                break
            try:
                entry = await self.read_model.pod_entry(
                    node, request.pod_uid, attempt.deadline, attempt.reserve
                )
            except (AccountingUnavailable, SnapshotRefused, MessageError):
                break
            checked = True
            if _holds(entry, request, decision):
                self.metrics.uncertain.labels("landed").inc()
                log.info(
                    "move answer lost, but the move landed",
                    extra={"pod": f"{request.pod_namespace}/{request.pod_name}", "error": message},
                )
                return decision
        self.metrics.uncertain.labels("not_landed" if checked else "unknown").inc()
        return _failed(code, message)

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
            fields["reason"] = _cut(decision.failure_reason)
            log.info("refit refused", extra=fields)

    def _record_event(self, pod: dict[str, str], event: Event) -> None:
        """Record after the reply, bounded (EVENT_TIMEOUT) and capped (MAX_PENDING_EVENTS)."""
        self.events.record(pod, event.type, event.reason, _cut(event.message))


def _screen(request: RefitInput, token: str) -> RefitDecision | None:
    """Refuse what must not go further: names that could not be subjects (or API paths), and
    anything the core would echo unbounded. Empty fields are left to the core ("incomplete")."""
    if not subjects.valid_token(token):
        return refused(
            Code.INVALID_REQUEST,
            f"subject token {subjects.shown(token)} is not a node name's token",
            event=False,
        )
    for value, what in (
        (request.node_name, "nodeName"),
        (request.pod_namespace, "podNamespace"),
        (request.pod_name, "podName"),
        (request.container_name, "containerName"),
    ):
        if value and not subjects.valid_name(value):
            return refused(
                Code.INVALID_REQUEST,
                f"{what} {subjects.shown(value)} is not a Kubernetes name",
                event=False,
            )
    if request.pod_uid and not subjects.valid_uid(request.pod_uid):
        return refused(
            Code.INVALID_REQUEST,
            f"podUID {subjects.shown(request.pod_uid)} is not a Kubernetes UID",
            event=False,
        )
    if len(request.device_type) > MAX_DEVICE_TYPE:
        return refused(
            Code.UNKNOWN_DEVICE_TYPE,
            f"unknown device type {subjects.shown(request.device_type)}",
            event=False,
        )
    if request.node_name and subjects.node_token(request.node_name) != token:
        # A node may only ask on its own subject (per-node NATS permissions rely on it).
        return refused(
            Code.UNAUTHORIZED,
            f"request for node {request.node_name} arrived on the subject of {token}",
            event=False,
        )
    return None


def _holds(entry: TrackedPod | None, request: RefitInput, decision: RefitDecision) -> bool:
    """Does the pod's entry hold what the decision would have written?"""
    assert decision.annotations is not None
    return (
        entry is not None
        and entry.node == request.node_name
        and entry.to_allocate == decision.annotations[keys.TO_ALLOCATE]
        and entry.allocated == decision.annotations[keys.ALLOCATED]
    )


def _cut(text: str, limit: int = MAX_REASON) -> str:
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters)"


def _fit_reasons(value: Mapping[str, int] | None) -> dict[str, int]:
    """accounting's `fitReasons` (typed by the decoder), kept only when bounded (names are
    HAMi's, a few)."""
    if value is None or len(value) > 32:
        return {}
    return {k: v for k, v in value.items() if len(k) <= 64}


def _from_accounting(
    code: Code,
    message: str,
    fit_reasons: dict[str, int] | None = None,
    previous: ContainerEntry = (),
) -> RefitDecision:
    """A refit refusal for accounting's refusal `code` (a success code here is an error)."""
    known = Code.API_ERROR if code in codes.SUCCESS else code
    return refused(known, message, fit_reasons=fit_reasons or {}, previous_devices=previous)


def _invalid(message: str) -> RefitReply:
    return RefitReply(succeeded=False, code=Code.INVALID_REQUEST.value, failure_reason=message)


def _failed(code: Code, message: str) -> RefitDecision:
    return RefitDecision(
        False, code, failure_reason=message, event=Event("Warning", "NumaRefitFailed", message)
    )
