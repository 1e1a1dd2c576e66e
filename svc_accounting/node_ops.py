"""The operations on a node as a whole: `pending` (the pod kubelet is admitting there, for
the device plugin's Allocate), `snapshot` (the node's state, or a page of every node's, for
the read models), `register` (the node's GPU inventory, as HAMi's register annotation); the
head every reply starts with, and the checks every operation on a node's pods makes.
`Operations` (svc_accounting/operations.py) builds on them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypedDict

import msgspec

from shared import messages, subjects
from shared.codes import Code
from shared.core import codec, keys
from shared.core.commit_check import check_commit
from shared.messages import (
    MessageError,
    NodeStateWire,
    PendingPod,
    PendingReply,
    QuotaWire,
    RegisterReply,
    SnapshotReply,
    TrackedPodWire,
)
from shared.service import kube_io
from shared.subjects import shown
from svc_accounting.ledger import pending_pod
from svc_accounting.replies import Outcome, Refused

if TYPE_CHECKING:
    from collections.abc import Callable

    from shared.core.accounting import Rows, TrackedPod
    from shared.core.model import ContainerKind
    from shared.messages import PendingRequest, RegisterRequest, SnapshotRequest
    from svc_accounting.ledger import Ledger, NodeLedger
    from svc_accounting.pod_writes import PodWrites
    from svc_accounting.replies import Call

SNAPSHOT_PAGE = 200
SNAPSHOT_PAGE_MAX = 500
"""Nodes per `_all` snapshot page: 200 nodes of 8 GPUs and no pods is about 300 KiB."""


class Head(TypedDict):
    """The fields every accounting reply starts with."""

    ok: bool
    code: str
    epoch: str
    node: str | None
    revision: int | None


class NodeOperations:
    ledger: Ledger
    writes: PodWrites
    served_partitions: Callable[[], tuple[int, ...]] | None
    """Partitioned accounting: the partitions this replica serves (a snapshot of every node
    says which it covered)."""

    def _ok(self, node: NodeLedger | None) -> Head:
        """A success's head: the node's name and revision when accounting knows it."""
        return Head(
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
        budget = self.writes.budget(call)
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
