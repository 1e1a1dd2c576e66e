"""The extender's /bind: the pod named is checked against the API server (its UID and its
scheduler name) before accounting is asked anything, then bind-phase `allocating` is asked of
accounting, which creates the pod's Binding carrying its reservation; a bind waits for the
node's lock (extender_locks.py) while its budget allows, and a pod written but not bound is
marked `failed` so that the node's lock is released.

Every step takes its time from the bind's one deadline (`request_timeout`), keeping back
FAILURE_RESERVE for recording `failed`."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from shared import subjects
from shared.accounting_client import REPLY_MARGIN, AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core import keys
from shared.core.webhook_rules import other_scheduler_message, pod_scheduler_name
from shared.messages import BindPhaseReply, BindPhaseRequest
from shared.service import kube_io
from shared.service.lifecycle import Deadline
from svc_scheduler.extender_wire import BindingArgs, BindingResult, binding_result

if TYPE_CHECKING:
    from shared.service.events import EventRecorder
    from shared.service.kube_io import Kube
    from svc_scheduler.extender_locks import NodeGates, PendingBinds
    from svc_scheduler.extender_recent import Recent
    from svc_scheduler.read_model import ReadModel

log = logging.getLogger("numafit.scheduler")

FAILURE_RESERVE = 0.3
"""Seconds of a bind's budget kept back for recording `failed` when the pod could not be bound,
so the node's lock is released within the same deadline."""
LOCK_WAIT_RESERVE = 1.0
"""Seconds of a bind's budget a wait for the node's lock leaves for the rest: accounting's
guarded Binding (the reservation on it), and recording `failed` if the pod was not bound."""
LOCK_WAIT_TIMEOUT = "lock_wait_timeout"
"""A bind that waited its whole budget for the node's lock (bind result label)."""
OTHER_SCHEDULER = "other_scheduler"
"""A pod of another scheduler (filter and bind result label)."""


class BindBudgetSpent(Exception):
    """The bind's deadline leaves no time for its next step."""


