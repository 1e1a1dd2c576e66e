"""Every NATS message numafit sends, as typed, versioned msgspec structs.

One struct per message, describing today's JSON exactly: the same keys, the same required and
optional fields, the same defaults. `encode(msg)` writes what the services wrote by hand, and
`decode(data, Type)` reads what they send, raising `MessageError` (a `ValueError`) naming the
message and the field: `refit request: Expected `int`, got `str` - at `$.containerIndex``.

| struct | subject |
|---|---|
| `RefitRequest` / `RefitReply` | `numafit.refit.v1.<node>` |
| `ReserveRequest` / `ReserveReply` | `numafit.accounting.v1.reserve.<slot>.<node>` |
| `BindPhaseRequest` / `BindPhaseReply` | `numafit.accounting.v1.bind-phase.<slot>.<node>` |
| `MoveRequest` / `MoveReply` | `numafit.accounting.v1.move.<slot>.<node>` |
| `ConsumeRequest` / `ConsumeReply` | `numafit.accounting.v1.consume.<slot>.<node>` |
| `PendingRequest` / `PendingReply` | `numafit.accounting.v1.pending.<slot>.<node>` |
| `SnapshotRequest` / `SnapshotReply` | `numafit.accounting.v1.snapshot.<slot>.<node or _all>` |
| `RegisterRequest` / `RegisterReply` | `numafit.accounting.v1.register.<slot>.<node>` |
| `UsageUpdate` | `numafit.usage.v1.<node>` (published) |

`<slot>` is the node's slot (shared/subjects.py builds every subject), which routes a request to
the accounting replica owning the node's partition.

Shapes nested in them (`NodeStateWire`, `TrackedPodWire` and its mini pod, `QuotaWire`,
`RegisterItem`, `UsageEntry`, `PendingPod`) come with converters to and from the core's types
(`TrackedPod`, `NodeSnapshot`, `QuotaLedger`, `DeviceInfo`, the core's `RefitInput` and
`RefitDecision`), which reuse the core's own parsers.

How fields are omitted. A field is left out of the JSON exactly when today's code leaves it out:

- messages (`Message`) omit fields at their default, which is `None` (or `False`) for every
  field today's code sends only sometimes (`error`, `revision`, `podResourceVersion`, ...);
- a field typed `... | UnsetType` is written exactly when it was set (absent on the wire is
  `UNSET`): `"pod": null` (pending, and a snapshot asked with a podUID) beside no `pod` at
  all (refusals), `containerName` only when the sender wrote one, `v` only when set;
- nested shapes (`Shape`) and the refit request write every field (today's encoders write
  `"devices": null`, `"limitMem": null`, `"containerIndex": 0`, `"timeoutMs": 2000`, ...),
  except those `UNSET`.

Schema version. Every message has `v`, its schema version. Absent means 1: HAMi's device plugin
and every sender before this module send none, and numafit's own encoder leaves it out at 1, so
today's bytes are unchanged. `v` is bumped only for a change old readers would misread (adding
a field is not one: unknown fields are ignored), and `decode` refuses a message newer than its
type's `VERSION` rather than misreading it.

Business rules stay where they are: node and pod names are checked by `shared.subjects`, the
refit's refusal order (empty fields, device types, the allowed-set limit) by the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Protocol, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from shared.core import codec, keys
from shared.core import refit as core_refit
from shared.core.accounting import TrackedPod, node_snapshot, track_pod
from shared.core.errors import CoreError
from shared.core.lock import Lock
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot, Usage
from shared.core.pods import Alignment, parse_alignment, pod_from_object
from shared.core.quota import QuotaLedger, QuotaLimit

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

MAX_ERROR_LENGTH: Final = 300
"""A `MessageError`'s text is cut to this many characters (input is never echoed whole)."""
MAX_CONSUME_DEVICES: Final = 64
"""GPUs one `consume` may name (kubelet gives a container a few)."""

# Integers within 64 bits, as today's JSON parser (orjson) read them: a larger literal became a
# float there, refused as "must be an integer".
Int = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
NonNegative = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Positive = Annotated[int, Meta(ge=1, le=2**63 - 1)]
Version = Annotated[int, Meta(ge=1, le=2**31 - 1)]
TimeoutMs = Annotated[int, Meta(ge=1, le=core_refit.MAX_TIMEOUT_MS)]


