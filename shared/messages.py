"""Every NATS message numafit sends, as typed, versioned msgspec structs: the one name to
import them by.

One struct per message, describing today's JSON exactly: the same keys, the same required and
optional fields, the same defaults. `encode(msg)` writes what the services wrote by hand, and
`decode(data, Type)` reads what they send, raising `MessageError` (a `ValueError`) naming the
message and the field: `refit request: Expected `int`, got `str` - at `$.containerIndex``.

They are defined in one module per family, all named here: the bases, `encode` and `decode`
(shared/messages_base.py), the refit contract (messages_refit.py), accounting's operations
(messages_accounting.py) and the shapes nested in their replies (messages_shapes.py), and the
usage updates (messages_usage.py).

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

How fields are omitted, and what the schema version `v` means: shared/messages_base.py.

Business rules stay where they are: node and pod names are checked by `shared.subjects`, the
refit's refusal order (empty fields, device types, the allowed-set limit) by the core.
"""

from __future__ import annotations

from shared.messages_accounting import (
    MAX_CONSUME_DEVICES,
    OPS,
    AccountingReply,
    AccountingRequest,
    BindPhaseReply,
    BindPhaseRequest,
    ConsumeReply,
    ConsumeRequest,
    MoveReply,
    MoveRequest,
    PendingReply,
    PendingRequest,
    RegisterReply,
    RegisterRequest,
    ReserveReply,
    ReserveRequest,
    SnapshotReply,
    SnapshotRequest,
)
from shared.messages_base import (
    MAX_ERROR_LENGTH,
    Int,
    Message,
    MessageError,
    NonNegative,
    Positive,
    Shape,
    TimeoutMs,
    Version,
    cut,
    decode,
    encode,
)
from shared.messages_refit import (
    RefitReply,
    RefitRequest,
)
from shared.messages_shapes import (
    MiniContainer,
    MiniPod,
    MiniPodMeta,
    MiniPodSpec,
    MiniPodStatus,
    NodeState,
    NodeStateLike,
    NodeStateWire,
    PendingEntry,
    PendingPod,
    QuotaWire,
    RegisterItem,
    TrackedPodWire,
    devices_to_core,
    register_items,
)
from shared.messages_usage import (
    LockWire,
    UsageEntry,
    UsageUpdate,
    apply_usage,
    usage_entries,
)

__all__ = [
    "MAX_CONSUME_DEVICES",
    "MAX_ERROR_LENGTH",
    "OPS",
    "AccountingReply",
    "AccountingRequest",
    "BindPhaseReply",
    "BindPhaseRequest",
    "ConsumeReply",
    "ConsumeRequest",
    "Int",
    "LockWire",
    "Message",
    "MessageError",
    "MiniContainer",
    "MiniPod",
    "MiniPodMeta",
    "MiniPodSpec",
    "MiniPodStatus",
    "MoveReply",
    "MoveRequest",
    "NodeState",
    "NodeStateLike",
    "NodeStateWire",
    "NonNegative",
    "PendingEntry",
    "PendingPod",
    "PendingReply",
    "PendingRequest",
    "Positive",
    "QuotaWire",
    "RefitReply",
    "RefitRequest",
    "RegisterItem",
    "RegisterReply",
    "RegisterRequest",
    "ReserveReply",
    "ReserveRequest",
    "Shape",
    "SnapshotReply",
    "SnapshotRequest",
    "TimeoutMs",
    "TrackedPodWire",
    "UsageEntry",
    "UsageUpdate",
    "Version",
    "apply_usage",
    "cut",
    "decode",
    "devices_to_core",
    "encode",
    "register_items",
    "usage_entries",
]