class Binder:
    """Binds the pods numafit's filter reserved, through accounting."""

    def __init__(
        self,
        *,
        accounting: AccountingClient,
        kube: Kube | None,
        read_model: ReadModel,
        gates: NodeGates,
        pending_binds: PendingBinds,
        events: EventRecorder,
        reserved: Recent,
        deferred: Recent,
        scheduler_names: tuple[str, ...],
        request_timeout: float,
    ) -> None:
        self.accounting = accounting
        self.kube = kube
        self.read_model = read_model
        self.gates = gates
        self.pending_binds = pending_binds
        self.events = events
        self.reserved = reserved
        """Pod UID -> the node the filter reserved it on (forgotten once bound or refused)."""
        self.deferred = deferred
        """Pod UID -> the transient refusal its last filter deferred to its bind."""
        self.scheduler_names = scheduler_names
        self.request_timeout = request_timeout

    async def bind(self, args: BindingArgs) -> tuple[BindingResult, str]:
        """`ExtenderBindingResult` and the metric result label."""
        try:
            subjects.check_pod(args.pod_namespace, args.pod_name, args.pod_uid)
            subjects.check_name(args.node, "Node")
        except subjects.InvalidName as exc:
            return binding_result(f"ExtenderBindingArgs: {exc}"), "invalid_request"
        key = f"{args.pod_namespace}/{args.pod_name}"
        deadline = Deadline.after_ms(self.request_timeout * 1000)
        refused = await self._check_bind(args, deadline)
        if refused is not None:
            label, message = refused
            self.pending_binds.done(args.pod_uid)
            log.info("bind refused", extra={"pod": key, "node": args.node, "error": message})
            return binding_result(message), label
        deferred = self.deferred.pop(args.pod_uid)
        try:
            reply = await self._allocating(args, deadline)
        except (AccountingUnavailable, BindBudgetSpent) as exc:
            return binding_result(f"accounting unavailable: {exc}"), "accounting_unavailable"
        finally:
            # Ended one way or the other: no longer a bind to come on the node.
            self.pending_binds.done(args.pod_uid)
        if not reply.ok:
            code = Code.parse(reply.code)
            detail = (reply.error or "")[:300]
            if code is Code.CONFLICT:
                # The node stayed locked for another pod's allocation the whole budget:
                # kube-scheduler binds again after its backoff, on the reservation still held.
                message = (
                    f"cannot bind pod {key} to node {args.node} yet: {detail}; "
                    "retried after kube-scheduler's backoff"
                )
                log.info("bind waited out", extra={"pod": key, "node": args.node})
                return binding_result(message), LOCK_WAIT_TIMEOUT
            # pod_not_tracked / node_mismatch: no reservation there (it expired unbound,
            # accounting restarted and forgot it, or the filter deferred a transient
            # refusal): kube-scheduler schedules the pod again, after its backoff.
            self.reserved.pop(args.pod_uid)
            message = f"cannot bind pod {key} to node {args.node}: {code}: {detail}"
            if deferred is not None and code in (Code.POD_NOT_TRACKED, Code.NODE_MISMATCH):
                message = deferred
            log.info("bind refused", extra={"pod": key, "node": args.node, "error": message})
            return binding_result(message), code.value
        if reply.revision is not None:
            # The node is locked from now on: the next filter must see it before deciding.
            self.read_model.expect(args.node, reply.revision)
        if reply.bound:
            # Accounting's one write was the Binding, the reservation on it.
            self.reserved.pop(args.pod_uid)
            log.info("pod bound", extra={"pod": key, "node": args.node})
            return binding_result(), "ok"
        # Written but not bound: an accounting replica older than the bind-phase `bind` field
        # (an upgrade in the wrong order: accounting goes first). The pod is not bound, so
        # its phase becomes `failed` (the node's lock is released) and kube-scheduler
        # schedules it again after its backoff.
        error = (
            f"accounting wrote the reservation of pod {key} but did not bind it (an accounting "
            "replica older than this extender: upgrade svc-accounting first)"
        )
        log.warning("binding failed", extra={"pod": key, "node": args.node, "error": error})
        await self._bind_failed(args, deadline)
        self._record_event(args, "Warning", "BindingFailed", error)
        return binding_result(error), "binding_failed"

    async def _allocating(self, args: BindingArgs, deadline: Deadline) -> BindPhaseReply:
        """Bind-phase `allocating` for the pod (accounting writes its reservation), waiting
        while the node is locked for another pod's allocation (a `conflict`), as long as the
        budget leaves LOCK_WAIT_RESERVE for the rest of the bind; the last answer."""
        request = _phase_request(args, keys.PHASE_ALLOCATING)
        node = args.node
        # The first try needs no turn: usually the node is free, and a pod with nothing
        # reserved there (a deferred refusal) must not queue behind others to learn it.
        changed = self.gates.armed(node)
        reply = await self.accounting.ask(
            request, BindPhaseReply, self._bind_budget(deadline, FAILURE_RESERVE)
        )
        if reply.ok or Code.parse(reply.code) is not Code.CONFLICT:
            return reply
        async with self.gates.turn(node, deadline.remaining() - LOCK_WAIT_RESERVE) as mine:
            while mine:
                left = deadline.remaining() - LOCK_WAIT_RESERVE
                if left <= 0:
                    break
                await self.gates.wait(changed, left)
                changed = self.gates.armed(node)
                reply = await self.accounting.ask(
                    request, BindPhaseReply, self._bind_budget(deadline, FAILURE_RESERVE)
                )
                if reply.ok or Code.parse(reply.code) is not Code.CONFLICT:
                    return reply
        return reply

    async def _check_bind(self, args: BindingArgs, deadline: Deadline) -> tuple[str, str] | None:
        """(metric label, message) when the bind must not happen; None when the pod named by
        namespace and name has the UID given and one of numafit's scheduler names.

        Checked before accounting is asked anything: bind-phase acts on the reservation of the
        UID, so a bind naming another pod would write (and, once its Binding failed, mark
        `failed`) the reservation of a pod it does not name."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        if self.kube is None:
            return "binding_failed", "no Kubernetes client configured"
        try:
            async with asyncio.timeout(self._bind_budget(deadline, FAILURE_RESERVE)):
                # From the API server's watch cache: the uid and the scheduler name never
                # change, and kube-scheduler learned of the pod from that cache (a quorum read
                # per bind was an etcd round trip on every bind's path).
                body = await self.kube.get_pod_cached(args.pod_namespace, args.pod_name)
        except kube_io.NotFound:
            return Code.POD_NOT_TRACKED.value, f"cannot bind pod {key}: it does not exist"
        except (TimeoutError, BindBudgetSpent):
            return Code.DEADLINE_EXCEEDED.value, f"cannot bind pod {key}: reading it timed out"
        except kube_io.KubeError as exc:
            return Code.API_ERROR.value, f"cannot bind pod {key}: {str(exc)[:300]}"
        meta = body.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if uid != args.pod_uid:
            return Code.POD_MISMATCH.value, (
                f"cannot bind pod {key} to node {args.node}: {Code.POD_MISMATCH}: the pod has "
                f"uid {subjects.shown(str(uid))}, not {args.pod_uid}"
            )
        name = pod_scheduler_name(body)
        if name not in self.scheduler_names:
            return OTHER_SCHEDULER, other_scheduler_message(key, name, self.scheduler_names)
        return None

    def _bind_budget(self, deadline: Deadline, keep: float = 0.0) -> float:
        """What one step of a bind may take: the rest of the deadline less `keep` (the part
        held back for the failure path), never past the deadline."""
        budget = deadline.remaining() - REPLY_MARGIN - keep
        if budget <= 0:
            raise BindBudgetSpent("the bind's time budget ran out")
        return budget

    async def _bind_failed(self, args: BindingArgs, deadline: Deadline) -> None:
        try:
            await self.accounting.ask(
                _phase_request(args, keys.PHASE_FAILED),
                BindPhaseReply,
                self._bind_budget(deadline),
            )
        except (AccountingUnavailable, BindBudgetSpent) as exc:
            # The lock expires by itself (NODE_LOCK_EXPIRY_SECONDS) when this is lost.
            log.warning("bind phase failed not recorded", extra={"error": str(exc)[:300]})

    def _record_event(self, args: BindingArgs, event_type: str, reason: str, message: str) -> None:
        pod = {"namespace": args.pod_namespace, "name": args.pod_name, "uid": args.pod_uid}
        self.events.record(pod, event_type, reason, message)


def _phase_request(args: BindingArgs, phase: str) -> BindPhaseRequest:
    """The bind-phase request for the pod a bind names: its UID, and its name, so that
    accounting refuses a UID that belongs to another pod before it writes anything."""
    return BindPhaseRequest(
        pod_uid=args.pod_uid,
        phase=phase,
        node=args.node,
        pod_namespace=args.pod_namespace,
        pod_name=args.pod_name,
        # `allocating`: accounting's write of the reservation is the pod's Binding itself.
        bind=phase == keys.PHASE_ALLOCATING,
    )
