"""Accounting operations: reserve, bind-phase, move, consume, pending, snapshot, register.

Every write follows one rule: decide under the node's lock, write the pod (or Node) with a JSON
merge patch carrying the resourceVersion it was decided on, bounded by the caller's remaining
deadline, and change the ledger only from what the API server returned.

Accounting is the single writer, so it judges every `reserve` and `move` itself, whoever asks:
the fit is re-checked on its own ledger (`shared.core.commit_check`) and an over-commit is
refused with `no_fit` (or `quota_exceeded`) and HAMi's reason names in `fitReasons`.

A 409 on `move` or `reserve` is reported (`conflict`): the caller's decision rests on a pod that
changed. A 409 on `consume` or `bind-phase` is not the caller's fault (the Binding, or kubelet's
status writes, moved the pod's resourceVersion before the watch caught up): the pod is re-read
and, when what the operation depends on is unchanged, the write is planned and applied again,
within the caller's deadline.

Requests never create state: an operation on a node the ledger does not know (nodes enter only
from the Node list and watch, or a pod bound there) is answered without touching anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol, TypedDict, TypeVar

import msgspec

from shared import messages, subjects
from shared.codes import Code
from shared.core import codec, keys
from shared.core.commit_check import check_commit
from shared.core.consume import ConsumeError, ConsumePlan, consumed_entry, plan_consume
from shared.core.errors import CoreError
from shared.core.pods import PodInfo, pod_from_object
from shared.messages import (
    AccountingReply,
    AccountingRequest,
    BindPhaseReply,
    BindPhaseRequest,
    ConsumeReply,
    ConsumeRequest,
    MessageError,
    MoveReply,
    MoveRequest,
    NodeStateWire,
    PendingPod,
    PendingReply,
    PendingRequest,
    QuotaWire,
    RegisterReply,
    RegisterRequest,
    ReserveReply,
    ReserveRequest,
    SnapshotReply,
    SnapshotRequest,
    TrackedPodWire,
)
from shared.service import kube_io
from shared.service.lifecycle import Deadline
from shared.subjects import InvalidName, shown
from svc_accounting.intents import IntentUnavailable, intent_for
from svc_accounting.ledger import Ledger, NodeLedger, allocating_pod, pending_pod

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from shared.core.accounting import Rows, TrackedPod
    from shared.core.model import ContainerEntry, ContainerKind
    from shared.service.kube_io import Kube
    from svc_accounting.intents import IntentLog, Recorded, WriteIntent
    from svc_accounting.unbound import UnboundPods

log = logging.getLogger("numafit.accounting")

DEFAULT_WRITE_TIMEOUT = 2.0
"""Longest any single API write may take (HAMi bounds its refit patch the same way)."""
DEFAULT_RESERVATION_TTL = 30.0
"""Seconds a filter's reservation is held without a bind (kube-scheduler binds within
milliseconds of its filter, or seconds behind a Permit plugin; a lost bind must not hold GPUs
for long)."""
SNAPSHOT_PAGE = 200
SNAPSHOT_PAGE_MAX = 500
"""Nodes per `_all` snapshot page: 200 nodes of 8 GPUs and no pods is about 300 KiB."""
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
MAX_ERROR_LENGTH = 300
"""Error texts in replies (and log lines) are cut to this many characters."""
NO_WRITE_OPS = frozenset({"pending", "snapshot"})
"""Operations that change nothing: served without the node's lock."""
HOLD_OPS = frozenset({"reserve"})
"""Operations that write nothing to the API server but decide on the node's free capacity:
served beside another pod's write on the node (a bind-phase's Binding, a consume) under the
node's *capacity* lock only, which the operations that change capacity by a decision (move,
register) hold too. A bind-phase or consume changes no capacity (the hold it writes is
counted already; a consume's drift records what kubelet did), so a reserve need not wait for
its API round trip: kube-scheduler's one-pod-at-a-time filter would."""
CAPACITY_OPS = frozenset({*HOLD_OPS, "move", "register"})
UNLOCKED_NODE_OPS = frozenset({*NO_WRITE_OPS, "register"})
"""Operations allowed on a node the ledger does not know (reads answer empty; register's
Node object is what brings a node in)."""


_DEADLINE: ContextVar[Deadline | None] = ContextVar("numafit_accounting_deadline", default=None)
"""The current request's deadline (each request runs in its own task, with its own context)."""
_OBSERVED: ContextVar[set[str] | None] = ContextVar("numafit_accounting_observed", default=None)
_NODE: ContextVar[str] = ContextVar("numafit_accounting_node", default="")
"""The node the current request is for (its writes are allowed only while this replica owns
the node's partition)."""
"""Nodes whose ledger changed while serving the current request (writes and re-reads)."""

P = TypeVar("P")


class _PodRef(Protocol):
    """What settling a write needs of its pod (a PodInfo, or a recorded WriteIntent)."""

    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def key(self) -> str: ...


class _Addressed(msgspec.Struct, frozen=True):
    """A request's `node` of any type, read only when the typed decode failed: so that the
    subject, the node name and whether accounting knows the node are judged first, as for a
    readable request (a body this cannot read is not a JSON object at all)."""

    node: object = None


_ADDRESSED: Final = msgspec.json.Decoder(_Addressed)


class _Head(TypedDict):
    """The fields every accounting reply starts with."""

    ok: bool
    code: str
    epoch: str
    node: str | None
    revision: int | None


def bounded(message: str, limit: int = MAX_ERROR_LENGTH) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


