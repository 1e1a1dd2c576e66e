"""The accounting ledger: every tracked pod per node, a revision per node, namespace quota.

Pure state (no I/O): the service applies a change here only after the Kubernetes write that
makes it durable has landed, and every change of a node bumps that node's revision so optimistic
callers (scheduler, refit) can tell whether their decision is still current.

The one exception is a *held* reservation: the scheduler's filter decision, kept here (and
published to every reader) without writing the pod, as kube-scheduler keeps an assumed pod in
its cache. It is written to the pod once, at bind, together with bind-phase `allocating`; one
that is not bound within its time-to-live expires, and a restart forgets it (the bind then
fails cleanly and kube-scheduler schedules the pod again).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared import subjects
from shared.core import codec, keys, lock
from shared.core.accounting import TrackedPod, node_snapshot, track_pod
from shared.core.partitions import partition_of
from shared.core.quota import QuotaLedger, QuotaLimit
from shared.messages import NodeState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from shared.core.model import DeviceInfo, NodeSnapshot
    from shared.core.pods import PodInfo


RESERVATION_KEYS = (
    keys.VGPU_NODE,
    keys.VGPU_TIME,
    keys.TO_ALLOCATE,
    keys.ALLOCATED,
    keys.BIND_PHASE,
    keys.BIND_TIME,
)
"""The annotations a reservation consists of (written together at bind)."""


def _reservation_of(pod: PodInfo) -> tuple[str | None, ...]:
    return tuple(pod.annotations.get(key) for key in RESERVATION_KEYS)


@dataclass(frozen=True, slots=True)
class Hold:
    """A reservation accounting holds for a pod that does not carry it yet."""

    node: str
    allocated: str
    since: int
    """Unix seconds of the decision: the pod's `hami.io/vgpu-time` once written."""
    expires: float
    """Unix time after which the reservation is dropped unless bound (or renewed)."""
    pod: PodInfo
    """The pod as the API server shows it (without the reservation)."""

    @property
    def annotations(self) -> dict[str, str]:
        """The reservation's annotations as the bind writes them (less the phase)."""
        return {
            keys.VGPU_NODE: self.node,
            keys.VGPU_TIME: str(self.since),
            keys.TO_ALLOCATE: self.allocated,
            keys.ALLOCATED: self.allocated,
        }

    def overlay(self) -> PodInfo:
        """The pod as it will be once the reservation is written: what the ledger counts."""
        annotations = {k: v for k, v in self.pod.annotations.items() if k not in RESERVATION_KEYS}
        annotations.update(self.annotations)
        return dataclasses.replace(self.pod, annotations=annotations)

    def superseded_by(self, pod: PodInfo) -> bool:
        """Does a newer object of the pod end the hold? It does once the pod carries another
        reservation than the one the hold was made over (the bind's write, or anyone's), is
        bound, or is ending."""
        return (
            _reservation_of(pod) != _reservation_of(self.pod)
            or bool(pod.node_name)
            or pod.terminal
            or pod.deleting
        )


def newer(candidate: str, known: str) -> bool:
    """Is resourceVersion `candidate` newer than `known`? RVs are opaque, but etcd's (and the
    emulator's) are integers; when either is not, treat the candidate as newer."""
    if not known:
        return True
    if candidate.isdigit() and known.isdigit():
        return int(candidate) > int(known)
    return candidate != known