class MessageError(ValueError):
    """A message is not JSON, not an object, has a field of the wrong type or out of range,
    or cannot be turned into the core's types. The text names the message and the field."""


class Message(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    omit_defaults=True,
    rename="camel",
    forbid_unknown_fields=False,
):
    """A top-level NATS message body."""

    WHAT: ClassVar[str] = "message"
    """How errors name this message."""
    VERSION: ClassVar[int] = 1
    """The newest schema version of this message this build reads and writes."""

    v: Version | UnsetType = UNSET
    """Schema version; absent means 1 (see the module docstring)."""

    @property
    def version(self) -> int:
        return 1 if isinstance(self.v, UnsetType) else self.v


class Shape(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=False):
    """A JSON object nested in a message: every field is written, at its default too."""


def _cut(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    return text if len(text) <= limit else f"{text[: limit - 30]}... ({len(text)} characters)"


# --- the refit contract (device plugin -> svc_refit) ----------------------------------------


class RefitRequest(Message, frozen=True, kw_only=True, omit_defaults=False):
    """`numafit.refit.v1.<node>`: HAMi's fields plus `mode` and `timeoutMs` (DESIGN.md).

    Every field may be absent, as a Go decoder would leave it: strings empty (refused later by
    the core as incomplete), `containerIndex` 0, no allowed devices, `mode` best-effort,
    `timeoutMs` 2000. Today's encoder writes every field but an empty `containerName`, so
    `containerName` is `UNSET` unless sent (use `container`)."""

    WHAT: ClassVar[str] = "refit request"

    pod_uid: str = field(default="", name="podUID")
    pod_namespace: str = ""
    pod_name: str = ""
    node_name: str = ""
    container_index: Int = 0
    device_type: str = ""
    allowed_device_uuids: tuple[str, ...] = field(default=(), name="allowedDeviceUUIDs")
    mode: str = Alignment.BEST_EFFORT.value
    """As sent: case and surrounding spaces are ignored (`alignment` is the parsed value)."""
    timeout_ms: TimeoutMs = keys.DEFAULT_REFIT_TIMEOUT_MS
    container_name: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        try:
            parse_alignment(self.mode)
        except CoreError:
            raise ValueError("mode must be 'best-effort' or 'strict'") from None

    @property
    def alignment(self) -> Alignment:
        return parse_alignment(self.mode) or Alignment.BEST_EFFORT

    @property
    def container(self) -> str:
        """`containerName`, empty when not sent."""
        return "" if isinstance(self.container_name, UnsetType) else self.container_name

    @classmethod
    def from_core(cls, request: core_refit.RefitInput) -> RefitRequest:
        """What `core_refit.RefitInput.to_json()` writes."""
        return cls(
            pod_uid=request.pod_uid,
            pod_namespace=request.pod_namespace,
            pod_name=request.pod_name,
            node_name=request.node_name,
            container_index=request.container_index,
            device_type=request.device_type,
            allowed_device_uuids=tuple(request.allowed_device_uuids),
            mode=request.mode.value,
            timeout_ms=request.timeout_ms,
            container_name=request.container_name or UNSET,
        )

    def to_core(self) -> core_refit.RefitInput:
        return core_refit.RefitInput(
            pod_uid=self.pod_uid,
            pod_namespace=self.pod_namespace,
            pod_name=self.pod_name,
            node_name=self.node_name,
            container_index=self.container_index,
            container_name=self.container,
            device_type=self.device_type,
            allowed_device_uuids=self.allowed_device_uuids,
            mode=self.alignment,
            timeout_ms=self.timeout_ms,
        )


class RefitReply(Message, frozen=True, kw_only=True):
    """HAMi's `succeeded`, `containerDevices` (on success) and `failureReason` (on failure),
    plus `code` and, when there are any, `fitReasons`."""

    WHAT: ClassVar[str] = "refit reply"

    succeeded: bool
    code: str
    """A `shared.codes.Code` value (kept a string: a newer service may send a new one)."""
    container_devices: str | None = None
    failure_reason: str | None = None
    fit_reasons: dict[str, NonNegative] | None = None

    @classmethod
    def from_decision(cls, decision: core_refit.RefitDecision) -> RefitReply:
        """What `RefitDecision.reply()` writes."""
        return cls(
            succeeded=decision.succeeded,
            code=decision.code.value,
            container_devices=(
                codec.encode_container(decision.container_devices) if decision.succeeded else None
            ),
            failure_reason=None if decision.succeeded else decision.failure_reason,
            fit_reasons=dict(sorted(decision.fit_reasons.items())) or None,
        )


# --- shapes inside accounting's replies -----------------------------------------------------


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
        raise MessageError(_cut(f"devices: {exc}")) from exc


class MiniContainer(Shape, frozen=True, kw_only=True):
    name: str = ""
    restart_policy: str | UnsetType = UNSET
    """`Always` for a sidecar (an init container that keeps running); absent otherwise."""


class MiniPodMeta(Shape, frozen=True, kw_only=True):
    uid: str
    namespace: str = "default"
    name: str = ""
    resource_version: str = ""
    annotations: dict[str, str] = {}


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
            raise MessageError(_cut(f"tracked pod: {exc}")) from exc
        tracked = track_pod(pod, released=self.released)
        if tracked is None:
            raise MessageError(_cut(f"tracked pod {pod.key} carries no reservation"))
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


# --- accounting operations ------------------------------------------------------------------


class AccountingRequest(Message, frozen=True, kw_only=True):
    """A request on `numafit.accounting.v1.<op>.<slot>.<node>`: each names its `node` (the snapshot
    of every node excepted) and may carry `deadlineMs`, the caller's remaining budget, and
    `deadlineAtMs`, the same deadline as a Unix time in milliseconds. The absolute one is what
    fences a request that waited (in a paused process, a socket buffer, a takeover): accounting
    never acts on a request after it, however late the request is read."""

    OP: ClassVar[str] = ""

    deadline_ms: Int | None = None
    deadline_at_ms: NonNegative | None = None


class AccountingReply(Message, frozen=True, kw_only=True):
    """Every accounting reply: `ok`, `code`, `epoch` (changes on every accounting start) and
    the node's `revision` when accounting knows the node; a refusal carries `error`. A body
    accounting could not read at all is answered without `epoch`."""

    ok: bool
    code: str
    """`ok`, or a refusal's `shared.codes.Code` value (a string: a newer peer may add one)."""
    error: str | None = None
    epoch: str | None = None
    node: str | None = None
    revision: NonNegative | None = None


class ReserveRequest(AccountingRequest, frozen=True, kw_only=True):
    """The scheduler's decision at `revision`: `allocated` goes into both allocation
    annotations."""

    WHAT: ClassVar[str] = "reserve request"
    OP: ClassVar[str] = "reserve"

    pod_uid: str = field(name="podUID")
    pod_namespace: str
    pod_name: str
    revision: NonNegative
    allocated: str
    node: str
    epoch: str | None = None
    """The node epoch `revision` counts in (the read model's view): a replica whose epoch for
    the node differs (another ownership of its partition, another run) refuses with
    `conflict`, since a revision of one epoch means nothing in another."""


class ReserveReply(AccountingReply, frozen=True, kw_only=True):
    WHAT: ClassVar[str] = "reserve reply"

    pod_resource_version: str | None = None
    fit_reasons: dict[str, NonNegative] | None = None
    """On `no_fit` and `quota_exceeded`: HAMi's reason names with counts."""


class BindPhaseRequest(AccountingRequest, frozen=True, kw_only=True):
    """`phase` is `allocating`, `success` or `failed` (checked by accounting, after the pod)."""

    WHAT: ClassVar[str] = "bind-phase request"
    OP: ClassVar[str] = "bind-phase"

    pod_uid: str = field(name="podUID")
    phase: str
    node: str
    pod_namespace: str = ""
    pod_name: str = ""
    """The pod the caller means (ExtenderBindingArgs' PodNamespace/PodName); when given,
    accounting refuses a UID whose pod is another (`pod_mismatch`) before writing anything."""
    bind: bool = False
    """With `allocating`: accounting binds the pod to `node` itself, the reservation and the
    phase carried by the Binding (one guarded write instead of a PATCH and a Binding); the
    reply's `bound` says it did. A replica that does not know the field only writes."""


class BindPhaseReply(AccountingReply, frozen=True, kw_only=True):
    WHAT: ClassVar[str] = "bind-phase reply"

    pod_resource_version: str | None = None
    """The pod's resourceVersion after the write, when the API server's answer carried it (a
    Binding's answer is a Status: then None)."""
    bound: bool = False
    """The pod is bound to the node (the request asked for `bind` and the Binding landed)."""


class MoveRequest(AccountingRequest, frozen=True, kw_only=True):
    """The refit's commit at `revision` (or, with `podResourceVersion`, of that unchanged pod
    at a later revision): both annotation values, only `containerIndex`'s entry changed."""

    WHAT: ClassVar[str] = "move request"
    OP: ClassVar[str] = "move"

    pod_uid: str = field(name="podUID")
    revision: NonNegative
    epoch: str | None = None
    """The node epoch `revision` counts in (as for `reserve`)."""
    pod_resource_version: str | None = None
    container_index: NonNegative
    to_allocate: str
    allocated: str
    node: str


class MoveReply(AccountingReply, frozen=True, kw_only=True):
    WHAT: ClassVar[str] = "move reply"

    pod_resource_version: str | None = None
    fit_reasons: dict[str, NonNegative] | None = None
    """On `no_fit` and `quota_exceeded`: HAMi's reason names with counts."""


class ConsumeRequest(AccountingRequest, frozen=True, kw_only=True):
    """Allocate: the GPUs kubelet gave; the pod (default: the node's pending one) and the
    container (default: the one those GPUs were reserved for)."""

    WHAT: ClassVar[str] = "consume request"
    OP: ClassVar[str] = "consume"

    devices: Annotated[tuple[str, ...], Meta(max_length=MAX_CONSUME_DEVICES)]
    pod_uid: str | None = field(default=None, name="podUID")
    container_index: Int | None = None
    node: str


class ConsumeReply(AccountingReply, frozen=True, kw_only=True):
    """On success: the consumed container, what it runs on, whether that differs from the
    reservation, and the pod's bind phase (empty when none)."""

    WHAT: ClassVar[str] = "consume reply"

    pod_uid: str | None = field(default=None, name="podUID")
    pod_namespace: str | None = None
    pod_name: str | None = None
    container_index: Int | None = None
    container_name: str | None = None
    container_devices: str | None = None
    drifted: bool | None = None
    bind_phase: str | None = None


class PendingRequest(AccountingRequest, frozen=True, kw_only=True):
    WHAT: ClassVar[str] = "pending request"
    OP: ClassVar[str] = "pending"

    node: str


class PendingReply(AccountingReply, frozen=True, kw_only=True):
    """On success `pod` is the pod to allocate next, or `null` when none is pending."""

    WHAT: ClassVar[str] = "pending reply"

    pod: PendingPod | UnsetType | None = UNSET


class SnapshotRequest(AccountingRequest, frozen=True, kw_only=True):
    """One node's state (with `podUID`, also that pod wherever it is tracked; with
    `namespace`, that namespace's quota). On `_all`, no `node`: a page of every node by name,
    from `after` (default the start), at most `limit` (default 200) nodes."""

    WHAT: ClassVar[str] = "snapshot request"
    OP: ClassVar[str] = "snapshot"

    pod_uid: str | None = field(default=None, name="podUID")
    namespace: str | None = None
    after: str | None = None
    limit: Positive | None = None
    node: str | None = None


class SnapshotReply(AccountingReply, frozen=True, kw_only=True):
    """`nodes` holds the node asked for (none when accounting does not know it), or a page of
    every node with `more` and `next` (the `after` of the next page). `pod` is sent when a
    podUID was asked for: `null` when the pod is not tracked.

    Partitioned, `<slot>._all` is answered by the one replica serving that slot, for every
    partition it serves: `replica` names it, `partitions` lists them, `partitionCount` is how
    many there are (a reader asks the owner of each partition not covered yet, until all are:
    shared/accounting_client.py)."""

    WHAT: ClassVar[str] = "snapshot reply"

    more: bool | None = None
    next: str | None = None
    nodes: tuple[NodeStateWire, ...] | None = None
    pod: TrackedPodWire | UnsetType | None = UNSET
    quota: QuotaWire | None = None
    replica: str | None = None
    partitions: tuple[NonNegative, ...] | None = None
    partition_count: Positive | None = None

    def __post_init__(self) -> None:
        if self.ok and self.epoch is None:
            raise ValueError("epoch is required")
        if self.ok and self.nodes is None:
            raise ValueError("nodes is required")


class RegisterRequest(AccountingRequest, frozen=True, kw_only=True):
    """The node's GPU inventory, to be written as HAMi's register annotation."""

    WHAT: ClassVar[str] = "register request"
    OP: ClassVar[str] = "register"

    devices: tuple[RegisterItem, ...]
    node: str


class RegisterReply(AccountingReply, frozen=True, kw_only=True):
    WHAT: ClassVar[str] = "register reply"


OPS: Final[Mapping[str, tuple[type[AccountingRequest], type[AccountingReply]]]] = {
    request.OP: (request, reply)
    for request, reply in (
        (ReserveRequest, ReserveReply),
        (BindPhaseRequest, BindPhaseReply),
        (MoveRequest, MoveReply),
        (ConsumeRequest, ConsumeReply),
        (PendingRequest, PendingReply),
        (SnapshotRequest, SnapshotReply),
        (RegisterRequest, RegisterReply),
    )
}
"""Each accounting operation's request and reply type, by operation name."""


# --- usage updates (accounting -> every reader) ---------------------------------------------


class UsageEntry(Shape, frozen=True, kw_only=True):
    """One GPU's usage as accounting counts it: slots, memory (MiB), cores (percent)."""

    used: NonNegative
    usedmem: NonNegative
    usedcores: NonNegative


class LockWire(Shape, frozen=True, kw_only=True):
    """A node's lock (HAMi's: one pod allocating at a time): the holder and its bind time."""

    pod: str
    """`namespace/name`."""
    uid: str
    since: NonNegative
    """Unix seconds of the bind (bind-time annotation); readers judge the expiry."""

    @classmethod
    def from_core(cls, lock: Lock) -> LockWire:
        return cls(pod=lock.pod_key, uid=lock.uid, since=lock.since)

    def to_core(self) -> Lock:
        return Lock(self.pod, self.uid, self.since)


class UsageUpdate(Message, frozen=True, kw_only=True):
    """Published on `numafit.usage.v1.<node>` after every change of the node: its revision and
    full per-device usage table. A deleted node is published once more with `deleted: true` and
    no devices. `allocating` names the pod holding the node's lock (omitted when none does)."""

    WHAT: ClassVar[str] = "usage update"

    epoch: str
    node: str
    revision: NonNegative
    devices: dict[str, UsageEntry]
    deleted: bool = False
    allocating: LockWire | None = None


def usage_entries(snapshot: NodeSnapshot | None) -> dict[str, UsageEntry]:
    """A node's usage table (empty for a node without inventory), as `usage_table()` has it."""
    if snapshot is None:
        return {}
    return {
        d.info.id: UsageEntry(used=d.used, usedmem=d.usedmem, usedcores=d.usedcores)
        for d in snapshot.devices
    }


def apply_usage(snapshot: NodeSnapshot, devices: Mapping[str, UsageEntry]) -> NodeSnapshot | None:
    """`snapshot`'s devices with the usage of a published table, or None when the table is for
    another device set (readers then take a snapshot instead)."""
    if set(devices) != {d.info.id for d in snapshot.devices}:
        return None
    updated = [
        DeviceUsage(d.info, u.used, u.usedmem, u.usedcores)
        for d in snapshot.devices
        for u in (devices[d.info.id],)
    ]
    return NodeSnapshot(snapshot.name, updated, snapshot.cordoned)


# --- encoding and decoding ------------------------------------------------------------------

M = TypeVar("M", bound=Message)

_ENCODER: Final = msgspec.json.Encoder()
_DECODERS: dict[type[Message], msgspec.json.Decoder[Any]] = {}


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def decode(data: bytes | bytearray | memoryview | str, kind: type[M]) -> M:
    """`data` as a `kind` message; `MessageError` naming the message and the field otherwise."""
    decoder = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    what = kind.WHAT
    try:
        message = decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise MessageError(_explain(what, str(exc))) from exc
    except msgspec.DecodeError as exc:
        raise MessageError(_cut(f"{what} is not valid JSON: {exc}")) from exc
    assert isinstance(message, kind)
    if message.version > kind.VERSION:
        raise MessageError(
            f"{what}: schema version {message.version} is newer than {kind.VERSION}, "
            "the newest this build reads"
        )
    return message


def _explain(what: str, text: str) -> str:
    if text.startswith("Expected `object`, got `") and " - at " not in text:
        return f"{what} must be a JSON object, got {text.removeprefix('Expected `object`, got ')}"
    return _cut(f"{what}: {text}")
