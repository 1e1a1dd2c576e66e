"""Accounting operations: reserve, bind-phase, move, consume, pending, snapshot, register.

Every write follows one rule: decide under the node's lock, write the pod (or Node) with a JSON
merge patch carrying the resourceVersion it was decided on, bounded by the caller's remaining
deadline, and change the ledger only from what the API server returned. A 409 or a timeout is
reported to the caller, never retried with stale data.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from shared import subjects
from shared.core import codec, keys
from shared.core.accounting import effective, total
from shared.core.consume import ConsumeError, plan_consume
from shared.core.errors import CoreError
from shared.core.model import Usage
from shared.core.pods import PodInfo, pod_from_object
from shared.ledger_wire import node_state_to_wire, quota_to_wire, tracked_to_wire
from shared.service import kube_io
from shared.service.kube_io import Kube
from shared.service.lifecycle import Deadline
from shared.wire import Reader, WireError
from svc_accounting.ledger import (
    Ledger,
    NodeLedger,
    allocating_pod,
    pending_entries,
    pending_pod,
)

log = logging.getLogger("numafit.accounting")

DEFAULT_WRITE_TIMEOUT = 2.0
"""Longest any single API write may take (HAMi bounds its refit patch the same way)."""
SNAPSHOT_PAGE = 200
SNAPSHOT_PAGE_MAX = 500
"""Nodes per `_all` snapshot page: 200 nodes of 8 GPUs and no pods is about 300 KiB."""
MIN_WRITE_BUDGET = 0.02
"""Below this remaining budget a write is not attempted: it could only land after the caller
gave up (HAMi's post-timeout commit race, closed by construction)."""


_DEADLINE: ContextVar[Deadline | None] = ContextVar("numafit_accounting_deadline", default=None)
"""The current request's deadline (each request runs in its own task, with its own context)."""


class Refused(Exception):
    """An operation refused with a DESIGN.md code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Outcome:
    reply: dict[str, Any]
    changed: set[str]


Publisher = Callable[[set[str]], Awaitable[None]]


class Operations:
    def __init__(
        self,
        ledger: Ledger,
        kube: Kube,
        *,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        on_drift: Callable[[str, PodInfo, str], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.kube = kube
        self.write_timeout = write_timeout
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.on_drift = on_drift
        self.handlers: dict[str, Callable[[str, Reader], Awaitable[Outcome]]] = {
            "reserve": self.reserve,
            "bind-phase": self.bind_phase,
            "move": self.move,
            "consume": self.consume,
            "pending": self.pending,
            "snapshot": self.snapshot,
            "register": self.register,
        }

    # --- helpers ----------------------------------------------------------------------------

    def _base(self, node: NodeLedger | None) -> dict[str, Any]:
        reply: dict[str, Any] = {"ok": True, "code": "ok", "epoch": self.ledger.epoch}
        if node is not None:
            reply["node"] = node.name
            reply["revision"] = node.revision
        return reply

    def _budget(self) -> float:
        """Seconds the next write may take: what is left of the caller's deadline (anchored
        when the request arrived), at most the cap."""
        deadline = _DEADLINE.get()
        if deadline is None:
            return self.write_timeout
        budget = min(deadline.remaining(), self.write_timeout)
        if budget < MIN_WRITE_BUDGET:
            raise Refused(
                "deadline_exceeded", f"only {int(budget * 1000)} ms of the caller's budget left"
            )
        return budget

    def _check_revision(self, node: NodeLedger, reader: Reader) -> None:
        revision = reader.integer("revision", minimum=0)
        if revision != node.revision:
            raise Refused(
                "conflict",
                f"node {node.name} is at revision {node.revision}, the request was computed "
                f"on {revision}",
            )

    async def _patch_pod(
        self,
        pod: PodInfo,
        annotations: Mapping[str, str | None],
        budget: float,
    ) -> set[str]:
        """Write, then apply what the server returned. Conflicts refresh the pod from the API
        so the caller's next computation sees the newer state."""
        try:
            async with asyncio.timeout(budget):
                body = await self.kube.patch_pod_annotations(
                    pod.namespace, pod.name, annotations, pod.resource_version
                )
        except TimeoutError as exc:
            raise Refused(
                "deadline_exceeded", f"patch of pod {pod.key} did not finish in {budget:.3f}s"
            ) from exc
        except kube_io.Conflict as exc:
            await self._refresh(pod)
            raise Refused("conflict", f"cannot patch pod annotations: {exc}") from exc
        except kube_io.KubeError as exc:
            raise Refused("api_error", f"cannot patch pod annotations: {exc}") from exc
        return self.ledger.observe(pod_from_object(body))

    async def _refresh(self, pod: PodInfo) -> None:
        """Re-read a pod after a conflict, within what is left of the caller's budget (the
        watch delivers the newer object anyway when there is no time left)."""
        deadline = _DEADLINE.get()
        budget = (
            self.write_timeout
            if deadline is None
            else min(deadline.remaining(), self.write_timeout)
        )
        if budget < MIN_WRITE_BUDGET:
            return
        try:
            async with asyncio.timeout(budget):
                body = await self.kube.get_pod(pod.namespace, pod.name)
            self.ledger.observe(pod_from_object(body))
        except kube_io.NotFound:
            self.ledger.forget(pod.uid)
        except (TimeoutError, kube_io.KubeError, CoreError) as exc:
            log.warning("pod refresh failed", extra={"pod": pod.key, "error": str(exc)})

    def _tracked_here(self, node: NodeLedger, uid: str) -> Any:
        tracked = node.pods.get(uid)
        if tracked is None:
            where = self.ledger.pod_node.get(uid)
            if where is not None:
                raise Refused("node_mismatch", f"pod {uid} is tracked on node {where}")
            raise Refused("pod_not_tracked", f"pod {uid} is not tracked")
        return tracked

    # --- operations -------------------------------------------------------------------------

    async def reserve(self, name: str, r: Reader) -> Outcome:
        """Record the scheduler's decision: vgpu-node, vgpu-time and both allocation
        annotations (identical at this point), dropping any earlier reservation of the pod."""
        node = self.ledger.node(name)
        self._check_revision(node, r)
        if node.devices is None:
            raise Refused("node_unavailable", f"node {name} unavailable: node unregistered")
        value = r.text("allocated")
        try:
            rows = codec.decode_pod(value)
        except CoreError as exc:
            raise Refused("annotation_invalid", f"allocated value does not decode: {exc}") from exc
        inventory = {d.id for d in node.devices}
        unknown = sorted({d.uuid for e in rows for d in e} - inventory)
        if unknown:
            raise Refused("invalid_request", f"node {name} has no GPU {', '.join(unknown)}")
        uid, namespace, pod_name = r.text("podUID"), r.text("podNamespace"), r.text("podName")
        budget = self._budget()
        try:
            async with asyncio.timeout(budget):
                pod = pod_from_object(await self.kube.get_pod(namespace, pod_name))
        except TimeoutError as exc:
            raise Refused("deadline_exceeded", f"reading pod {namespace}/{pod_name}") from exc
        except kube_io.NotFound as exc:
            raise Refused("pod_not_tracked", str(exc)) from exc
        except kube_io.KubeError as exc:
            raise Refused("api_error", str(exc)) from exc
        if pod.uid != uid:
            raise Refused("pod_mismatch", f"pod {pod.key} has uid {pod.uid}, not {uid}")
        if pod.terminal:
            raise Refused("invalid_request", f"pod {pod.key} has already ended")
        new_usage = effective(pod.kinds, rows, False)
        old = self.ledger.tracked(uid)
        exclude = total(old.usage) if old is not None else Usage()
        if not self.ledger.quota.fits(pod.namespace, total(new_usage), exclude):
            raise Refused("quota_exceeded", f"pod {pod.key} would exceed the NVIDIA resource quota")
        changed = await self._patch_pod(
            pod,
            {
                keys.VGPU_NODE: name,
                keys.VGPU_TIME: str(int(time.time())),
                keys.TO_ALLOCATE: value,
                keys.ALLOCATED: value,
                keys.BIND_PHASE: None,
                keys.BIND_TIME: None,
            },
            self._budget(),
        )
        return Outcome(self._base(node), changed | {name})

    async def bind_phase(self, name: str, r: Reader) -> Outcome:
        node = self.ledger.node(name)
        tracked = self._tracked_here(node, r.text("podUID"))
        phase = r.text("phase")
        allowed = (keys.PHASE_ALLOCATING, keys.PHASE_SUCCESS, keys.PHASE_FAILED)
        if phase not in allowed:
            raise Refused("invalid_request", f"phase must be one of {', '.join(allowed)}")
        annotations: dict[str, str | None] = {keys.BIND_PHASE: phase}
        if phase == keys.PHASE_ALLOCATING:
            now = int(time.time())
            busy = allocating_pod(node, now, exclude=tracked.uid)
            if busy is not None:
                # HAMi's node lock: one pod allocates at a time, so the plugin's `pending`
                # always names the pod kubelet is admitting.
                raise Refused(
                    "conflict",
                    f"node {name} is still allocating pod {busy.pod.key}; bind again once it "
                    "is admitted",
                )
            annotations[keys.BIND_TIME] = str(now)
        changed = await self._patch_pod(tracked.pod, annotations, self._budget())
        return Outcome(self._base(node), changed)

    async def move(self, name: str, r: Reader) -> Outcome:
        """The refit's commit: both annotation values, computed at `revision`."""
        node = self.ledger.node(name)
        tracked = self._tracked_here(node, r.text("podUID"))
        self._check_revision(node, r)
        index = r.integer("containerIndex", minimum=0)
        new_pending, new_allocated = r.text("toAllocate"), r.text("allocated")
        for label, old_raw, new_raw in (
            ("toAllocate", tracked.to_allocate or "", new_pending),
            ("allocated", tracked.allocated or "", new_allocated),
        ):
            old_pieces, new_pieces = old_raw.split(";"), new_raw.split(";")
            if len(old_pieces) != len(new_pieces) or any(
                a != b
                for i, (a, b) in enumerate(zip(old_pieces, new_pieces, strict=True))
                if i != index
            ):
                raise Refused(
                    "invalid_request", f"{label} changes more than container {index}'s entry"
                )
        try:
            rows = codec.decode_pod(new_allocated)
            codec.decode_pod(new_pending)
        except CoreError as exc:
            raise Refused("annotation_invalid", str(exc)) from exc
        inventory = {d.id for d in node.devices or ()}
        if any(d.uuid not in inventory for d in rows[index]):
            raise Refused("invalid_request", f"container {index} moves to a GPU node {name} lacks")
        new_usage = effective(tracked.pod.kinds, rows, tracked.released)
        if not self.ledger.quota.fits(
            tracked.pod.namespace, total(new_usage), total(tracked.usage)
        ):
            raise Refused(
                "quota_exceeded",
                f"moving container {index} would exceed the NVIDIA resource quota in namespace "
                f"{tracked.pod.namespace}",
            )
        changed = await self._patch_pod(
            tracked.pod,
            {keys.TO_ALLOCATE: new_pending, keys.ALLOCATED: new_allocated},
            self._budget(),
        )
        return Outcome(self._base(node), changed)

    async def consume(self, name: str, r: Reader) -> Outcome:
        node = self.ledger.node(name)
        uid = r.opt_text("podUID")
        tracked = self._tracked_here(node, uid) if uid else pending_pod(node)
        if tracked is None:
            raise Refused("nothing_pending", f"node {name} has no pod waiting for allocation")
        devices = r.texts("devices", max_items=64)
        known = frozenset(d.id for d in node.devices or ())
        try:
            plan = plan_consume(tracked, devices, r.opt_integer("containerIndex"), known)
        except ConsumeError as exc:
            raise Refused("invalid_request", str(exc)) from exc
        changed = await self._patch_pod(tracked.pod, plan.annotations, self._budget())
        if plan.drifted and self.on_drift is not None:
            self.on_drift(
                name,
                tracked.pod,
                f"container {plan.index} runs on {', '.join(d.uuid for d in plan.allocated_entry)}"
                f", not the reserved {', '.join(d.uuid for d in plan.reserved)}; "
                "accounting follows what runs",
            )
        reply = self._base(node)
        reply.update(
            {
                "podUID": tracked.pod.uid,
                "podNamespace": tracked.pod.namespace,
                "podName": tracked.pod.name,
                "containerIndex": plan.index,
                "containerName": tracked.pod.containers[plan.index].name,
                "containerDevices": codec.encode_container(plan.allocated_entry),
                "drifted": plan.drifted,
                "bindPhase": plan.annotations.get(keys.BIND_PHASE, ""),
            }
        )
        return Outcome(reply, changed)

    async def pending(self, name: str, r: Reader) -> Outcome:
        node = self.ledger.node(name)
        tracked = pending_pod(node)
        reply = self._base(node)
        if tracked is None:
            reply["pod"] = None
        else:
            pod = tracked.pod
            reply["pod"] = {
                "uid": pod.uid,
                "namespace": pod.namespace,
                "name": pod.name,
                "numaAlignment": pod.annotations.get(keys.NUMA_ALIGNMENT),
                "entries": pending_entries(tracked),
            }
        return Outcome(reply, set())

    async def snapshot(self, name: str, r: Reader) -> Outcome:
        if name == subjects.ALL_NODES:
            # Paged by node name: a whole cluster does not fit one NATS message (1 MiB).
            after = r.text("after", "")
            limit = min(r.integer("limit", SNAPSHOT_PAGE, minimum=1), SNAPSHOT_PAGE_MAX)
            names = sorted(n for n in self.ledger.nodes if n > after)
            page = names[:limit]
            nodes = [self.ledger.nodes[n] for n in page]
            reply = self._base(None)
            reply["more"] = len(names) > limit
            reply["next"] = page[-1] if page else after
        else:
            node = self.ledger.node(name)
            nodes = [node]
            reply = self._base(node)
        reply["nodes"] = [node_state_to_wire(n.state()) for n in nodes]
        uid = r.opt_text("podUID")
        if uid:
            tracked = self.ledger.tracked(uid)
            reply["pod"] = None if tracked is None else tracked_to_wire(tracked)
        namespace = r.opt_text("namespace")
        if namespace:
            reply["quota"] = quota_to_wire(self.ledger.quota, namespace)
        return Outcome(reply, set())

    async def register(self, name: str, r: Reader) -> Outcome:
        """Write the node's GPU inventory as HAMi's register annotation."""
        items = r.objects("devices")
        try:
            devices = codec.parse_register_items(items)
        except CoreError as exc:
            raise Refused("invalid_request", f"devices: {exc}") from exc
        value = codec.encode_register(devices)
        node = self.ledger.node(name)
        try:
            async with asyncio.timeout(self._budget()):
                body = await self.kube.patch_node_annotations(name, {keys.NODE_REGISTER: value})
        except TimeoutError as exc:
            raise Refused("deadline_exceeded", f"patch of node {name} timed out") from exc
        except kube_io.NotFound as exc:
            raise Refused("node_unavailable", f"node {name} does not exist") from exc
        except kube_io.KubeError as exc:
            raise Refused("api_error", str(exc)) from exc
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        changed = {name} if self.ledger.set_node(name, annotations) else set()
        return Outcome(self._base(node), changed)

    # --- dispatch ---------------------------------------------------------------------------

    async def handle(self, op: str, node_token: str, body: Mapping[str, Any]) -> Outcome:
        """Run one operation; refusals and bad input become replies, never exceptions."""
        reader = Reader(body, op)
        name = node_token
        try:
            deadline_ms = reader.opt_integer("deadlineMs")
            _DEADLINE.set(None if deadline_ms is None else Deadline.after_ms(deadline_ms))
            if node_token != subjects.ALL_NODES:
                name = reader.text("node")
                if subjects.node_token(name) != node_token:
                    raise Refused(
                        "unauthorized", f"node {name!r} does not match subject token {node_token!r}"
                    )
            handler = self.handlers[op]
            if op in ("pending", "snapshot"):
                return await handler(name, reader)
            async with self.locks[name]:
                return await handler(name, reader)
        except Refused as exc:
            return Outcome(self._refusal(exc.code, str(exc), name), set())
        except WireError as exc:
            return Outcome(self._refusal("invalid_request", str(exc), name), set())

    def _refusal(self, code: str, message: str, name: str) -> dict[str, Any]:
        reply: dict[str, Any] = {"ok": False, "code": code, "error": message}
        reply["epoch"] = self.ledger.epoch
        node = self.ledger.nodes.get(name)
        if node is not None:
            reply["revision"] = node.revision
        return reply
