"""One refit's way from the read model to a committed move: decide on the node's view, wait
for moves in flight that decide it, check a quota refusal against the quota as it is now,
commit through accounting's `move` at the revision decided on, recompute on `conflict`, and
tell whether a move whose answer was lost landed. Every step is bounded by the request's one
deadline (`Attempt`); nothing is committed after it."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared import codes
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core import keys
from shared.core.accounting import track_pod
from shared.core.nodes import usage_growth
from shared.core.pods import PodInfo
from shared.core.refit import RefitDecision, RefitInput, check_request, decide_refit
from shared.messages import MessageError, MoveReply, MoveRequest
from svc_refit.claims import with_claims
from svc_refit.outcomes import cut, failed, fit_reasons, from_accounting
from svc_refit.read_model import ReadModel, SnapshotRefused, View

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from shared.core.accounting import TrackedPod
    from shared.core.config import CoreConfig
    from shared.service.lifecycle import Deadline
    from svc_refit.metrics import RefitMetrics

log = logging.getLogger("numafit.refit")

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
class Attempt:
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


class Refitter:
    """Decides a refit on the read model and commits it through accounting."""

    def __init__(
        self,
        read_model: ReadModel,
        accounting: AccountingClient,
        config: CoreConfig,
        metrics: RefitMetrics,
    ) -> None:
        self.read_model = read_model
        self.accounting = accounting
        self.config = config
        self.metrics = metrics

    async def decide_and_commit(self, attempt: Attempt) -> RefitDecision:
        # Rows 1-5 need no state: decide them before asking anyone for anything.
        early = check_request(attempt.request)
        if early is not None:
            return early
        rounds = _Rounds()
        while True:
            if attempt.left() <= 0:
                return failed(Code.DEADLINE_EXCEEDED, "refit budget spent")
            outcome = await self._round(attempt, rounds)
            if outcome is not None:
                return outcome

    async def _round(self, attempt: Attempt, rounds: _Rounds) -> RefitDecision | None:
        """One decision on the node's view and, when it moves the pod, its commit; None to
        decide again (the node changed, or accounting answered `conflict`)."""
        request = attempt.request
        node, uid = request.node_name, request.pod_uid
        if self.read_model.moving(node, uid):
            # An earlier move of this pod is in flight (its requester gave up and asked
            # again, say): decide on the pod only once that move has settled.
            if await self._wait_change(attempt):
                return None
            return failed(Code.DEADLINE_EXCEEDED, "an earlier move of this pod is in flight")
        view = await self._view(attempt)
        if isinstance(view, RefitDecision):
            return view
        if view.pod is not None:
            attempt.pod_ref = {
                "namespace": view.pod.pod.namespace,
                "name": view.pod.pod.name,
                "uid": view.pod.uid,
            }
        decision = self._decide_on(request, view)
        if self._refused_by_claims(request, view, decision):
            # Refused only because of moves still in flight: wait for them to settle (one may
            # fail and give the capacity back) and decide again.
            return None if await self._wait_change(attempt) else decision
        if (
            decision.code is Code.QUOTA_EXCEEDED
            and not rounds.quota_checked
            and view.quota_at < attempt.started
        ):
            # Refuse by quota only on the quota as it is now, not as it was cached.
            rounds.quota_checked = True
            return None if await self._refresh_quota(attempt) else decision
        if decision.code is not Code.MOVED or view.pod is None:
            return decision
        outcome = await self._commit(attempt, view, decision)
        if outcome is not None:
            return outcome
        rounds.conflicts += 1
        if rounds.conflicts > MAX_CONFLICTS:
            return failed(Code.CONFLICT, f"the node kept changing ({rounds.conflicts} conflicts)")
        return None

    async def _wait_change(self, attempt: Attempt) -> bool:
        """Wait for the node's next change, keeping what a verify and a commit need."""
        wait = attempt.left() - verify_reserve(attempt.timeout) - MIN_COMMIT_BUDGET
        return await self.read_model.wait_change(attempt.request.node_name, wait)

    async def _view(self, attempt: Attempt) -> View | RefitDecision:
        """The node's view for the pod, or the refusal when accounting cannot give one."""
        request = attempt.request
        try:
            return await self.read_model.view(
                request.node_name,
                request.pod_uid,
                request.pod_namespace,
                attempt.deadline,
                attempt.reserve,
            )
        except SnapshotRefused as exc:
            return from_accounting(exc.code, f"accounting refused a snapshot: {exc}")
        except AccountingUnavailable as exc:
            code = Code.DEADLINE_EXCEEDED if attempt.left() <= 0 else Code.API_ERROR
            return failed(code, f"accounting unavailable: {cut(str(exc), 200)}")
        except MessageError as exc:
            return failed(Code.API_ERROR, f"bad snapshot from accounting: {cut(str(exc))}")

    def _refused_by_claims(self, request: RefitInput, view: View, decision: RefitDecision) -> bool:
        """Whether a no-fit or quota refusal is due only to other pods' moves in flight."""
        if decision.code not in (Code.NO_FIT, Code.QUOTA_EXCEEDED):
            return False
        if not self.read_model.claims(request.node_name, excluding=request.pod_uid):
            return False
        return self._decide_on(request, view, claims=False).code is Code.MOVED

    async def _refresh_quota(self, attempt: Attempt) -> bool:
        """Fetch the namespace's quota afresh; False when accounting could not tell."""
        request = attempt.request
        try:
            await self.read_model.refresh_quota(
                request.node_name, request.pod_namespace, attempt.deadline, attempt.reserve
            )
        except (AccountingUnavailable, SnapshotRefused, MessageError):
            return False
        return True

    def _decide_on(self, request: RefitInput, view: View, *, claims: bool = True) -> RefitDecision:
        usage = view.usage
        if usage is not None and claims:
            held = self.read_model.claims(request.node_name, excluding=request.pod_uid)
            if held:
                usage = with_claims(usage, held)
        pods = {view.pod.uid: view.pod} if view.pod is not None else {}
        return decide_refit(request, pods=pods, node=usage, quota=view.quota, config=self.config)

    async def _commit(
        self, attempt: Attempt, view: View, decision: RefitDecision
    ) -> RefitDecision | None:
        """Send the move; the decision's outcome, or None to recompute (`conflict`)."""
        request, tracked = attempt.request, view.pod
        assert tracked is not None
        assert decision.annotations is not None
        node = request.node_name
        margin = accounting_margin(attempt.timeout)
        wait = attempt.left() - verify_reserve(attempt.timeout)
        if wait - margin < MIN_COMMIT_BUDGET:
            return failed(Code.DEADLINE_EXCEEDED, "refit budget spent before commit")
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
            lost = cut(str(exc), 200)
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
        error = cut(reply.error or "commit refused", 300)
        if result is Code.CONFLICT:
            self.read_model.mark_stale(node)  # recompute on fresh state while the budget allows
            return None
        if result in codes.UNCERTAIN:
            # The write may have reached the API server before accounting gave up on it.
            return await self._verify(attempt, decision, result, error)
        if result in (Code.NO_FIT, Code.QUOTA_EXCEEDED):
            self.read_model.mark_stale(node)  # accounting saw usage we did not
        return from_accounting(
            result, error, fit_reasons(reply.fit_reasons), decision.previous_devices
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
        self, attempt: Attempt, decision: RefitDecision, code: Code, message: str
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
        return failed(code, message)


@dataclass
class _Rounds:
    """What one request's rounds keep from one to the next."""

    quota_checked: bool = False
    conflicts: int = 0


def _holds(entry: TrackedPod | None, request: RefitInput, decision: RefitDecision) -> bool:
    """Does the pod's entry hold what the decision would have written?"""
    assert decision.annotations is not None
    return (
        entry is not None
        and entry.node == request.node_name
        and entry.to_allocate == decision.annotations[keys.TO_ALLOCATE]
        and entry.allocated == decision.annotations[keys.ALLOCATED]
    )


def committed(
    tracked: TrackedPod, annotations: Mapping[str, str], resource_version: str
) -> TrackedPod | None:
    """The pod's entry once accounting wrote `annotations` at `resource_version`."""
    pod = tracked.pod
    merged = dict(pod.annotations)
    merged.update(annotations)
    updated = PodInfo(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        resource_version=resource_version,
        node_name=pod.node_name,
        phase=pod.phase,
        annotations=merged,
        containers=pod.containers,
        init_exit_codes=pod.init_exit_codes,
        deleting=pod.deleting,
    )
    return track_pod(updated, released=tracked.released)
