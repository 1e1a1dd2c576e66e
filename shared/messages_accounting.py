"""Accounting's operations, each a request and its reply on
`numafit.accounting.v1.<op>.<slot>.<node>`: reserve, bind-phase, move, consume, pending,
snapshot, register; `OPS` maps each operation's name to its two types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar, Final

from msgspec import UNSET, Meta, UnsetType, field

from shared.messages_base import Int, Message, NonNegative, Positive
from shared.messages_shapes import (
    NodeStateWire,
    PendingPod,
    QuotaWire,
    RegisterItem,
    TrackedPodWire,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

MAX_CONSUME_DEVICES: Final = 64
"""GPUs one `consume` may name (kubelet gives a container a few)."""


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
