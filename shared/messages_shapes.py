"""The shapes nested in accounting's replies: a GPU of the register (`RegisterItem`), a tracked
pod and its mini pod (`TrackedPodWire`), a node of a snapshot (`NodeStateWire`), a namespace's
quota (`QuotaWire`) and the pod a node must allocate next (`PendingPod`), with converters to
and from the core's types that reuse the core's own parsers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import msgspec
from msgspec import UNSET, UnsetType, field

from shared.core import codec, keys
from shared.core.accounting import TrackedPod, node_snapshot, track_pod
from shared.core.errors import CoreError
from shared.core.model import ContainerKind, DeviceInfo, NodeSnapshot, Usage
from shared.core.pods import pod_from_object
from shared.core.quota import QuotaLedger, QuotaLimit
from shared.messages_base import Int, MessageError, NonNegative, Shape, cut

if TYPE_CHECKING:
    from collections.abc import Iterable


class RegisterItem(Shape, frozen=True, kw_only=True):
    """One GPU as in HAMi's `hami.io/node-nvidia-register` JSON list. Absent `index` means its
    position in the list; `numa`, `mode` and `health` default as HAMi's do."""

    id: str
    index: Int | UnsetType = UNSET
    count: NonNegative
    devmem: NonNegative
    devcore: NonNegative
    type: str
    numa: Int = 0
    mode: str = "hami-core"
    health: bool = True

    @classmethod
    def from_device(cls, device: DeviceInfo) -> RegisterItem:
        """What `codec.register_item` writes."""
        return cls(
            id=device.id,
            index=device.index,
            count=device.count,
            devmem=device.devmem,
            devcore=device.devcore,
            type=device.type,
            numa=device.numa,
            mode=device.mode,
            health=device.health,
        )


def register_items(devices: Iterable[DeviceInfo]) -> tuple[RegisterItem, ...]:
    return tuple(RegisterItem.from_device(d) for d in devices)


def devices_to_core(items: Iterable[RegisterItem]) -> tuple[DeviceInfo, ...]:
    """The devices, validated by the core exactly like the register annotation (empty ids,
    duplicates, index defaulting to the position)."""
    try:
        return codec.parse_register_items([msgspec.to_builtins(item) for item in items])
    except CoreError as exc:
        raise MessageError(cut(f"devices: {exc}")) from exc


class MiniContainer(Shape, frozen=True, kw_only=True):
    name: str = ""
    restart_policy: str | UnsetType = UNSET
    """`Always` for a sidecar (an init container that keeps running); absent otherwise."""


class MiniPodMeta(Shape, frozen=True, kw_only=True):
    uid: str
    namespace: str = "default"
    name: str = ""
    resource_version: str = ""
    annotations: dict[str, str] = field(default_factory=dict)


class MiniPodSpec(Shape, frozen=True, kw_only=True):
    node_name: str = ""
    init_containers: tuple[MiniContainer, ...] = ()
    containers: tuple[MiniContainer, ...] = ()


class MiniPodStatus(Shape, frozen=True, kw_only=True):
    phase: str = "Pending"


class MiniPod(Shape, frozen=True, kw_only=True):
    """A Pod object cut down to what the core reads: identity, the `hami.io/` and
    `nvidia.com/` annotations, container names and sidecar flags, phase. Defaults are those
    of `pod_from_object`."""

    metadata: MiniPodMeta
    spec: MiniPodSpec = field(default_factory=MiniPodSpec)
    status: MiniPodStatus = field(default_factory=MiniPodStatus)


_KEPT_PREFIXES: Final = ("hami.io/", "nvidia.com/")


class TrackedPodWire(Shape, frozen=True, kw_only=True):
    """One pod of accounting's ledger: its mini pod and whether its init phase is released."""

    pod: MiniPod
    released: bool

    @classmethod
    def from_core(cls, tracked: TrackedPod) -> TrackedPodWire:
        pod = tracked.pod
        inits = [c for c in pod.containers if c.kind is not ContainerKind.APP]
        apps = [c for c in pod.containers if c.kind is ContainerKind.APP]
        return cls(
            pod=MiniPod(
                metadata=MiniPodMeta(
                    uid=pod.uid,
                    namespace=pod.namespace,
                    name=pod.name,
                    resource_version=pod.resource_version,
                    annotations={
                        k: v for k, v in pod.annotations.items() if k.startswith(_KEPT_PREFIXES)
                    },
                ),
                spec=MiniPodSpec(
                    node_name=pod.node_name,
                    init_containers=tuple(
                        MiniContainer(
                            name=c.name,
                            restart_policy="Always" if c.kind is ContainerKind.SIDECAR else UNSET,
                        )
                        for c in inits
                    ),
                    containers=tuple(MiniContainer(name=c.name) for c in apps),
                ),
                status=MiniPodStatus(phase=pod.phase),
            ),
            released=tracked.released,
        )

    def to_core(self) -> TrackedPod:
        """The ledger entry, rebuilt with the core's `pod_from_object` and `track_pod` (as
        accounting builds its own)."""
        spec = self.pod.spec
        obj = {
            "metadata": msgspec.to_builtins(self.pod.metadata),
            "spec": {
                "nodeName": spec.node_name,
                "initContainers": [msgspec.to_builtins(c) for c in spec.init_containers],
                "containers": [msgspec.to_builtins(c) for c in spec.containers],
            },
            "status": msgspec.to_builtins(self.pod.status),
        }
        try:
            pod = pod_from_object(obj)
        except CoreError as exc:
            raise MessageError(cut(f"tracked pod: {exc}")) from exc
        tracked = track_pod(pod, released=self.released)
        if tracked is None:
            raise MessageError(cut(f"tracked pod {pod.key} carries no reservation"))
        return tracked


