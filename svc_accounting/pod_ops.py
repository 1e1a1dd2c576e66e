"""The operations on a pod's reservation: `reserve` (the scheduler's decision, held in the
ledger), `bind-phase` (the bind: accounting's Binding carrying the reservation; the phase after
it), `move` (the refit's commit) and `consume` (kubelet's Allocate). Each re-checks what it
decides on accounting's own ledger and writes through `writes` (svc_accounting/pod_writes.py).
A 409 on `move` or `reserve` is reported (`conflict`): the caller's decision rests on a pod that
changed. A 409 on `consume` or `bind-phase` is not the caller's fault (kubelet's status writes
moved the pod's resourceVersion before the watch caught up): the pod is re-read and, when what
the operation depends on is unchanged, the write is planned and applied again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from shared import subjects
from shared.codes import Code
from shared.core import codec, keys
from shared.core.consume import ConsumeError, ConsumePlan, consumed_entry, plan_consume
from shared.core.errors import CoreError
from shared.messages import BindPhaseReply, ConsumeReply, MoveReply, ReserveReply
from shared.subjects import shown
from svc_accounting.ledger import allocating_pod, pending_pod
from svc_accounting.node_ops import NodeOperations
from svc_accounting.replies import Outcome, Refused

if TYPE_CHECKING:
    from collections.abc import Callable

    from shared.core.accounting import Rows, TrackedPod
    from shared.core.model import ContainerEntry
    from shared.core.pods import PodInfo
    from shared.messages import BindPhaseRequest, ConsumeRequest, MoveRequest, ReserveRequest
    from svc_accounting.ledger import NodeLedger
    from svc_accounting.replies import Call

DEFAULT_RESERVATION_TTL = 30.0
"""Seconds a filter's reservation is held without a bind (kube-scheduler binds within
milliseconds of its filter, or seconds behind a Permit plugin; a lost bind must not hold GPUs
for long)."""


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


class PodOperations(NodeOperations):
    reservation_ttl: float
    """Seconds a held reservation waits for its bind before it is released."""
    binding: set[str]
    """Pods whose bind-phase write is under way, by UID: a reserve of one waits its turn."""
    on_drift: Callable[[str, PodInfo, str], None] | None

    def _reservable(self, node: NodeLedger, r: ReserveRequest) -> Rows:
        """The reserve's own checks, before its pod is read: decided on this node's current
        epoch and revision, on a registered node, a decodable value naming only the node's GPUs,
        for a pod whose bind is not under way, named by Kubernetes names. The decoded rows."""
        name = node.name
        self._check_epoch(name, r.epoch)
        if r.revision != node.revision:
            raise Refused(
                Code.CONFLICT,
                f"node {name} is at revision {node.revision}, the request was computed "
                f"on {r.revision}",
            )
        if node.devices is None:
            raise Refused(Code.NODE_UNAVAILABLE, f"node {name} unavailable: node unregistered")
        try:
            rows = codec.decode_pod(r.allocated)
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
        if r.pod_uid in self.binding:
            # Served beside the node's writes (HOLD_OPS), but not beside this pod's own bind:
            # its Binding carries the reservation held now.
            raise Refused(
                Code.CONFLICT, f"pod {shown(r.pod_uid)} is being bound; decide again after"
            )
        for label, text in (("podNamespace", r.pod_namespace), ("podName", r.pod_name)):
            if not subjects.valid_name(text):
                raise Refused(
                    Code.INVALID_REQUEST, f"{label} {shown(text)} is not a Kubernetes name"
                )
        return rows

    async def reserve(self, call: Call, name: str, r: ReserveRequest) -> Outcome:
        """Hold the scheduler's decision (in place of any earlier reservation of the pod): the
        ledger counts it and publishes it at once; the pod is written only at bind, when
        bind-phase `allocating` writes vgpu-node, vgpu-time and both allocation annotations
        (identical at this point) in one guarded patch."""
        node = self._known(name)
        rows = self._reservable(node, r)
        value = r.allocated
        uid, namespace, pod_name = r.pod_uid, r.pod_namespace, r.pod_name
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

    # --- dispatch ---------------------------------------------------------------------------