class Refused(Exception):
    """An operation refused with a DESIGN.md code (`fit_reasons`, HAMi's reason names with
    counts, go into a reserve or move reply)."""

    def __init__(
        self, code: Code, message: str, *, fit_reasons: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.fit_reasons = fit_reasons


class ReadTooLate(Exception):
    """The request's deadline had passed before it was read: its caller gave up on it, and
    another replica may have answered it while this one was paused, so it gets no answer."""


class Unanswerable(Exception):
    """Nothing true can be said any more: this replica lost the node's partition while it
    settled a write (it was paused), and the pod changed meanwhile, so whether its write
    landed before that is not known here. No answer (the caller's deadline has long passed);
    the next owner's ledger, built from the API server, has what landed."""


class _Stale(Exception):
    """409: the pod changed since the resourceVersion the write was based on."""


@dataclass
class Outcome:
    reply: AccountingReply
    changed: set[str]

    @property
    def code(self) -> Code:
        return Code(self.reply.code)


def _everything(_: str) -> bool:
    return True


def _binding_annotations(annotations: Mapping[str, str | None]) -> dict[str, str] | None:
    """The annotations a Binding can carry for this write, or None when it cannot: the API
    server merges a Binding's annotations over the pod's, so it sets values but removes none."""
    if any(value is None for value in annotations.values()):
        return None
    return {key: value for key, value in annotations.items() if value is not None}


def _holds_reservation(pod: PodInfo, node: str, allocated: str) -> bool:
    """Does the pod already carry exactly this reservation, not yet bound?"""
    annotations = pod.annotations
    return (
        annotations.get(keys.VGPU_NODE) == node
        and annotations.get(keys.TO_ALLOCATE) == allocated
        and annotations.get(keys.ALLOCATED) == allocated
        and keys.BIND_PHASE not in annotations
        and keys.BIND_TIME not in annotations
        and keys.VGPU_TIME in annotations
    )


def _pending_entry(tracked: TrackedPod, index: int) -> ContainerEntry | None:
    rows = tracked.pending_rows
    return rows[index] if rows is not None and 0 <= index < len(rows) else None


def deadline_of(request: AccountingRequest, received: float | None) -> Deadline | None:
    """The request's deadline on this replica's monotonic clock: the earlier of `deadlineMs`
    counted from when the request was received (not from when it is served: a request kept
    through a takeover has less time left) and `deadlineAtMs`, the caller's absolute deadline
    (which also covers the time the request spent unread, in a paused process's socket)."""
    now = time.monotonic()
    found: list[float] = []
    if request.deadline_ms is not None:
        found.append((now if received is None else received) + request.deadline_ms / 1000.0)
    if request.deadline_at_ms is not None:
        found.append(now + request.deadline_at_ms / 1000.0 - time.time())
    return Deadline(min(found)) if found else None


def _refuse_late(deadline: Deadline, op: str) -> NoReturn:
    """A request whose deadline has passed changes nothing: its caller gave up on it."""
    late = time.monotonic() - deadline.at
    raise Refused(
        Code.DEADLINE_EXCEEDED,
        f"the {op} request reached its deadline before it was served ({late * 1000:.0f} ms "
        "late: a paused replica, a takeover, or clocks apart); nothing was done",
    )


class Operations:
    def __init__(
        self,
        ledger: Ledger,
        kube: Kube,
        *,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        reservation_ttl: float = DEFAULT_RESERVATION_TTL,
        on_drift: Callable[[str, PodInfo, str], None] | None = None,
        unbound: UnboundPods | None = None,
    ) -> None:
        self.ledger = ledger
        self.kube = kube
        self.unbound = unbound
        """Unbound GPU pods as the pod watch shows them: a reserve reads its pod there."""
        self.write_timeout = write_timeout
        self.reservation_ttl = reservation_ttl
        """Seconds a held reservation waits for its bind before it is released."""
        self.locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self.capacity_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.binding: set[str] = set()
        """Pods whose bind-phase write is under way, by UID: a reserve of one waits its turn."""
        """One lock per node while anyone holds or waits for it: the map never keeps a lock
        nobody uses, so neither made-up nor deleted nodes leave one behind."""
        self.on_drift = on_drift
        self.serves: Callable[[str], bool] = _everything
        """Partitioned accounting: does this replica answer for (and write for) the node now?"""
        self.replica: str | None = None
        self.served_partitions: Callable[[], tuple[int, ...]] | None = None
        self.settling: set[str] = set()
        """Pods with a write being settled (`_settle`), by UID: a read of the pod waits for
        the outcome instead of answering what may not stay true."""
        self.on_settled: Callable[[str], None] | None = None
        """Told how each write whose answer did not come was settled (a metric)."""
        self.on_late: Callable[[], None] | None = None
        """Told of each request refused because its deadline had passed (a metric)."""
        self._seen: dict[str, asyncio.Event] = {}
        """Writes waiting for the event of a pod accounting's Binding wrote (`_current`)."""
        self.seen_wait = SEEN_WAIT
        ledger.on_seen = self._on_seen
        self.on_timing: Callable[[str, str, float], None] | None = None
        """Told how long each step took (a metric): (`node_wait`, op, seconds) for the wait for
        the node's lock, (`write`, patch|binding, seconds) for each API write, (`operation`,
        op, seconds) from a request's arrival to its answer."""
        self.intents: IntentLog | None = None
        """Partitioned accounting: where each claim-carrying write's intent is recorded before
        it is sent, for the partition's next owner to settle (svc_accounting/intents.py)."""

    # --- helpers ----------------------------------------------------------------------------

    def lock(self, name: str, *, capacity: bool = False) -> asyncio.Lock:
        """The node's lock (one operation that may write at a time), or with `capacity` its
        capacity lock (one decision on its free capacity at a time: HOLD_OPS, CAPACITY_OPS)."""
        locks = self.capacity_locks if capacity else self.locks
        lock = locks.get(name)
        if lock is None:
            lock = asyncio.Lock()
            locks[name] = lock
        return lock

    def busy(self) -> list[tuple[str, asyncio.Lock]]:
        """Every node lock and capacity lock held now, with its node."""
        return [
            (name, lock)
            for locks in (self.locks, self.capacity_locks)
            for name, lock in list(locks.items())
            if lock.locked()
        ]

    @contextlib.asynccontextmanager
    async def _locked(
        self, name: str, deadline: Deadline | None, op: str, *, capacity: bool = False
    ) -> AsyncIterator[None]:
        """The node's lock (or its capacity lock), waited for no longer than the request's
        deadline, which is checked again once it is held: a request is never acted on after
        its caller gave up."""
        lock = self.lock(name, capacity=capacity)
        waited = time.monotonic()
        try:
            async with asyncio.timeout(None if deadline is None else deadline.remaining()):
                await lock.acquire()
            self._timing("node_wait", op, time.monotonic() - waited)
        except TimeoutError as exc:
            self._late()
            raise Refused(
                Code.DEADLINE_EXCEEDED,
                f"node {name} stayed busy until the {op} request's deadline; nothing was done",
            ) from exc
        try:
            if deadline is not None and deadline.expired:
                self._late()
                _refuse_late(deadline, op)
            yield
        finally:
            lock.release()

    def _late(self) -> None:
        if self.on_late is not None:
            self.on_late()

    def _timing(self, step: str, what: str, seconds: float) -> None:
        if self.on_timing is not None:
            self.on_timing(step, what, seconds)

    def _ok(self, node: NodeLedger | None) -> _Head:
        """A success's head: the node's name and revision when accounting knows it."""
        return _Head(
            ok=True,
            code=Code.OK,
            epoch=self.ledger.epoch if node is None else self.ledger.epoch_of(node.name),
            node=None if node is None else node.name,
            revision=None if node is None else node.revision,
        )

    def _known(self, name: str) -> NodeLedger:
        node = self.ledger.get(name)
        if node is None:
            raise Refused(Code.NODE_UNAVAILABLE, f"node {name} is not known to accounting")
        return node

    def _budget(self, settle: bool = False) -> float:
        """Seconds the next API call may take: what is left of the caller's deadline (anchored
        when the request arrived), at most the cap; with `settle`, less the time kept for
        settling the write should its answer not come. Refuses when too little is left for a
        call to land before the caller gives up."""
        deadline = _DEADLINE.get()
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

    def _observe(self, pod: PodInfo) -> set[str]:
        changed = self.ledger.observe(pod)
        self._note(changed)
        return changed

    def _forget(self, uid: str) -> None:
        self._note(self.ledger.forget(uid))

    @staticmethod
    def _note(changed: set[str]) -> None:
        observed = _OBSERVED.get()
        if observed is not None:
            observed |= changed

    async def _patch(
        self,
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
        pod = await self._current(pod, self._budget(settle))
        budget = self._budget(settle)
        node = _NODE.get()
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
            return await self._send(pod, annotations, left, settle, epoch, bind_to)
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

    def _on_seen(self, uid: str) -> None:
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
        pod: PodInfo,
        annotations: Mapping[str, str | None],
        budget: float,
        settle: bool,
        epoch: str,
        bind_to: str = "",
    ) -> tuple[PodInfo, set[str]]:
        carried = _binding_annotations(annotations) if bind_to and not pod.node_name else None
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
                    self._timing("write", "binding", time.monotonic() - sent)
                    bound = dataclasses.replace(
                        pod, node_name=bind_to, annotations={**pod.annotations, **carried}
                    )
                    changed = self.ledger.observe_bound(bound)
                    self._note(changed)
                    return bound, changed
                body = await self.kube.patch_pod_annotations(
                    pod.namespace, pod.name, annotations, pod.resource_version
                )
                self._timing("write", "patch", time.monotonic() - sent)
        except TimeoutError as exc:
            if settle:
                return await self._settle(pod, annotations, budget, epoch)
            raise Refused(
                Code.DEADLINE_EXCEEDED, f"patch of pod {pod.key} did not finish in {budget:.3f}s"
            ) from exc
        except kube_io.Conflict as exc:
            raise _Stale(str(exc)) from exc
        except kube_io.NotFound as exc:
            self._forget(pod.uid)
            raise Refused(Code.POD_NOT_TRACKED, f"pod {pod.key} no longer exists") from exc
        except kube_io.KubeError as exc:
            if settle and exc.outcome_unknown:
                # No answer after the request left (a reset connection, the server's 504):
                # it may still be committed, so it is settled like a timeout.
                return await self._settle(pod, annotations, budget, epoch, cause=str(exc))
            raise Refused(Code.API_ERROR, f"cannot patch pod annotations: {exc}") from exc
        try:
            written = pod_from_object(body)
        except CoreError as exc:
            raise Refused(
                Code.API_ERROR, f"the API server returned an unusable pod: {exc}"
            ) from exc
        return written, self._observe(written)

    async def _settle(
        self,
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
        fence = self._fence()
        # One write per node at a time (the node's lock), so one settle per pod at a time.
        self.settling.add(pod.uid)
        try:
            fenced = await self._until_answered(
                pod,
                lambda: self.kube.patch_pod_annotations(
                    pod.namespace, pod.name, fence, pod.resource_version
                ),
            )
            if fenced is None:
                # The fence conflicted: the pod changed after the write was sent. Whether the
                # write is what landed, a read tells.
                fresh = await self._until_answered(
                    pod, lambda: self.kube.get_pod(pod.namespace, pod.name)
                )
                if fresh is None:  # pragma: no cover - a read never conflicts
                    raise AssertionError("a read answered 409")
                return self._landed_or_not(pod, fresh, annotations, waited, epoch)
        finally:
            self.settling.discard(pod.uid)
        self._observe(fenced)
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
        fence = self._fence()
        try:
            fenced = await self._until_answered(
                intent,
                lambda: self.kube.patch_pod_annotations(
                    intent.namespace, intent.name, fence, intent.resource_version
                ),
            )
            if fenced is None:
                fresh = await self._until_answered(
                    intent, lambda: self.kube.get_pod(intent.namespace, intent.name)
                )
                if fresh is None:  # pragma: no cover - a read never conflicts
                    raise AssertionError("a read answered 409")
                self._observe(fresh)
                self._settled("superseded")
                return "superseded"
        except Refused:
            return "gone"  # deleted or recreated: nothing of it can land
        self._observe(fenced)
        self._settled("fenced")
        return "fenced"

    def _fence(self) -> dict[str, str | None]:
        """The annotation a fencing write sets (who fenced, when): a write of its own that
        changes the resourceVersion a late write was guarded on."""
        return {keys.WRITE_FENCE: f"{self.replica or 'accounting'}:{time.time():.3f}"}

    async def _until_answered(
        self, pod: _PodRef, call: Callable[[], Awaitable[dict[str, Any]]]
    ) -> PodInfo | None:
        """`call` (a write or a read of `pod`) retried with backoff until the API server
        answers: the pod it returns, None on a 409; a pod deleted or recreated meanwhile is
        refused (`pod_not_tracked`), its write can no longer land."""
        backoff = SETTLE_BACKOFF
        since = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(self.write_timeout):
                    body = await call()
                answered = pod_from_object(body)
            except kube_io.Conflict:
                return None
            except kube_io.NotFound as exc:
                self._forget(pod.uid)
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
                self._forget(pod.uid)
                self._settled("gone")
                raise Refused(Code.POD_NOT_TRACKED, f"pod {pod.key} was recreated")
            return answered

    def _landed_or_not(
        self,
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
        changed = self._observe(fresh)
        if all(fresh.annotations.get(k) == v for k, v in annotations.items()):
            self._settled("landed")
            log.info(
                "a write whose answer did not come landed",
                extra={"pod": pod.key, "waited_s": round(waited, 3)},
            )
            return fresh, changed
        node = _NODE.get()
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

    async def _patch_pod(
        self, pod: PodInfo, annotations: Mapping[str, str | None]
    ) -> tuple[PodInfo, set[str]]:
        """A write whose decision the caller made (reserve, move): a 409 means that decision
        rests on a pod that changed, so it is refused with `conflict` after the pod is re-read
        (the caller's next computation then sees the newer state)."""
        try:
            return await self._patch(pod, annotations, settle=True)
        except _Stale as exc:
            await self._refresh(pod)
            raise Refused(Code.CONFLICT, f"cannot patch pod annotations: {exc}") from exc

    async def _write_rereading(
        self,
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
                written, changed = await self._patch(
                    current.pod, annotations_of(planned), settle=settle, bind_to=bind_to
                )
            except _Stale as exc:
                fresh = await self._reread(current.pod)
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

    async def _reread(self, pod: PodInfo) -> TrackedPod | None:
        """The pod as the API server has it now, applied to the ledger; None when it is gone
        (or was recreated under the same name). Bounded by the caller's budget."""
        budget = self._budget()
        try:
            async with asyncio.timeout(budget):
                body = await self.kube.get_pod(pod.namespace, pod.name)
        except TimeoutError as exc:
            raise Refused(Code.DEADLINE_EXCEEDED, f"re-reading pod {pod.key} timed out") from exc
        except kube_io.NotFound:
            self._forget(pod.uid)
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
            self._forget(pod.uid)
            return None
        self._observe(fresh)
        return self.ledger.tracked(pod.uid)

    async def _refresh(self, pod: PodInfo) -> None:
        """Re-read a pod after a conflict, best effort (the watch delivers the newer object
        anyway when there is no time left)."""
        try:
            await self._reread(pod)
        except Refused as exc:
            log.warning("pod refresh failed", extra={"pod": pod.key, "error": bounded(str(exc))})

    def _check_epoch(self, name: str, epoch: str | None) -> None:
        """Fencing: a decision computed on a view of another epoch (another replica's
        ownership of the node's partition, or an earlier run) is refused with `conflict`, as a
        stale revision is; the caller fetches the current owner's view and decides again."""
        current = self.ledger.epoch_of(name)
        if epoch is not None and epoch != current:
            raise Refused(
                Code.CONFLICT,
                f"node {name}'s revisions count in epoch {current}, the request was computed "
                f"in epoch {shown(epoch)}; recompute on a fresh view",
            )

    def _tracked_here(self, node: NodeLedger, uid: str) -> TrackedPod:
        tracked = node.pods.get(uid)
        if tracked is None:
            where = self.ledger.pod_node.get(uid)
            if where is not None:
                raise Refused(Code.NODE_MISMATCH, f"pod {shown(uid)} is tracked on node {where}")
            raise Refused(Code.POD_NOT_TRACKED, f"pod {shown(uid)} is not tracked")
        return tracked

    def _check_bound(self, tracked: TrackedPod) -> None:
        """Moves and consumes act on a reservation the pod carries; a held one is not bound."""
        if tracked.uid in self.ledger.held:
            raise Refused(
                Code.INVALID_REQUEST,
                f"pod {tracked.pod.key} is reserved on node {tracked.node} but not bound yet",
            )

    def _check_fit(
        self,
        node: NodeLedger,
        tracked: TrackedPod | None,
        rows: Rows,
        kinds: tuple[ContainerKind, ...],
        released: bool,
        namespace: str,
        what: str,
    ) -> None:
        """The single writer's own fit check on its ledger (whoever asked for the commit)."""
        snapshot = node.snapshot
        if snapshot is None:
            raise Refused(Code.NODE_UNAVAILABLE, f"node {node.name} unavailable: node unregistered")
        verdict = check_commit(
            snapshot,
            tracked,
            rows,
            kinds,
            released,
            namespace=namespace,
            quota=self.ledger.quota,
        )
        if verdict.ok:
            return
        reasons = dict(sorted(verdict.reasons.items()))
        if verdict.quota_only:
            raise Refused(
                Code.QUOTA_EXCEEDED,
                f"{what} would exceed the NVIDIA resource quota in namespace {namespace}",
                fit_reasons=reasons,
            )
        raise Refused(
            Code.NO_FIT,
            f"{what} does not fit node {node.name}: {verdict.reason_text}",
            fit_reasons=reasons,
        )

    # --- operations -------------------------------------------------------------------------

    async def reserve(self, name: str, r: ReserveRequest) -> Outcome:
        """Hold the scheduler's decision (in place of any earlier reservation of the pod): the
        ledger counts it and publishes it at once; the pod is written only at bind, when
        bind-phase `allocating` writes vgpu-node, vgpu-time and both allocation annotations
        (identical at this point) in one guarded patch."""
        node = self._known(name)
        self._check_epoch(name, r.epoch)
        revision = r.revision
        if revision != node.revision:
            raise Refused(
                Code.CONFLICT,
                f"node {name} is at revision {node.revision}, the request was computed "
                f"on {revision}",
            )
        if node.devices is None:
            raise Refused(Code.NODE_UNAVAILABLE, f"node {name} unavailable: node unregistered")
        value = r.allocated
        try:
            rows = codec.decode_pod(value)
        except CoreError as exc:
            raise Refused(
                Code.ANNOTATION_INVALID, f"allocated value does not decode: {exc}"
            ) from exc
        inventory = {d.id for d in node.devices}
        unknown = sorted({d.uuid for e in rows for d in e} - inventory)
        if unknown:
            raise Refused(
                Code.INVALID_REQUEST, f"node {name} has no GPU {shown(', '.join(unknown))}"
            )
        uid, namespace, pod_name = r.pod_uid, r.pod_namespace, r.pod_name
        if uid in self.binding:
            # Served beside the node's writes (HOLD_OPS), but not beside this pod's own bind:
            # its Binding carries the reservation held now.
            raise Refused(Code.CONFLICT, f"pod {shown(uid)} is being bound; decide again after")
        for label, text in (("podNamespace", namespace), ("podName", pod_name)):
            if not subjects.valid_name(text):
                raise Refused(
                    Code.INVALID_REQUEST, f"{label} {shown(text)} is not a Kubernetes name"
                )
        pod = self._watched_unbound(uid, namespace, pod_name) or await self._read_pod(
            namespace, pod_name
        )
        if pod.uid != uid:
            raise Refused(Code.POD_MISMATCH, f"pod {pod.key} has uid {pod.uid}, not {shown(uid)}")
        if pod.terminal:
            raise Refused(Code.INVALID_REQUEST, f"pod {pod.key} has already ended")
        if pod.node_name:
            # Bound: its reservation is what it carries. The same decision again is answered
            # as held; anything else would move GPUs under a pod kubelet may be starting.
            if pod.node_name == name and pod.annotations.get(keys.ALLOCATED) == value:
                reply = ReserveReply(**self._ok(node), pod_resource_version=pod.resource_version)
                return Outcome(reply, self.ledger.observe(pod))
            raise Refused(
                Code.INVALID_REQUEST, f"pod {pod.key} is already bound to node {pod.node_name}"
            )
        old = self.ledger.tracked(uid)
        released = (old is not None and old.released) or pod.init_released()
        self._check_fit(node, old, rows, pod.kinds, released, pod.namespace, f"pod {pod.key}")
        now = time.time()
        expires = now + self.reservation_ttl
        held = self.ledger.held.get(uid)
        if held is not None and (held.node, held.allocated) == (name, value):
            # The same decision again (kube-scheduler retrying a pod): only its time-to-live
            # is renewed; nothing is published and nothing is written.
            self.ledger.renew(uid, expires)
            self._observe(pod)
            reply = ReserveReply(**self._ok(node), pod_resource_version=pod.resource_version)
            return Outcome(reply, set())
        if _holds_reservation(pod, name, value):
            # The pod already carries exactly this reservation (written before this version of
            # accounting held reservations): it stands, any other held decision gives way, and
            # nothing is written.
            changed = self.ledger.release(uid) | self.ledger.observe(pod)
            reply = ReserveReply(**self._ok(node), pod_resource_version=pod.resource_version)
            return Outcome(reply, changed)
        # The decision is held in the ledger (published to every reader, so the next filter
        # sees it) without writing the pod: a write would bump its resourceVersion, which sends
        # the pod straight back into kube-scheduler's active queue. The bind writes it.
        self._observe(pod)  # a newer object first (its changes are published too)
        changed = self.ledger.hold(pod, name, value, int(now), expires)
        reply = ReserveReply(**self._ok(node), pod_resource_version=pod.resource_version)
        return Outcome(reply, changed | {name})

    def _watched_unbound(self, uid: str, namespace: str, name: str) -> PodInfo | None:
        """The pod as the watch last showed it, unbound, when accounting knows no newer
        version (its own writes, a held reservation's pod); None: read it from the API."""
        if self.unbound is None:
            return None
        tracked = self.ledger.tracked(uid)
        hold = self.ledger.held.get(uid)
        known = [p.pod.resource_version for p in (tracked, hold) if p is not None]
        return self.unbound.get(uid, namespace, name, known=known)

    async def _read_pod(self, namespace: str, name: str) -> PodInfo:
        budget = self._budget()
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

    async def bind_phase(self, name: str, r: BindPhaseRequest) -> Outcome:
        node = self._known(name)
        tracked = self._tracked_here(node, r.pod_uid)
        named = (r.pod_namespace, r.pod_name)
        if any(named) and named != (tracked.pod.namespace, tracked.pod.name):
            # The extender checks this too; accounting refuses it on its own, before anything
            # is written or a hold released, so that no caller marks another pod's reservation.
            raise Refused(
                Code.POD_MISMATCH,
                f"pod {shown(r.pod_uid)} is {tracked.pod.key}, not "
                f"{shown(r.pod_namespace)}/{shown(r.pod_name)}",
            )
        phase = r.phase
        allowed = (keys.PHASE_ALLOCATING, keys.PHASE_SUCCESS, keys.PHASE_FAILED)
        if phase not in allowed:
            raise Refused(Code.INVALID_REQUEST, f"phase must be one of {', '.join(allowed)}")

        hold = self.ledger.held.get(r.pod_uid)
        if hold is not None and phase != keys.PHASE_ALLOCATING:
            if phase == keys.PHASE_SUCCESS:
                raise Refused(
                    Code.INVALID_REQUEST,
                    f"pod {tracked.pod.key} is reserved but was never bound",
                )
            # `failed` before the reservation was written: nothing to write, drop the hold.
            changed = self.ledger.release(r.pod_uid)
            self._note(changed)
            reply = BindPhaseReply(
                **self._ok(self.ledger.get(name)), pod_resource_version=hold.pod.resource_version
            )
            return Outcome(reply, changed | {name})

        bind_to = name if r.bind and phase == keys.PHASE_ALLOCATING else ""

        def plan(current: TrackedPod) -> dict[str, str | None]:
            bound_to = current.pod.node_name
            if bind_to and bound_to and bound_to != bind_to:
                raise Refused(
                    Code.NODE_MISMATCH,
                    f"pod {current.pod.key} is bound to node {bound_to}, not {bind_to}",
                )
            annotations: dict[str, str | None] = {keys.BIND_PHASE: phase}
            held = self.ledger.held.get(current.uid)
            if held is not None:
                # The one write of a reservation: everything the device plugin (and a HAMi
                # device plugin) reads, with the phase, guarded by the pod's resourceVersion.
                annotations.update(held.annotations)
            if phase == keys.PHASE_ALLOCATING:
                now = int(time.time())
                busy = allocating_pod(node, now, exclude=current.uid)
                if busy is not None:
                    # HAMi's node lock: one pod allocates at a time, so the plugin's `pending`
                    # always names the pod kubelet is admitting.
                    raise Refused(
                        Code.CONFLICT,
                        f"node {name} is still allocating pod {busy.pod.key}; bind again once "
                        "it is admitted",
                    )
                annotations[keys.BIND_TIME] = str(now)
            return annotations

        def unchanged(before: TrackedPod, after: TrackedPod) -> bool:
            # A pure phase change: safe to re-apply while the reservation is the same.
            return (before.allocated, before.to_allocate) == (after.allocated, after.to_allocate)

        # Settled when its answer does not come: a late `allocating` must never land after
        # the bind was given up (it would lock the node for a pod that is not bound there).
        self.binding.add(r.pod_uid)
        try:
            guarded, _, written, changed = await self._write_rereading(
                name, tracked, plan, lambda a: a, unchanged, settle=True, bind_to=bind_to
            )
        finally:
            self.binding.discard(r.pod_uid)
        # A Binding answers with a Status: the pod's new resourceVersion is the watch's to tell.
        by_binding = bool(bind_to) and written.resource_version == guarded.pod.resource_version
        reply = BindPhaseReply(
            **self._ok(node),
            pod_resource_version=None if by_binding else written.resource_version,
            bound=bool(bind_to) and written.node_name == bind_to,
        )
        return Outcome(reply, changed)

    async def move(self, name: str, r: MoveRequest) -> Outcome:
        """The refit's commit: both annotation values, computed at `revision` (or, when the
        node moved on meanwhile, on the pod at `podResourceVersion`, unchanged since)."""
        node = self._known(name)
        uid, revision, pod_version = r.pod_uid, r.revision, r.pod_resource_version
        index = r.container_index
        new_pending, new_allocated = r.to_allocate, r.allocated
        self._check_epoch(name, r.epoch)
        tracked = self._tracked_here(node, uid)
        self._check_bound(tracked)
        if revision != node.revision and (
            not pod_version or pod_version != tracked.pod.resource_version
        ):
            pod_note = (
                f" and pod {tracked.pod.key} changed since resourceVersion {shown(pod_version)}"
                if pod_version
                else ""
            )
            raise Refused(
                Code.CONFLICT,
                f"node {name} is at revision {node.revision}, the request was computed "
                f"on {revision}{pod_note}",
            )
        if node.devices is None:
            raise Refused(Code.NODE_UNAVAILABLE, f"node {name} unavailable: node unregistered")
        containers = len(tracked.pod.containers)
        if index >= containers:
            raise Refused(
                Code.CONTAINER_OUT_OF_RANGE,
                f"container index {index} is outside the pod's containers (0..{containers - 1})",
            )
        for label, old_raw, new_raw in (
            ("toAllocate", tracked.to_allocate or "", new_pending),
            ("allocated", tracked.allocated or "", new_allocated),
        ):
            if not codec.only_entry_changed(old_raw, new_raw, index):
                raise Refused(
                    Code.INVALID_REQUEST, f"{label} changes more than container {index}'s entry"
                )
        try:
            rows = codec.decode_pod(new_allocated)
            codec.decode_pod(new_pending)
        except CoreError as exc:
            raise Refused(Code.ANNOTATION_INVALID, str(exc)) from exc
        if index >= len(rows) or not rows[index]:
            raise Refused(Code.INVALID_REQUEST, f"container {index} moves to no GPU")
        inventory = {d.id for d in node.devices}
        if any(d.uuid not in inventory for d in rows[index]):
            raise Refused(
                Code.INVALID_REQUEST, f"container {index} moves to a GPU node {name} lacks"
            )
        self._check_fit(
            node,
            tracked,
            rows,
            tracked.pod.kinds,
            tracked.released,
            tracked.pod.namespace,
            f"moving container {index} of pod {tracked.pod.key}",
        )
        written, changed = await self._patch_pod(
            tracked.pod, {keys.TO_ALLOCATE: new_pending, keys.ALLOCATED: new_allocated}
        )
        reply = MoveReply(**self._ok(node), pod_resource_version=written.resource_version)
        return Outcome(reply, changed)

    async def consume(self, name: str, r: ConsumeRequest) -> Outcome:
        node = self._known(name)
        uid = r.pod_uid
        tracked = self._tracked_here(node, uid) if uid else pending_pod(node)
        if tracked is None:
            raise Refused(Code.NOTHING_PENDING, f"node {name} has no pod waiting for allocation")
        self._check_bound(tracked)
        devices, requested = r.devices, r.container_index
        repeated = consumed_entry(tracked, devices, requested) if uid else None
        if repeated is not None and requested is not None:
            # The same consume again (the device plugin resends one whose answer it never got:
            # the first may have landed before a takeover): answered ok, nothing is written or
            # counted again.
            phase = tracked.pod.annotations.get(keys.BIND_PHASE, "")
            reply = self._consumed(node, tracked, requested, repeated, False, phase)
            return Outcome(reply, set())
        known = frozenset(d.id for d in node.devices or ())

        def plan(current: TrackedPod, index: int | None) -> ConsumePlan:
            try:
                return plan_consume(current, devices, index, known)
            except ConsumeError as exc:
                raise Refused(Code.INVALID_REQUEST, str(exc)) from exc
            except CoreError as exc:
                raise Refused(Code.ANNOTATION_INVALID, str(exc)) from exc

        index = plan(tracked, requested).index

        def unchanged(before: TrackedPod, after: TrackedPod) -> bool:
            # The entry consume blanks is what kubelet was given: re-apply only onto that.
            entry = _pending_entry(before, index)
            return bool(entry) and _pending_entry(after, index) == entry

        tracked, consumed, _, changed = await self._write_rereading(
            name,
            tracked,
            lambda current: plan(current, index),
            lambda p: p.annotations,
            unchanged,
        )
        if consumed.drifted and self.on_drift is not None:
            self.on_drift(
                name,
                tracked.pod,
                "container "
                f"{consumed.index} runs on "
                f"{', '.join(d.uuid for d in consumed.allocated_entry)}, not the reserved "
                f"{', '.join(d.uuid for d in consumed.reserved)}; accounting follows what runs",
            )
        phase = consumed.annotations.get(keys.BIND_PHASE, "")
        reply = self._consumed(
            node, tracked, consumed.index, consumed.allocated_entry, consumed.drifted, phase
        )
        return Outcome(reply, changed)

    def _consumed(
        self,
        node: NodeLedger,
        tracked: TrackedPod,
        index: int,
        entry: ContainerEntry,
        drifted: bool,
        phase: str,
    ) -> ConsumeReply:
        return ConsumeReply(
            **self._ok(node),
            pod_uid=tracked.pod.uid,
            pod_namespace=tracked.pod.namespace,
            pod_name=tracked.pod.name,
            container_index=index,
            container_name=tracked.pod.containers[index].name,
            container_devices=codec.encode_container(entry),
            drifted=drifted,
            bind_phase=phase,
        )

    async def pending(self, name: str, r: PendingRequest) -> Outcome:
        node = self.ledger.get(name)
        tracked = None if node is None else pending_pod(node)
        head = self._ok(node)
        head["node"] = name
        pod = None if tracked is None else PendingPod.from_tracked(tracked)
        return Outcome(PendingReply(**head, pod=pod), set())

    async def snapshot(self, name: str, r: SnapshotRequest) -> Outcome:
        more: bool | None = None
        after: str | None = None
        if name == subjects.ALL_NODES:
            # Paged by node name: a whole cluster does not fit one NATS message (1 MiB).
            after = r.after or ""
            limit = min(r.limit or SNAPSHOT_PAGE, SNAPSHOT_PAGE_MAX)
            names = sorted(n for n in self.ledger.nodes if n > after and self.serves(n))
            page = names[:limit]
            nodes = [self.ledger.nodes[n] for n in page]
            head = self._ok(None)
            more = len(names) > limit
            after = page[-1] if page else after
        else:
            # A node the ledger does not know: an empty answer, and nothing is created.
            known = self.ledger.get(name)
            nodes = [] if known is None else [known]
            head = self._ok(known)
            head["node"] = name
        pod: TrackedPodWire | msgspec.UnsetType | None = msgspec.UNSET
        if r.pod_uid:
            tracked = self.ledger.tracked(r.pod_uid)
            pod = None if tracked is None else TrackedPodWire.from_core(tracked)
        partitioned = self.served_partitions is not None and name == subjects.ALL_NODES
        reply = SnapshotReply(
            **head,
            more=more,
            next=after,
            nodes=tuple(
                NodeStateWire.from_state(n.state(), self.ledger.epoch_of(n.name)) for n in nodes
            ),
            pod=pod,
            quota=QuotaWire.from_ledger(self.ledger.quota, r.namespace) if r.namespace else None,
            replica=self.replica if partitioned else None,
            partitions=self.served_partitions() if partitioned and self.served_partitions else None,
            partition_count=self.ledger.partition_count if partitioned else None,
        )
        return Outcome(reply, set())

    async def register(self, name: str, r: RegisterRequest) -> Outcome:
        """Write the node's GPU inventory as HAMi's register annotation. The Node object the
        API server returns is what enters the ledger (a node not seen yet included)."""
        try:
            devices = messages.devices_to_core(r.devices)
        except MessageError as exc:
            raise Refused(Code.INVALID_REQUEST, str(exc)) from exc
        value = codec.encode_register(devices)
        budget = self._budget()
        try:
            async with asyncio.timeout(budget):
                body = await self.kube.patch_node_annotations(name, {keys.NODE_REGISTER: value})
        except TimeoutError as exc:
            raise Refused(Code.DEADLINE_EXCEEDED, f"patch of node {name} timed out") from exc
        except kube_io.NotFound as exc:
            raise Refused(Code.NODE_UNAVAILABLE, f"node {name} does not exist") from exc
        except kube_io.KubeError as exc:
            raise Refused(Code.API_ERROR, str(exc)) from exc
        meta = body.get("metadata") if isinstance(body, dict) else None
        annotations = (meta.get("annotations") if isinstance(meta, dict) else None) or {}
        if not isinstance(annotations, dict):
            raise Refused(Code.API_ERROR, f"node {name}: annotations are not an object")
        changed = {name} if self.ledger.set_node(name, annotations) else set()
        return Outcome(RegisterReply(**self._ok(self.ledger.get(name))), changed)

    # --- dispatch ---------------------------------------------------------------------------

    async def handle(
        self, op: str, node_token: str, data: bytes, received: float | None = None
    ) -> Outcome:
        """`_handle`, timed from the request's arrival (`received`) to its answer."""
        started = time.monotonic() if received is None else received
        try:
            return await self._handle(op, node_token, data, received)
        finally:
            if op in messages.OPS:  # a made-up op name is no label
                self._timing("operation", op, time.monotonic() - started)

    async def _handle(
        self, op: str, node_token: str, data: bytes, received: float | None = None
    ) -> Outcome:
        """Decode and run one operation; refusals and bad input become replies, never
        exceptions. The checks, in order: the body is a JSON object (else a reply without
        epoch), the subject token names a node, the body's `node` is a node name and matches
        it (`unauthorized`), accounting knows the node (`node_unavailable`; pending, snapshot
        and register excepted), the body's fields, then the operation's own checks."""
        kinds = messages.OPS.get(op)
        reply_kind = AccountingReply if kinds is None else kinds[1]
        name = ""
        observed: set[str] = set()
        _OBSERVED.set(observed)
        _DEADLINE.set(None)
        try:
            if kinds is None:
                raise Refused(Code.INVALID_REQUEST, f"unknown operation {shown(op)}")
            request_kind = kinds[0]
            try:
                request = messages.decode(data, request_kind)
            except MessageError as exc:
                # Where the request goes is judged first, as for a readable one (an unknown
                # node is `node_unavailable` whatever else its body holds), then the fields.
                try:
                    addressed = _ADDRESSED.decode(data)
                except msgspec.DecodeError:
                    # Not a JSON object: nothing of it is read, and the reply has no epoch.
                    unreadable = reply_kind(
                        ok=False, code=Code.INVALID_REQUEST, error=bounded(str(exc))
                    )
                    return Outcome(unreadable, set())
                name = self._node_name(op, node_token, addressed.node, request_kind.WHAT)
                self._admit(op, name, node_token)
                raise
            node: object = getattr(request, "node", None)
            name = self._node_name(op, node_token, node, request_kind.WHAT)
            self._admit(op, name, node_token)
            deadline = deadline_of(request, received)
            if request.deadline_at_ms is not None and time.time() * 1000 > request.deadline_at_ms:
                # Read after the caller's own (absolute) deadline: this replica was paused, or
                # the request waited out a takeover. An answer now reaches nobody and could be
                # a second one: nothing is done and nothing is said (counted, and warned of,
                # by the caller of `handle`). A relative budget already spent on arrival is
                # the caller's to hear about: it is refused below, with an answer.
                self._late()
                raise ReadTooLate(op)
            _DEADLINE.set(deadline)
            if op in NO_WRITE_OPS:
                if isinstance(request, SnapshotRequest) and request.pod_uid in self.settling:
                    # Its write is being settled: answer what it settles to, not the state
                    # before it (which the late write could still change).
                    async with self._locked(name, deadline, op):
                        pass
                return await self._run(name, request)
            async with contextlib.AsyncExitStack() as held:
                if op not in HOLD_OPS:
                    await held.enter_async_context(self._locked(name, deadline, op))
                if op in CAPACITY_OPS:
                    await held.enter_async_context(self._locked(name, deadline, op, capacity=True))
                if op != "register":
                    self._known(name)  # it may have been deleted while this request waited
                if not self.serves(name):
                    # The partition was handed over (or its lease ran out) while this request
                    # waited for the node: its new owner decides, not this replica.
                    raise Refused(
                        Code.NODE_UNAVAILABLE,
                        f"this accounting replica no longer owns node {name}'s partition; retry",
                    )
                outcome = await self._run(name, request)
            outcome.changed |= observed
            return outcome
        except Refused as exc:
            return Outcome(self._refusal(reply_kind, exc, name), set(observed))
        except MessageError as exc:
            refused = Refused(Code.INVALID_REQUEST, str(exc))
            return Outcome(self._refusal(reply_kind, refused, name), set(observed))

    @staticmethod
    def _node_name(op: str, node_token: str, node: object, what: str) -> str:
        """The node a request is for: `subjects.ALL_NODES` for a snapshot of every node, else
        the body's `node`, which must be a node name (matched to the token by `_admit`)."""
        if node_token == subjects.ALL_NODES:
            if op != "snapshot":
                raise Refused(Code.INVALID_REQUEST, f"{op} must name one node")
            return subjects.ALL_NODES
        if not subjects.valid_token(node_token):
            raise Refused(Code.INVALID_REQUEST, f"subject token {shown(node_token)} names no node")
        if node is None:
            raise Refused(Code.INVALID_REQUEST, f"{what}: node is required")
        try:
            return subjects.check_name(node, "node")
        except InvalidName as exc:
            raise Refused(Code.INVALID_REQUEST, f"{op}: {exc}") from exc

    def _admit(self, op: str, name: str, node_token: str) -> None:
        """The body's node is the subject's (NATS permissions scope a node to its own token),
        and one accounting knows unless the operation allows any."""
        if name == subjects.ALL_NODES:
            return
        if subjects.node_token(name) != node_token:
            raise Refused(
                Code.UNAUTHORIZED,
                f"node {shown(name)} does not match subject token {shown(node_token)}",
            )
        if op not in UNLOCKED_NODE_OPS:
            self._known(name)

    async def _run(self, name: str, request: AccountingRequest) -> Outcome:
        _NODE.set("" if name == subjects.ALL_NODES else name)
        match request:
            case ReserveRequest():
                return await self.reserve(name, request)
            case BindPhaseRequest():
                return await self.bind_phase(name, request)
            case MoveRequest():
                return await self.move(name, request)
            case ConsumeRequest():
                return await self.consume(name, request)
            case PendingRequest():
                return await self.pending(name, request)
            case SnapshotRequest():
                return await self.snapshot(name, request)
            case RegisterRequest():
                return await self.register(name, request)
        raise AssertionError(f"no handler for {type(request).__name__}")

    def _refusal(self, kind: type[AccountingReply], refused: Refused, name: str) -> AccountingReply:
        node = self.ledger.get(name) if name else None
        error = bounded(str(refused))
        revision = None if node is None else node.revision
        epoch = (
            self.ledger.epoch_of(name) if name and name != subjects.ALL_NODES else self.ledger.epoch
        )
        if refused.fit_reasons is not None and issubclass(kind, (ReserveReply, MoveReply)):
            return kind(
                ok=False,
                code=refused.code,
                error=error,
                epoch=epoch,
                revision=revision,
                fit_reasons=dict(refused.fit_reasons),
            )
        return kind(ok=False, code=refused.code, error=error, epoch=epoch, revision=revision)
