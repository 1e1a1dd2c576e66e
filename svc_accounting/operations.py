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
import logging
import time
import weakref
from typing import TYPE_CHECKING, Final, TypedDict

import msgspec

from shared import messages, subjects
from shared.codes import Code
from shared.core import codec, keys
from shared.core.commit_check import check_commit
from shared.core.consume import ConsumeError, ConsumePlan, consumed_entry, plan_consume
from shared.core.errors import CoreError
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
from shared.subjects import InvalidName, shown
from svc_accounting.ledger import Ledger, NodeLedger, allocating_pod, pending_pod
from svc_accounting.pod_writes import DEFAULT_WRITE_TIMEOUT, PodWrites
from svc_accounting.replies import (
    Call,
    Outcome,
    ReadTooLate,
    Refused,
    bounded,
    deadline_of,
    refuse_late,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from shared.core.accounting import Rows, TrackedPod
    from shared.core.model import ContainerEntry, ContainerKind
    from shared.core.pods import PodInfo
    from shared.service.kube_io import Kube
    from shared.service.lifecycle import Deadline
    from svc_accounting.unbound import UnboundPods

log = logging.getLogger("numafit.accounting")

DEFAULT_RESERVATION_TTL = 30.0
"""Seconds a filter's reservation is held without a bind (kube-scheduler binds within
milliseconds of its filter, or seconds behind a Permit plugin; a lost bind must not hold GPUs
for long)."""
SNAPSHOT_PAGE = 200
SNAPSHOT_PAGE_MAX = 500
"""Nodes per `_all` snapshot page: 200 nodes of 8 GPUs and no pods is about 300 KiB."""
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


class Operations:
    """The seven operations on one replica's ledger: each request decoded, checked, served
    under its node's locks (HOLD_OPS, CAPACITY_OPS) and answered; the pods' API side is
    `writes` (svc_accounting/pod_writes.py)."""

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
        self.writes = PodWrites(ledger, kube, write_timeout=write_timeout, unbound=unbound)
        self.reservation_ttl = reservation_ttl
        """Seconds a held reservation waits for its bind before it is released."""
        self.locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        """One lock per node while anyone holds or waits for it: the map never keeps a lock
        nobody uses, so neither made-up nor deleted nodes leave one behind."""
        self.capacity_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.binding: set[str] = set()
        """Pods whose bind-phase write is under way, by UID: a reserve of one waits its turn."""
        self.on_drift = on_drift
        self.served_partitions: Callable[[], tuple[int, ...]] | None = None
        self.on_late: Callable[[], None] | None = None
        """Told of each request refused because its deadline had passed (a metric)."""
        self.on_timing: Callable[[str, str, float], None] | None = None
        """Told how long each step took (a metric): (`node_wait`, op, seconds) for the wait for
        the node's lock, (`operation`, op, seconds) from a request's arrival to its answer."""

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
                refuse_late(deadline, op)
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

    async def reserve(self, call: Call, name: str, r: ReserveRequest) -> Outcome:
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
        pod = self.writes.watched_unbound(uid, namespace, pod_name) or await self.writes.read_pod(
            call, namespace, pod_name
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
            self.writes.observe(call, pod)
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
        self.writes.observe(call, pod)  # a newer object first (its changes are published too)
        changed = self.ledger.hold(pod, name, value, int(now), expires)
        reply = ReserveReply(**self._ok(node), pod_resource_version=pod.resource_version)
        return Outcome(reply, changed | {name})

    async def bind_phase(self, call: Call, name: str, r: BindPhaseRequest) -> Outcome:
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
            call.note(changed)
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
            guarded, _, written, changed = await self.writes.write_rereading(
                call, name, tracked, plan, lambda a: a, unchanged, settle=True, bind_to=bind_to
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

    async def move(self, call: Call, name: str, r: MoveRequest) -> Outcome:
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
        written, changed = await self.writes.patch_pod(
            call, tracked.pod, {keys.TO_ALLOCATE: new_pending, keys.ALLOCATED: new_allocated}
        )
        reply = MoveReply(**self._ok(node), pod_resource_version=written.resource_version)
        return Outcome(reply, changed)

    async def consume(self, call: Call, name: str, r: ConsumeRequest) -> Outcome:
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

        tracked, consumed, _, changed = await self.writes.write_rereading(
            call,
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

    async def pending(self, call: Call, name: str, r: PendingRequest) -> Outcome:
        node = self.ledger.get(name)
        tracked = None if node is None else pending_pod(node)
        head = self._ok(node)
        head["node"] = name
        pod = None if tracked is None else PendingPod.from_tracked(tracked)
        return Outcome(PendingReply(**head, pod=pod), set())

    async def snapshot(self, call: Call, name: str, r: SnapshotRequest) -> Outcome:
        more: bool | None = None
        after: str | None = None
        if name == subjects.ALL_NODES:
            # Paged by node name: a whole cluster does not fit one NATS message (1 MiB).
            after = r.after or ""
            limit = min(r.limit or SNAPSHOT_PAGE, SNAPSHOT_PAGE_MAX)
            names = sorted(n for n in self.ledger.nodes if n > after and self.writes.serves(n))
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
            replica=self.writes.replica if partitioned else None,
            partitions=self.served_partitions() if partitioned and self.served_partitions else None,
            partition_count=self.ledger.partition_count if partitioned else None,
        )
        return Outcome(reply, set())

    async def register(self, call: Call, name: str, r: RegisterRequest) -> Outcome:
        """Write the node's GPU inventory as HAMi's register annotation. The Node object the
        API server returns is what enters the ledger (a node not seen yet included)."""
        try:
            devices = messages.devices_to_core(r.devices)
        except MessageError as exc:
            raise Refused(Code.INVALID_REQUEST, str(exc)) from exc
        value = codec.encode_register(devices)
        budget = self.writes.budget(
            call,
        )
        try:
            async with asyncio.timeout(budget):
                body = await self.writes.kube.patch_node_annotations(
                    name, {keys.NODE_REGISTER: value}
                )
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
        call = Call()  # its node and deadline are known once the request is read
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
            call.node = "" if name == subjects.ALL_NODES else name
            call.deadline = deadline
            if op in NO_WRITE_OPS:
                if isinstance(request, SnapshotRequest) and request.pod_uid in self.writes.settling:
                    # Its write is being settled: answer what it settles to, not the state
                    # before it (which the late write could still change).
                    async with self._locked(name, deadline, op):
                        pass
                return await self._run(call, name, request)
            async with contextlib.AsyncExitStack() as held:
                if op not in HOLD_OPS:
                    await held.enter_async_context(self._locked(name, deadline, op))
                if op in CAPACITY_OPS:
                    await held.enter_async_context(self._locked(name, deadline, op, capacity=True))
                if op != "register":
                    self._known(name)  # it may have been deleted while this request waited
                if not self.writes.serves(name):
                    # The partition was handed over (or its lease ran out) while this request
                    # waited for the node: its new owner decides, not this replica.
                    raise Refused(
                        Code.NODE_UNAVAILABLE,
                        f"this accounting replica no longer owns node {name}'s partition; retry",
                    )
                outcome = await self._run(call, name, request)
            outcome.changed |= call.observed
            return outcome
        except Refused as exc:
            return Outcome(self._refusal(reply_kind, exc, name), set(call.observed))
        except MessageError as exc:
            refused = Refused(Code.INVALID_REQUEST, str(exc))
            return Outcome(self._refusal(reply_kind, refused, name), set(call.observed))

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

    async def _run(self, call: Call, name: str, request: AccountingRequest) -> Outcome:
        match request:
            case ReserveRequest():
                return await self.reserve(call, name, request)
            case BindPhaseRequest():
                return await self.bind_phase(call, name, request)
            case MoveRequest():
                return await self.move(call, name, request)
            case ConsumeRequest():
                return await self.consume(call, name, request)
            case PendingRequest():
                return await self.pending(call, name, request)
            case SnapshotRequest():
                return await self.snapshot(call, name, request)
            case RegisterRequest():
                return await self.register(call, name, request)
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