class NodeStateLike(Protocol):
    """What `NodeStateWire.from_state` reads (`NodeState` below, or accounting's ledger)."""

    @property
    def name(self) -> str: ...
    @property
    def revision(self) -> int: ...
    @property
    def devices(self) -> tuple[DeviceInfo, ...] | None: ...
    @property
    def cordoned(self) -> frozenset[str]: ...
    @property
    def pods(self) -> tuple[TrackedPod, ...]: ...


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as a reader sees it: inventory (None: not registered), revision, cordons and
    its tracked pods."""

    name: str
    revision: int
    devices: tuple[DeviceInfo, ...] | None
    cordoned: frozenset[str]
    pods: tuple[TrackedPod, ...]

    def snapshot(self) -> NodeSnapshot | None:
        if self.devices is None:
            return None
        return node_snapshot(self.name, self.devices, self.cordoned, self.pods)


class NodeStateWire(Shape, frozen=True, kw_only=True):
    """One node of a snapshot reply. `devices` is `null` for a node without inventory.
    `epoch` is the node's own (partitioned accounting: the epoch of its partition's current
    ownership); absent, the reply's epoch applies."""

    node: str
    revision: NonNegative
    devices: tuple[RegisterItem, ...] | None = None
    cordoned: tuple[str, ...]
    pods: tuple[TrackedPodWire, ...]
    epoch: str | UnsetType = UNSET

    @classmethod
    def from_state(cls, state: NodeStateLike, epoch: str | None = None) -> NodeStateWire:
        return cls(
            node=state.name,
            revision=state.revision,
            devices=None if state.devices is None else register_items(state.devices),
            cordoned=tuple(sorted(state.cordoned)),
            pods=tuple(TrackedPodWire.from_core(p) for p in state.pods),
            epoch=UNSET if epoch is None else epoch,
        )

    def to_state(self) -> NodeState:
        return NodeState(
            name=self.node,
            revision=self.revision,
            devices=None if self.devices is None else devices_to_core(self.devices),
            cordoned=frozenset(self.cordoned),
            pods=tuple(p.to_core() for p in self.pods),
        )


class QuotaWire(Shape, frozen=True, kw_only=True):
    """One namespace's GPU quota: limits (`null`: not set) and the usage counted against them."""

    namespace: str
    limit_mem: Int | None = None
    limit_cores: Int | None = None
    used_mem: Int = 0
    used_cores: Int = 0

    @classmethod
    def from_ledger(cls, ledger: QuotaLedger, namespace: str) -> QuotaWire:
        limit = ledger.limits.get(namespace, QuotaLimit())
        used = ledger.used.get(namespace, Usage())
        return cls(
            namespace=namespace,
            limit_mem=limit.mem,
            limit_cores=limit.cores,
            used_mem=used.mem,
            used_cores=used.cores,
        )

    def to_core(self) -> QuotaLedger:
        return QuotaLedger(
            {self.namespace: QuotaLimit(self.limit_mem, self.limit_cores)},
            {self.namespace: Usage(self.used_mem, self.used_cores)},
        )


class PendingEntry(Shape, frozen=True, kw_only=True):
    """A non-empty to-allocate entry: its container position, name and devices (HAMi's
    per-container encoding)."""

    index: Int
    container_name: str = ""
    devices: str


class PendingPod(Shape, frozen=True, kw_only=True):
    """The pod the node must allocate next. `numaAlignment` is `null` when not annotated."""

    uid: str
    namespace: str
    name: str
    numa_alignment: str | None = None
    entries: tuple[PendingEntry, ...] = ()

    @classmethod
    def from_tracked(cls, tracked: TrackedPod) -> PendingPod:
        pod = tracked.pod
        names = [c.name for c in pod.containers]
        return cls(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            numa_alignment=pod.annotations.get(keys.NUMA_ALIGNMENT),
            entries=tuple(
                PendingEntry(
                    index=i, container_name=names[i], devices=codec.encode_container(entry)
                )
                for i, entry in enumerate(tracked.pending_rows or ())
                if entry and i < len(names)
            ),
        )