@dataclass
class NodeLedger:
    """One node's devices, tracked pods and revision; its snapshot is kept current."""

    name: str
    devices: tuple[DeviceInfo, ...] | None = None
    cordoned: frozenset[str] = frozenset()
    revision: int = 0
    pods: dict[str, TrackedPod] = field(default_factory=dict)
    listed: bool = False
    """Seen as a Node object (list or watch); False while only a pod bound to it is known."""
    _snapshot: NodeSnapshot | None = None

    def changed(self) -> None:
        self.revision += 1
        self._snapshot = None

    @property
    def snapshot(self) -> NodeSnapshot | None:
        """Usage of every tracked pod on the registered devices (None when unregistered)."""
        if self.devices is None:
            return None
        if self._snapshot is None:
            self._snapshot = node_snapshot(
                self.name, self.devices, self.cordoned, self.pods.values()
            )
        return self._snapshot

    def state(self) -> NodeState:
        return NodeState(
            self.name, self.revision, self.devices, self.cordoned, tuple(self.pods.values())
        )

    def usage_table(self) -> dict[str, dict[str, int]]:
        snapshot = self.snapshot
        return snapshot.usage_table() if snapshot is not None else {}


@dataclass
class Ledger:
    """All nodes and the namespace quota; `epoch` changes on every start so readers that cached
    revisions of an earlier run know to take a fresh snapshot."""

    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    nodes: dict[str, NodeLedger] = field(default_factory=dict)
    pod_node: dict[str, str] = field(default_factory=dict)
    quota: QuotaLedger = field(default_factory=QuotaLedger)
    held: dict[str, Hold] = field(default_factory=dict)
    """Reservations held for pods that do not carry them yet, by pod UID."""
    partition_count: int = 0
    """Partitioned accounting: the number of partitions (0: this replica owns every node)."""
    epochs: dict[int, str] = field(default_factory=dict)
    """Partitioned accounting: the epoch of each partition this replica serves."""
    unseen: dict[str, str] = field(default_factory=dict)
    """Pods accounting's own Binding wrote whose new resourceVersion no event has shown yet, by
    UID: the version the ledger holds for them (the Binding's guard) is not the pod's any more,
    so a write guarded by it would only conflict."""
    on_seen: Callable[[str], None] | None = None
    """Told of each UID that left `unseen` (its written version arrived, or it was deleted)."""

    def partition(self, name: str) -> int | None:
        return partition_of(name, self.partition_count) if self.partition_count else None

    def epoch_of(self, name: str) -> str:
        """The epoch a reader knows `name`'s revisions by: this run's, or (partitioned) that of
        the node's partition's current ownership."""
        k = self.partition(name)
        return self.epoch if k is None else self.epochs.get(k, self.epoch)

    def node(self, name: str) -> NodeLedger:
        """The node's ledger; a node the ledger does not know reads as an empty, unregistered
        one that is *not* stored (reads never create: only API-server facts add nodes)."""
        ledger = self.nodes.get(name)
        return NodeLedger(name) if ledger is None else ledger

    def get(self, name: str) -> NodeLedger | None:
        return self.nodes.get(name)

    def _ensure(self, name: str) -> NodeLedger:
        ledger = self.nodes.get(name)
        if ledger is None:
            ledger = self.nodes[name] = NodeLedger(name)
        return ledger

    def tracked(self, uid: str) -> TrackedPod | None:
        node = self.pod_node.get(uid)
        return None if node is None else self.nodes[node].pods.get(uid)

    # --- nodes ------------------------------------------------------------------------------

    def set_node(self, name: str, annotations: dict[str, str]) -> bool:
        """Apply a Node object's register and cordon annotations; True when anything changed.
        A register annotation that does not parse leaves the node unregistered (refusing all
        fits) rather than guessing. Only Node objects from the API server come here."""
        ledger = self._ensure(name)
        ledger.listed = True
        register = annotations.get(keys.NODE_REGISTER)
        try:
            devices = codec.parse_register(register) if register is not None else None
        except ValueError:
            devices = None
        cordoned = codec.parse_uuid_list(annotations.get(keys.DEVICE_CORDON))
        if (devices, cordoned) == (ledger.devices, ledger.cordoned):
            return False
        ledger.devices, ledger.cordoned = devices, cordoned
        ledger.changed()
        return True

    def drop_node(self, name: str) -> NodeLedger | None:
        """The Node was deleted: forget it and release every pod the ledger held on it (a pod
        that still exists comes back through the pod watch). Returns what was dropped."""
        ledger = self.nodes.pop(name, None)
        if ledger is None:
            return None
        for tracked in ledger.pods.values():
            self.pod_node.pop(tracked.uid, None)
            self.held.pop(tracked.uid, None)
            self.quota.remove(tracked.pod.namespace, tracked.usage)
        return ledger

    # --- pods -------------------------------------------------------------------------------

    def observe(self, pod: PodInfo) -> set[str]:
        """Apply a pod as the API server shows it (list, watch or a write's response).

        Adopts pods with a reservation, refreshes known ones, shrinks a pod to its steady state
        once its init phase is released (the flag never goes back), and releases terminal
        pods. Returns the nodes whose ledger changed.
        """
        old = self.tracked(pod.uid)
        if old is not None and not newer(pod.resource_version, old.pod.resource_version):
            return set()  # a stale event must never undo a newer write
        return self._apply(pod, old)

    def _apply(self, pod: PodInfo, old: TrackedPod | None) -> set[str]:
        """`observe` once the pod is known to be newer than `old` (what the ledger tracks)."""
        self._seen(pod.uid)
        hold = self.held.get(pod.uid)
        if hold is not None:
            if not hold.superseded_by(pod):
                # The pod changed (labels, say) but still lacks the held reservation: keep it,
                # over the newer object (whose resourceVersion the bind's write is guarded by).
                return self._hold(dataclasses.replace(hold, pod=pod))
            del self.held[pod.uid]
        released = (old is not None and old.released) or pod.init_released()
        entry = None if pod.deleting and pod.terminal else track_pod(pod, released=released)
        if entry is not None and not subjects.valid_name(entry.node):
            entry = None  # hami.io/vgpu-node names no Kubernetes node: nothing can run there
        changed: set[str] = set()
        if old is not None and (entry is None or entry.node != old.node):
            changed |= self._remove(old)
        if entry is None:
            return changed
        if old is not None and entry.node == old.node and _same_reservation(old, entry):
            # Nothing the ledger counts changed: keep the newer object, no new revision.
            self.nodes[entry.node].pods[entry.uid] = entry
            return changed
        if old is not None and entry.node == old.node:
            self.quota.remove(old.pod.namespace, old.usage)
        self._add(entry)
        changed.add(entry.node)
        return changed

    def observe_bound(self, pod: PodInfo) -> set[str]:
        """Apply the pod as accounting's own Binding left it: its annotations and node as
        written, its resourceVersion the one the Binding was guarded by (the Binding's answer
        is a Status, not the pod). Unlike `observe`, the same resourceVersion as the ledger's
        applies (this is the write's content, newer than the hold or the object it was guarded
        by); an event of that version stays stale, every later one is newer. Nothing is done
        when the watch already delivered a newer object of the pod."""
        old = self.tracked(pod.uid)
        if old is not None and newer(old.pod.resource_version, pod.resource_version):
            return set()  # the watch was faster: it holds the written pod already
        changed = self._apply(pod, old)
        if self.tracked(pod.uid) is not None:
            self.unseen[pod.uid] = pod.resource_version
        return changed

    def _seen(self, uid: str) -> None:
        if self.unseen.pop(uid, None) is not None and self.on_seen is not None:
            self.on_seen(uid)

    def forget(self, uid: str) -> set[str]:
        """The pod was deleted: release its reservation."""
        self._seen(uid)
        self.held.pop(uid, None)
        old = self.tracked(uid)
        return set() if old is None else self._remove(old)

    # --- held reservations ------------------------------------------------------------------

    def hold(self, pod: PodInfo, node: str, allocated: str, since: int, expires: float) -> set[str]:
        """Hold a reservation for `pod` on `node` in place of any earlier one: counted on the
        node (and in the namespace's quota) from now on, written to the pod only at bind.
        Returns the nodes whose ledger changed."""
        if node not in self.nodes:
            raise KeyError(node)  # callers check the node first: requests never create nodes
        return self._hold(Hold(node, allocated, since, expires, pod))

    def _hold(self, hold: Hold) -> set[str]:
        overlay = hold.overlay()
        old = self.tracked(overlay.uid)
        released = (old is not None and old.released) or overlay.init_released()
        entry = track_pod(overlay, released=released)
        if entry is None:  # pragma: no cover - an overlay always carries a reservation
            raise ValueError(f"pod {overlay.key} cannot hold a reservation")
        self.held[overlay.uid] = hold
        if old is not None and old.node == entry.node and _same_reservation(old, entry):
            self.nodes[entry.node].pods[entry.uid] = entry
            return set()
        changed = self._remove(old) if old is not None else set()
        self._add(entry)
        return changed | {entry.node}

    def renew(self, uid: str, expires: float) -> None:
        hold = self.held.get(uid)
        if hold is not None:
            self.held[uid] = dataclasses.replace(hold, expires=expires)

    def release(self, uid: str) -> set[str]:
        """Drop the reservation held for `uid`; what the pod itself carries (an earlier,
        written reservation) counts again. Returns the nodes whose ledger changed."""
        hold = self.held.pop(uid, None)
        if hold is None:
            return set()
        old = self.tracked(uid)
        changed = self._remove(old) if old is not None else set()
        return changed | self.observe(hold.pod)

    def expire(self, now: float) -> tuple[list[Hold], set[str]]:
        """Release every held reservation whose time is up (kube-scheduler's assumed pods
        expire the same way when their bind never comes): those released, and the nodes whose
        ledger changed."""
        expired = [h for h in self.held.values() if h.expires <= now]
        changed: set[str] = set()
        for hold in expired:
            changed |= self.release(hold.pod.uid)
        return expired, changed

    def next_expiry(self) -> float | None:
        return min((h.expires for h in self.held.values()), default=None)

    def _add(self, entry: TrackedPod) -> None:
        # A pod bound to a node not seen yet (the Node watch lags) is an API-server fact too.
        node = self._ensure(entry.node)
        node.pods[entry.uid] = entry
        node.changed()
        self.pod_node[entry.uid] = entry.node
        self.quota.add(entry.pod.namespace, entry.usage)

    def _remove(self, old: TrackedPod) -> set[str]:
        node = self.nodes.get(old.node)
        if node is None or old.uid not in node.pods:
            return set()
        del node.pods[old.uid]
        node.changed()
        del self.pod_node[old.uid]
        self.quota.remove(old.pod.namespace, old.usage)
        if not node.listed and not node.pods:
            del self.nodes[old.node]  # only its pods made it known: gone with the last one
        return {old.node}

    def set_quota_limits(self, limits: dict[str, QuotaLimit]) -> None:
        self.quota.limits = dict(limits)

    def pods(self) -> Iterator[TrackedPod]:
        for node in self.nodes.values():
            yield from node.pods.values()


def _same_reservation(a: TrackedPod, b: TrackedPod) -> bool:
    return (
        a.allocated == b.allocated
        and a.to_allocate == b.to_allocate
        and a.released == b.released
        and a.pod.annotations.get(keys.BIND_PHASE) == b.pod.annotations.get(keys.BIND_PHASE)
    )


def pending_pod(node: NodeLedger) -> TrackedPod | None:
    """The pod this node must allocate next (the core's rule: shared/core/lock.py)."""
    return lock.pending_pod(node.pods.values())


def allocating_pod(node: NodeLedger, now: int, exclude: str = "") -> TrackedPod | None:
    """Another pod of the node that is being allocated (bound, entries still pending), unless
    its lock has expired."""
    holder = lock.pending_pod(node.pods.values(), exclude)
    if holder is None or lock.lock_of(holder).expired(now):
        return None
    return holder


def node_lock(node: NodeLedger) -> lock.Lock | None:
    """The node's lock as published (whatever its age: readers judge the expiry)."""
    return lock.node_lock(node.pods.values())
