"""Accounting's writes of pods: guarded by the resourceVersion they were decided on, bounded
by the request's deadline, recorded as intents where the partition's next owner reads them, and
settled when their answer does not come.

Every write follows one rule: write the pod with a JSON merge patch (or the Binding that
carries the reservation) guarded by the resourceVersion it was decided on, bounded by the
caller's remaining deadline, and change the ledger only from what the API server returned. A
409 is raised as `Stale` for the operation to decide what it means. A write whose answer does
not come (a timeout, a reset connection, the server's 504) may still land, so its claim is not
dropped: it is settled before anything else happens on the node (`_settle`), by a guarded
write of accounting's own at the same resourceVersion (a fence), after which the late write can
never land.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from shared.codes import Code
from shared.core import keys
from shared.core.errors import CoreError
from shared.core.pods import PodInfo, pod_from_object
from shared.service import kube_io
from svc_accounting.intents import IntentUnavailable, intent_for
from svc_accounting.replies import Call, Refused, Stale, Unanswerable, bounded

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from shared.core.accounting import TrackedPod
    from shared.service.kube_io import Kube
    from svc_accounting.intents import IntentLog, Recorded, WriteIntent
    from svc_accounting.ledger import Ledger
    from svc_accounting.unbound import UnboundPods

log = logging.getLogger("numafit.accounting")

DEFAULT_WRITE_TIMEOUT = 2.0
"""Longest any single API write may take (HAMi bounds its refit patch the same way)."""
SEEN_WAIT = 0.2
"""Longest a write waits for the watch to show the pod accounting's Binding just wrote (its
resourceVersion, which the Binding's answer does not carry): the event usually comes within
milliseconds, and a write guarded by the version before would only conflict."""
MIN_WRITE_BUDGET = 0.02
"""Below this remaining budget a write is not attempted: it could only land after the caller
gave up (HAMi's post-timeout commit race, closed by construction)."""
SETTLE_SHARE = 0.25
SETTLE_ROOM = 0.25
"""A write that can be settled (move, bind-phase) leaves this share of the caller's remaining
budget, at most SETTLE_ROOM seconds, for settling it when its answer does not come: a fence
that lands at once gets its answer home in time."""
SETTLE_BACKOFF = 0.05
SETTLE_BACKOFF_MAX = 1.0
SETTLE_WARN_AFTER = 5.0
"""Seconds between warnings while a write cannot be settled (the API server is away)."""
MAX_REAPPLY = 5
"""Re-reads after a 409 on consume or bind-phase, at most (the caller's deadline usually ends
the loop first)."""

P = TypeVar("P")


class PodRef(Protocol):
    """What settling a write needs of its pod (a PodInfo, or a recorded WriteIntent)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def key(self) -> str: ...


def _everything(_: str) -> bool:
    return True


def binding_annotations(annotations: Mapping[str, str | None]) -> dict[str, str] | None:
    """The annotations a Binding can carry for this write, or None when it cannot: the API
    server merges a Binding's annotations over the pod's, so it sets values but removes none."""
    if any(value is None for value in annotations.values()):
        return None
    return {key: value for key, value in annotations.items() if value is not None}


class PodWrites:
    """The API server side of accounting's operations on pods: reads, guarded writes, and the
    settling of writes whose answer did not come. One per replica, beside its ledger."""

    def __init__(
        self,
        ledger: Ledger,
        kube: Kube,
        *,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        unbound: UnboundPods | None = None,
    ) -> None:
        self.ledger = ledger
        self.kube = kube
        self.write_timeout = write_timeout
        self.unbound = unbound
        """Unbound GPU pods as the pod watch shows them: a reserve reads its pod there."""
        self.serves: Callable[[str], bool] = _everything
        """Partitioned accounting: does this replica answer for (and write for) the node now?"""
        self.replica: str | None = None
        self.intents: IntentLog | None = None
        """Partitioned accounting: where each claim-carrying write's intent is recorded before
        it is sent, for the partition's next owner to settle (svc_accounting/intents.py)."""
        self.settling: set[str] = set()
        """Pods with a write being settled (`_settle`), by UID: a read of the pod waits for
        the outcome instead of answering what may not stay true."""
        self.on_settled: Callable[[str], None] | None = None
        """Told how each write whose answer did not come was settled (a metric)."""
        self.on_timing: Callable[[str, str, float], None] | None = None
        """Told how long each answered API write took: (`write`, patch|binding, seconds)."""
        self._seen: dict[str, asyncio.Event] = {}
        """Writes waiting for the event of a pod accounting's Binding wrote (`_current`)."""
        self.seen_wait = SEEN_WAIT
        ledger.on_seen = self.on_seen

    def _timed(self, step: str, what: str, seconds: float) -> None:
        if self.on_timing is not None:
            self.on_timing(step, what, seconds)

    def budget(self, call: Call, settle: bool = False) -> float:
        """Seconds the next API call may take: what is left of the caller's deadline (anchored
        when the request arrived), at most the cap; with `settle`, less the time kept for
        settling the write should its answer not come. Refuses when too little is left for a
        call to land before the caller gives up."""
        deadline = call.deadline
        if deadline is None:
            return self.write_timeout
        remaining = deadline.remaining()
        if settle:
            remaining -= min(remaining * SETTLE_SHARE, SETTLE_ROOM)
        budget = min(remaining, self.write_timeout)
        if budget < MIN_WRITE_BUDGET:
            raise Refused(
                Code.DEADLINE_EXCEEDED, f"only {int(budget * 1000)} ms of the caller's budget left"
            )
        return budget

    def observe(self, call: Call, pod: PodInfo) -> set[str]:
        changed = self.ledger.observe(pod)
        call.note(changed)
        return changed

    def forget(self, call: Call, uid: str) -> None:
        call.note(self.ledger.forget(uid))

    async def patch(
        self,
        call: Call,
        pod: PodInfo,
        annotations: Mapping[str, str | None],
        *,
        settle: bool = False,
        bind_to: str = "",
    ) -> tuple[PodInfo, set[str]]:
        """One guarded write, then the ledger follows what the server returned. A 409 is
        raised as `_Stale` for the caller to decide what it means. With `settle` (a write that
        claims capacity), the write's intent is recorded first where the partition's next
        owner reads it (svc_accounting/intents.py), and a write whose answer does not come in
        time is settled before anything else happens on the node (`_settle`): the reply then
        says what became of it. With `bind_to` (a node) and the pod not bound yet, the write is
        the pod's Binding to that node, carrying the annotations under the same precondition."""
        pod = await self._current(pod, self.budget(call, settle))
        budget = self.budget(call, settle)
        node = call.node
        if node and not self.serves(node):
            # The lease on the node's partition is past its renew deadline: another replica may
            # own it any moment, so nothing is written from here any more.
            raise Refused(
                Code.NODE_UNAVAILABLE,
                f"this accounting replica no longer owns node {node}'s partition; retry",
            )
        started = time.monotonic()
        intent = await self._intend(pod, node, budget) if settle else None
        try:
            left = budget - (time.monotonic() - started)
            if left < MIN_WRITE_BUDGET:
                raise Refused(
                    Code.DEADLINE_EXCEEDED,
                    f"only {int(left * 1000)} ms of the caller's budget left after recording the "
                    "write's intent; nothing was written",
                )
            epoch = self.ledger.epoch_of(node) if node else ""
            return await self._send(call, pod, annotations, left, settle, epoch, bind_to)
        except asyncio.CancelledError:
            intent = None  # outcome unknown: left for whoever takes the partition over next
            raise
        finally:
            if intent is not None and self.intents is not None:
                self.intents.clear(intent)

    async def _current(self, pod: PodInfo, budget: float) -> PodInfo:
        """The version of `pod` to guard a write by. Just after accounting's own Binding the
        ledger holds the Binding's guard (its answer carried no pod), which would only
        conflict: the watch's event of the written pod is waited for, briefly, and the write
        is guarded by it when nothing the write was planned on changed; else by the old one,
        and its 409 says so (re-read, as for any conflict)."""
        if self.ledger.unseen.get(pod.uid) != pod.resource_version:
            return pod
        event = self._seen.setdefault(pod.uid, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(self.seen_wait, budget / 4)):
                await event.wait()
        if not event.is_set():
            self._seen.pop(pod.uid, None)
        fresh = self.ledger.tracked(pod.uid)
        if fresh is None or (fresh.pod.annotations, fresh.pod.node_name) != (
            pod.annotations,
            pod.node_name,
        ):
            return pod
        return fresh.pod

    def on_seen(self, uid: str) -> None:
        event = self._seen.pop(uid, None)
        if event is not None:
            event.set()

    async def _intend(self, pod: PodInfo, node: str, budget: float) -> Recorded | None:
        """Record the write's intent (partitioned accounting only); its key. Refused with
        `node_unavailable` when the bucket does not take it: unrecorded, a write that lands
        late would be invisible to the next owner, so it is not sent."""
        k = self.ledger.partition(node) if node else None
        if self.intents is None or k is None:
            return None
        try:
            return await self.intents.record(
                k,
                intent_for(
                    pod.namespace,
                    pod.name,
                    pod.uid,
                    node,
                    pod.resource_version,
                    self.replica or "accounting",
                ),
                budget / 2,
            )
        except IntentUnavailable as exc:
            raise Refused(Code.NODE_UNAVAILABLE, f"{exc}; nothing was written, retry") from exc

    async def _send(
        self,
        call: Call,
        pod: PodInfo,
        annotations: Mapping[str, str | None],
        budget: float,
        settle: bool,
        epoch: str,
        bind_to: str = "",
    ) -> tuple[PodInfo, set[str]]:
        carried = binding_annotations(annotations) if bind_to and not pod.node_name else None
        sent = time.monotonic()
        try:
            async with asyncio.timeout(budget):
                if carried is not None:
                    await self.kube.create_binding(
                        pod.namespace,
                        pod.name,
                        pod.uid,
                        bind_to,
                        annotations=carried,
                        resource_version=pod.resource_version,
                    )
                    self._timed("write", "binding", time.monotonic() - sent)
                    bound = dataclasses.replace(
                        pod, node_name=bind_to, annotations={**pod.annotations, **carried}
                    )
                    changed = self.ledger.observe_bound(bound)
                    call.note(changed)
                    return bound, changed
                body = await self.kube.patch_pod_annotations(
                    pod.namespace, pod.name, annotations, pod.resource_version
                )
                self._timed("write", "patch", time.monotonic() - sent)
        except TimeoutError as exc:
            if settle:
                return await self._settle(call, pod, annotations, budget, epoch)
            raise Refused(
                Code.DEADLINE_EXCEEDED, f"patch of pod {pod.key} did not finish in {budget:.3f}s"
            ) from exc
        except kube_io.Conflict as exc:
            raise Stale(str(exc)) from exc
        except kube_io.NotFound as exc:
            self.forget(call, pod.uid)
            raise Refused(Code.POD_NOT_TRACKED, f"pod {pod.key} no longer exists") from exc
        except kube_io.KubeError as exc:
            if settle and exc.outcome_unknown:
                # No answer after the request left (a reset connection, the server's 504):
                # it may still be committed, so it is settled like a timeout.
                return await self._settle(call, pod, annotations, budget, epoch, cause=str(exc))
            raise Refused(Code.API_ERROR, f"cannot patch pod annotations: {exc}") from exc
        try:
            written = pod_from_object(body)
        except CoreError as exc:
            raise Refused(
                Code.API_ERROR, f"the API server returned an unusable pod: {exc}"
            ) from exc
        return written, self.observe(call, written)

    async def _settle(
        self,
        call: Call,
        pod: PodInfo,
        annotations: Mapping[str, str | None],
        waited: float,
        epoch: str,
        *,
        cause: str | None = None,
    ) -> tuple[PodInfo, set[str]]:
        """A write's answer did not come within `waited` seconds: the API server may still
        commit it. Its claim must not be dropped while it may land, so it is settled now, with
        the node's lock held (nothing else is decided on the node meanwhile): a guarded write
        of accounting's own at the same resourceVersion either lands, and then the late write
        can never land (its precondition fails), or conflicts, and then a read shows whether
        the late write landed. Tried until settled (the API server may be down): the caller's
        deadline has passed, and the answer says what is known."""
        # One write per node at a time (the node's lock), so one settle per pod at a time.
        self.settling.add(pod.uid)
        try:
            now, fenced = await self._fence_at(call, pod, pod.resource_version)
            if not fenced:
                # The fence conflicted: the pod changed after the write was sent. Whether the
                # write is what landed, the pod as read tells.
                return self._landed_or_not(call, pod, now, annotations, waited, epoch)
        finally:
            self.settling.discard(pod.uid)
        self.observe(call, now)
        self._settled("fenced")
        what = f"did not finish in {waited:.3f}s" if cause is None else f"failed ({cause})"
        raise Refused(
            Code.DEADLINE_EXCEEDED if cause is None else Code.API_ERROR,
            bounded(
                f"patch of pod {pod.key} {what}; fenced at resourceVersion "
                f"{pod.resource_version}: it did not land and never will"
            ),
        )

    async def settle_intent(self, intent: WriteIntent) -> str:
        """A takeover's first duty for each write the partition's previous owner (or an
        earlier run) recorded and may not have seen answered: end it. A guarded write of this
        replica's own at the intent's resourceVersion either lands (the late write can never
        land now) or conflicts (the pod moved on: the write landed, or another did, and can
        no longer); the pod as it then is goes into the ledger. Retried until the API server
        answers (the caller bounds it: the partition is not served meanwhile). The outcome:
        `fenced`, `superseded` or `gone`."""
        call = Call()  # no request: the takeover's own
        try:
            now, fenced = await self._fence_at(call, intent, intent.resource_version)
        except Refused:
            return "gone"  # deleted or recreated: nothing of it can land
        self.observe(call, now)
        outcome = "fenced" if fenced else "superseded"
        self._settled(outcome)
        return outcome

    async def _fence_at(
        self, call: Call, pod: PodRef, resource_version: str
    ) -> tuple[PodInfo, bool]:
        """A guarded write of accounting's own (a fence) at `resource_version`, retried until
        answered: (the pod it left, True) when it landed (a late write guarded by that version
        can never land now), else (the pod as read after its 409, False). A pod deleted or
        recreated meanwhile is refused (`pod_not_tracked`)."""
        fence = self._fence()
        fenced = await self._until_answered(
            call,
            pod,
            lambda: self.kube.patch_pod_annotations(
                pod.namespace, pod.name, fence, resource_version
            ),
        )
        if fenced is not None:
            return fenced, True
        fresh = await self._until_answered(
            call, pod, lambda: self.kube.get_pod(pod.namespace, pod.name)
        )
        if fresh is None:  # pragma: no cover - a read never conflicts
            raise AssertionError("a read answered 409")
        return fresh, False

    def _fence(self) -> dict[str, str | None]:
        """The annotation a fencing write sets (who fenced, when): a write of its own that
        changes the resourceVersion a late write was guarded on."""
        return {keys.WRITE_FENCE: f"{self.replica or 'accounting'}:{time.time():.3f}"}

    async def _until_answered(
        self, call: Call, pod: PodRef, request: Callable[[], Awaitable[dict[str, Any]]]
    ) -> PodInfo | None:
        """`request` (a write or a read of `pod`) retried with backoff until the API server
        answers: the pod it returns, None on a 409; a pod deleted or recreated meanwhile is
        refused (`pod_not_tracked`), its write can no longer land."""
        backoff = SETTLE_BACKOFF
        since = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(self.write_timeout):
                    body = await request()
                answered = pod_from_object(body)
            except kube_io.Conflict:
                return None
            except kube_io.NotFound as exc:
                self.forget(call, pod.uid)
                self._settled("gone")
                raise Refused(
                    Code.POD_NOT_TRACKED, f"pod {pod.key} was deleted; its write cannot land"
                ) from exc
            except (TimeoutError, kube_io.KubeError, CoreError) as exc:
                if time.monotonic() - since > SETTLE_WARN_AFTER:
                    since = time.monotonic()
                    log.warning(
                        "a write whose answer did not come is not settled yet; the node waits",
                        extra={"pod": pod.key, "error": bounded(repr(exc))},
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, SETTLE_BACKOFF_MAX)
                continue
            if answered.uid != pod.uid:
                self.forget(call, pod.uid)
                self._settled("gone")
                raise Refused(Code.POD_NOT_TRACKED, f"pod {pod.key} was recreated")
            return answered

    def _landed_or_not(
        self,
        call: Call,
        pod: PodInfo,
        fresh: PodInfo,
        annotations: Mapping[str, str | None],
        waited: float,
        epoch: str,
    ) -> tuple[PodInfo, set[str]]:
        """The pod as read after the fence conflicted: did the write land? While this replica
        kept the node's partition, only its own writes change these annotations (one at a
        time, under the node's lock), so annotations other than the write's mean it did not
        land. Once the partition changed hands, another owner may have written over it."""
        changed = self.observe(call, fresh)
        if all(fresh.annotations.get(k) == v for k, v in annotations.items()):
            self._settled("landed")
            log.info(
                "a write whose answer did not come landed",
                extra={"pod": pod.key, "waited_s": round(waited, 3)},
            )
            return fresh, changed
        node = call.node
        if node and (not self.serves(node) or self.ledger.epoch_of(node) != epoch):
            self._settled("unknown")
            raise Unanswerable(pod.key)
        self._settled("changed")
        raise Refused(
            Code.CONFLICT,
            f"patch of pod {pod.key} did not finish in {waited:.3f}s and did not land: "
            "the pod changed meanwhile",
        )

    def _settled(self, outcome: str) -> None:
        if self.on_settled is not None:
            self.on_settled(outcome)

    async def patch_pod(
        self, call: Call, pod: PodInfo, annotations: Mapping[str, str | None]
    ) -> tuple[PodInfo, set[str]]:
        """A write whose decision the caller made (reserve, move): a 409 means that decision
        rests on a pod that changed, so it is refused with `conflict` after the pod is re-read
        (the caller's next computation then sees the newer state)."""
        try:
            return await self.patch(call, pod, annotations, settle=True)
        except Stale as exc:
            await self.refresh(call, pod)
            raise Refused(Code.CONFLICT, f"cannot patch pod annotations: {exc}") from exc

    async def write_rereading(
        self,
        call: Call,
        name: str,
        tracked: TrackedPod,
        plan: Callable[[TrackedPod], P],
        annotations_of: Callable[[P], Mapping[str, str | None]],
        unchanged: Callable[[TrackedPod, TrackedPod], bool],
        *,
        settle: bool = False,
        bind_to: str = "",
    ) -> tuple[TrackedPod, P, PodInfo, set[str]]:
        """Plan and write; on a 409 re-read the pod and, while `unchanged(first, fresh)` holds,
        plan and write again (bounded by the caller's deadline and MAX_REAPPLY). `bind_to`:
        as `_patch`'s (a pod found bound meanwhile is written to, not bound again)."""
        first = current = tracked
        planned = plan(current)
        for attempt in range(MAX_REAPPLY + 1):
            try:
                written, changed = await self.patch(
                    call, current.pod, annotations_of(planned), settle=settle, bind_to=bind_to
                )
            except Stale as exc:
                fresh = await self.reread(call, current.pod)
                if (
                    fresh is None
                    or fresh.node != name
                    or not unchanged(first, fresh)
                    or attempt == MAX_REAPPLY
                ):
                    raise Refused(Code.CONFLICT, f"cannot patch pod annotations: {exc}") from exc
                current = fresh
                planned = plan(current)
                continue
            return current, planned, written, changed
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def reread(self, call: Call, pod: PodInfo) -> TrackedPod | None:
        """The pod as the API server has it now, applied to the ledger; None when it is gone
        (or was recreated under the same name). Bounded by the caller's budget."""
        budget = self.budget(call)
        try:
            async with asyncio.timeout(budget):
                body = await self.kube.get_pod(pod.namespace, pod.name)
        except TimeoutError as exc:
            raise Refused(Code.DEADLINE_EXCEEDED, f"re-reading pod {pod.key} timed out") from exc
        except kube_io.NotFound:
            self.forget(call, pod.uid)
            return None
        except kube_io.KubeError as exc:
            raise Refused(Code.API_ERROR, f"cannot re-read pod {pod.key}: {exc}") from exc
        try:
            fresh = pod_from_object(body)
        except CoreError as exc:
            raise Refused(
                Code.API_ERROR, f"the API server returned an unusable pod: {exc}"
            ) from exc
        if fresh.uid != pod.uid:
            self.forget(call, pod.uid)
            return None
        self.observe(call, fresh)
        return self.ledger.tracked(pod.uid)

    async def refresh(self, call: Call, pod: PodInfo) -> None:
        """Re-read a pod after a conflict, best effort (the watch delivers the newer object
        anyway when there is no time left)."""
        try:
            await self.reread(call, pod)
        except Refused as exc:
            log.warning("pod refresh failed", extra={"pod": pod.key, "error": bounded(str(exc))})

    def watched_unbound(self, uid: str, namespace: str, name: str) -> PodInfo | None:
        """The pod as the watch last showed it, unbound, when accounting knows no newer
        version (its own writes, a held reservation's pod); None: read it from the API."""
        if self.unbound is None:
            return None
        tracked = self.ledger.tracked(uid)
        hold = self.ledger.held.get(uid)
        known = [p.pod.resource_version for p in (tracked, hold) if p is not None]
        return self.unbound.get(uid, namespace, name, known=known)

    async def read_pod(self, call: Call, namespace: str, name: str) -> PodInfo:
        budget = self.budget(call)
        try:
            async with asyncio.timeout(budget):
                return pod_from_object(await self.kube.get_pod(namespace, name))
        except TimeoutError as exc:
            raise Refused(Code.DEADLINE_EXCEEDED, f"reading pod {namespace}/{name}") from exc
        except kube_io.NotFound as exc:
            raise Refused(Code.POD_NOT_TRACKED, f"pod {namespace}/{name} does not exist") from exc
        except kube_io.KubeError as exc:
            raise Refused(Code.API_ERROR, str(exc)) from exc
        except CoreError as exc:
            raise Refused(
                Code.API_ERROR, f"the API server returned an unusable pod: {exc}"
            ) from exc
