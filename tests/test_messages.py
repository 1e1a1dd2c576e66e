"""shared.messages: every NATS message as today's services write it decodes, and encodes back
to the same JSON; bad input is refused with a MessageError naming the field.

The literal messages below were recorded from the running services (accounting, refit, the
client the device plugin and scheduler use) on the Kubernetes API emulator and a real
nats-server, then shortened by hand.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import messages, subjects
from shared.core import refit as core_refit
from shared.core.accounting import track_pod
from shared.core.model import ContainerDevice, ContainerKind, DeviceInfo, Usage
from shared.core.pods import Alignment, pod_from_object
from shared.core.quota import QuotaLedger, QuotaLimit
from shared.messages import (
    BindPhaseReply,
    BindPhaseRequest,
    ConsumeReply,
    ConsumeRequest,
    Message,
    MessageError,
    MoveReply,
    MoveRequest,
    NodeState,
    NodeStateWire,
    PendingPod,
    PendingReply,
    PendingRequest,
    QuotaWire,
    RefitReply,
    RefitRequest,
    RegisterItem,
    RegisterReply,
    RegisterRequest,
    ReserveReply,
    ReserveRequest,
    SnapshotReply,
    SnapshotRequest,
    TrackedPodWire,
    UsageEntry,
    UsageUpdate,
    decode,
    encode,
)

EPOCH = "c42e60d33064"
UID = "675bf6fd-df0f-4187-9144-5e6433a7d514"
SIDE_UID = "bafa6dd6-1823-49f1-8391-b4903a7cd767"

GPU_A = {
    "id": "GPU-a",
    "index": 0,
    "count": 10,
    "devmem": 40000,
    "devcore": 100,
    "type": "NVIDIA A100-SXM4-40GB",
    "numa": 1,
    "mode": "hami-core",
    "health": True,
}
GPU_B = {
    "id": "GPU-b",
    "index": 1,
    "count": 10,
    "devmem": 40000,
    "devcore": 100,
    "type": "NVIDIA A100-SXM4-40GB",
    "numa": 0,
    "mode": "hami-core",
    "health": True,
}
TRAIN_ANNOTATIONS = {
    "hami.io/numa-alignment": "best-effort",
    "hami.io/vgpu-node": "node-1",
    "hami.io/bind-phase": "allocating",
    "hami.io/vgpu-devices-to-allocate": ";GPU-a,NVIDIA,20000,30:;",
    "hami.io/vgpu-devices-allocated": "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;",
}
TRACKED_TRAIN = {
    "pod": {
        "metadata": {
            "uid": UID,
            "namespace": "ml",
            "name": "train",
            "resourceVersion": "6",
            "annotations": TRAIN_ANNOTATIONS,
        },
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "prep"}],
            "containers": [{"name": "main"}],
        },
        "status": {"phase": "Pending"},
    },
    "released": False,
}
TRACKED_SIDE = {
    "pod": {
        "metadata": {
            "uid": SIDE_UID,
            "namespace": "ml",
            "name": "side",
            "resourceVersion": "7",
            "annotations": {
                "hami.io/numa-alignment": "strict",
                "hami.io/vgpu-node": "node-1",
                "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1000,0:;GPU-a,NVIDIA,1000,0:;GPU-a,NVIDIA,2000,0:;",
                "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,1000,0:;GPU-a,NVIDIA,1000,0:;GPU-a,NVIDIA,2000,0:;",
            },
        },
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "prep"}, {"name": "side", "restartPolicy": "Always"}],
            "containers": [{"name": "app"}],
        },
        "status": {"phase": "Pending"},
    },
    "released": False,
}
NODE_1 = {
    "node": "node-1",
    "revision": 3,
    "devices": [GPU_A, GPU_B],
    "cordoned": [],
    "pods": [TRACKED_SIDE, TRACKED_TRAIN],
}
NODE_UNREGISTERED = {
    "node": "node-3",
    "revision": 0,
    "devices": None,
    "cordoned": ["GPU-x"],
    "pods": [],
}
QUOTA_ML = {
    "namespace": "ml",
    "limitMem": 200000,
    "limitCores": None,
    "usedMem": 53000,
    "usedCores": 90,
}
QUOTA_NONE = {
    "namespace": "other",
    "limitMem": None,
    "limitCores": None,
    "usedMem": 0,
    "usedCores": 0,
}

REFIT_REQUEST = {
    "podUID": UID,
    "podNamespace": "ml",
    "podName": "train",
    "nodeName": "node-1",
    "containerIndex": 1,
    "deviceType": "NVIDIA",
    "allowedDeviceUUIDs": ["GPU-b"],
    "mode": "best-effort",
    "timeoutMs": 2000,
    "containerName": "main",
}

MOVE_REQUEST = {
    "podUID": UID,
    "revision": 3,
    "podResourceVersion": "6",
    "containerIndex": 1,
    "toAllocate": ";GPU-b,NVIDIA,20000,30:;",
    "allocated": "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;",
    "node": "node-1",
    "deadlineMs": 1548,
}

EXAMPLES: list[tuple[type[Message], dict[str, Any]]] = [
    # --- refit contract
    (RefitRequest, REFIT_REQUEST),
    (RefitRequest, {**REFIT_REQUEST, "mode": "strict", "containerIndex": 0, "timeoutMs": 60000}),
    (RefitRequest, {k: v for k, v in REFIT_REQUEST.items() if k != "containerName"}),
    (RefitRequest, {**REFIT_REQUEST, "containerName": ""}),
    (
        RefitReply,
        {"succeeded": True, "code": "moved", "containerDevices": "GPU-b,NVIDIA,20000,30:"},
    ),
    (
        RefitReply,
        {
            "succeeded": True,
            "code": "already_aligned",
            "containerDevices": "GPU-b,NVIDIA,20000,30:",
        },
    ),
    (
        RefitReply,
        {
            "succeeded": False,
            "code": "no_fit",
            "failureReason": "no allowed device fits: 1/1 CardInsufficientMemory",
            "fitReasons": {"CardInsufficientMemory": 1},
        },
    ),
    (
        RefitReply,
        {
            "succeeded": False,
            "code": "invalid_request",
            "failureReason": "timeoutMs must be an integer in 1..60000",
        },
    ),
    # --- reserve
    (
        ReserveRequest,
        {
            "podUID": UID,
            "podNamespace": "ml",
            "podName": "new",
            "revision": 6,
            "allocated": "GPU-a,NVIDIA,39000,0:;",
            "node": "node-1",
            "deadlineMs": 1980,
        },
    ),
    (
        ReserveReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 7,
            "podResourceVersion": "21",
        },
    ),
    (
        ReserveReply,
        {
            "ok": False,
            "code": "no_fit",
            "error": "pod ml/new does not fit node node-1: 1/1 CardInsufficientMemory",
            "epoch": EPOCH,
            "revision": 6,
            "fitReasons": {"CardInsufficientMemory": 1},
        },
    ),
    # --- bind-phase
    (
        BindPhaseRequest,
        {"podUID": UID, "phase": "allocating", "node": "node-1", "deadlineMs": 1980},
    ),
    (
        BindPhaseReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 5,
            "podResourceVersion": "14",
        },
    ),
    (
        BindPhaseReply,
        {
            "ok": False,
            "code": "pod_not_tracked",
            "error": "pod 'nope' is not tracked",
            "epoch": EPOCH,
            "revision": 6,
        },
    ),
    # --- move
    (MoveRequest, MOVE_REQUEST),
    (
        MoveRequest,
        {
            "podUID": UID,
            "revision": 0,
            "podResourceVersion": "",
            "containerIndex": 0,
            "toAllocate": "",
            "allocated": "",
            "node": "node-1",
        },
    ),
    (
        MoveReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 4,
            "podResourceVersion": "9",
        },
    ),
    (
        MoveReply,
        {
            "ok": False,
            "code": "conflict",
            "error": "node node-1 is at revision 6, the request was computed on 0",
            "epoch": EPOCH,
            "revision": 6,
        },
    ),
    (
        MoveReply,
        {
            "ok": False,
            "code": "quota_exceeded",
            "error": "moving container 1 of pod ml/train would exceed the NVIDIA resource quota",
            "epoch": EPOCH,
            "revision": 6,
            "fitReasons": {"ResourceQuotaNotFit": 1},
        },
    ),
    # --- consume
    (ConsumeRequest, {"devices": ["GPU-b"], "node": "node-1", "deadlineMs": 1980}),
    (
        ConsumeRequest,
        {"podUID": UID, "devices": ["GPU-b", "GPU-a"], "containerIndex": 1, "node": "node-1"},
    ),
    (
        ConsumeReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 6,
            "podUID": UID,
            "podNamespace": "ml",
            "podName": "train",
            "containerIndex": 1,
            "containerName": "main",
            "containerDevices": "GPU-b,NVIDIA,20000,30:",
            "drifted": False,
            "bindPhase": "success",
        },
    ),
    (
        ConsumeReply,
        {
            "ok": False,
            "code": "nothing_pending",
            "error": "node node-1 has no pod waiting for allocation",
            "epoch": EPOCH,
            "revision": 6,
        },
    ),
    # --- pending
    (PendingRequest, {"node": "node-1", "deadlineMs": 1980}),
    (
        PendingReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 5,
            "pod": {
                "uid": UID,
                "namespace": "ml",
                "name": "train",
                "numaAlignment": "best-effort",
                "entries": [
                    {"index": 1, "containerName": "main", "devices": "GPU-b,NVIDIA,20000,30:"}
                ],
            },
        },
    ),
    (
        PendingReply,
        {"ok": True, "code": "ok", "epoch": EPOCH, "node": "node-1", "revision": 5, "pod": None},
    ),
    (PendingReply, {"ok": True, "code": "ok", "epoch": EPOCH, "node": "node-9", "pod": None}),
    (
        PendingReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 2,
            "pod": {
                "uid": UID,
                "namespace": "ml",
                "name": "train",
                "numaAlignment": None,
                "entries": [],
            },
        },
    ),
    # --- snapshot
    (SnapshotRequest, {"podUID": UID, "namespace": "ml", "node": "node-1", "deadlineMs": 1929}),
    (SnapshotRequest, {"node": "node-9", "deadlineMs": 1980}),
    (SnapshotRequest, {"after": "", "limit": 200, "deadlineMs": 1979}),
    (SnapshotRequest, {"after": "node-1", "limit": 1, "deadlineMs": 1979}),
    (
        SnapshotReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 3,
            "nodes": [NODE_1],
            "pod": TRACKED_TRAIN,
            "quota": QUOTA_ML,
        },
    ),
    (
        SnapshotReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 5,
            "nodes": [NODE_1],
            "pod": None,
            "quota": QUOTA_NONE,
        },
    ),
    (SnapshotReply, {"ok": True, "code": "ok", "epoch": EPOCH, "node": "node-9", "nodes": []}),
    (
        SnapshotReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "more": True,
            "next": "node-1",
            "nodes": [NODE_1],
        },
    ),
    (
        SnapshotReply,
        {
            "ok": True,
            "code": "ok",
            "epoch": EPOCH,
            "more": False,
            "next": "node-3",
            "nodes": [NODE_UNREGISTERED],
        },
    ),
    (
        SnapshotReply,
        {
            "ok": False,
            "code": "invalid_request",
            "error": "snapshot must name one node",
            "epoch": EPOCH,
        },
    ),
    # --- register
    (
        RegisterRequest,
        {
            "devices": [
                {**GPU_A, "id": "GPU-z", "numa": 0},
                {
                    "id": "GPU-y",
                    "count": 10,
                    "devmem": 40000,
                    "devcore": 100,
                    "type": "NVIDIA A100",
                    "numa": 1,
                    "mode": "hami-core",
                    "health": False,
                    "index": 1,
                },
            ],
            "node": "node-2.example",
            "deadlineMs": 1980,
        },
    ),
    (
        RegisterReply,
        {"ok": True, "code": "ok", "epoch": EPOCH, "node": "node-2.example", "revision": 2},
    ),
    (
        RegisterReply,
        {
            "ok": False,
            "code": "invalid_request",
            "error": "register: devices must be a list of objects",
            "epoch": EPOCH,
            "revision": 2,
        },
    ),
    # --- what accounting answers a body it cannot read (no epoch), or on an internal error
    (
        PendingReply,
        {"ok": False, "code": "invalid_request", "error": "pending request must be a JSON object"},
    ),
    (MoveReply, {"ok": False, "code": "api_error", "error": "internal error"}),
    # --- usage updates
    (
        UsageUpdate,
        {
            "epoch": EPOCH,
            "node": "node-1",
            "revision": 4,
            "devices": {
                "GPU-a": {"used": 2, "usedmem": 3000, "usedcores": 0},
                "GPU-b": {"used": 1, "usedmem": 30000, "usedcores": 60},
            },
        },
    ),
    (UsageUpdate, {"epoch": EPOCH, "node": "node-3", "revision": 0, "devices": {}}),
    (
        UsageUpdate,
        {"epoch": EPOCH, "node": "node-2.example", "revision": 3, "devices": {}, "deleted": True},
    ),
]


def as_json(value: Any) -> Any:
    """What a struct is as JSON (lists, not tuples)."""
    return orjson.loads(msgspec.json.encode(value))


def _id(example: tuple[type[Message], dict[str, Any]]) -> str:
    kind, body = example
    return f"{kind.__name__}-{body.get('code', '')}-{len(orjson.dumps(body))}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[_id(e) for e in EXAMPLES])
def test_todays_message_decodes_and_encodes_to_the_same_json(
    example: tuple[type[Message], dict[str, Any]],
) -> None:
    kind, body = example
    message = decode(orjson.dumps(body), kind)
    assert isinstance(message, kind)
    assert message.version == 1  # no `v`: version 1
    encoded = encode(message)
    assert orjson.loads(encoded) == body
    assert decode(encoded, kind) == message


def test_every_accounting_operation_has_a_request_and_a_reply() -> None:
    assert set(messages.OPS) == set(subjects.ACCOUNTING_OPS)
    for op, (request, reply) in messages.OPS.items():
        assert op == request.OP
        assert issubclass(request, messages.AccountingRequest)
        assert issubclass(reply, messages.AccountingReply)


# --- fields as the services read them ---------------------------------------------------------


def test_refit_request_fields_and_defaults() -> None:
    request = decode(orjson.dumps(REFIT_REQUEST), RefitRequest)
    assert request.pod_uid == UID
    assert request.allowed_device_uuids == ("GPU-b",)
    assert request.container == "main"
    assert request.alignment is Alignment.BEST_EFFORT

    # Every field may be absent, as a Go decoder would leave it.
    empty = decode(b"{}", RefitRequest)
    assert (empty.pod_uid, empty.pod_namespace, empty.pod_name, empty.node_name) == ("", "", "", "")
    assert empty.container_index == 0
    assert empty.container == ""
    assert empty.device_type == ""
    assert empty.allowed_device_uuids == ()
    assert empty.alignment is Alignment.BEST_EFFORT
    assert empty.timeout_ms == 2000
    # Re-encoded, absent fields take their defaults, and containerName stays absent.
    assert orjson.loads(encode(empty)) == {
        "podUID": "",
        "podNamespace": "",
        "podName": "",
        "nodeName": "",
        "containerIndex": 0,
        "deviceType": "",
        "allowedDeviceUUIDs": [],
        "mode": "best-effort",
        "timeoutMs": 2000,
    }


@pytest.mark.parametrize(
    ("mode", "alignment"),
    [
        ("strict", Alignment.STRICT),
        (" Strict ", Alignment.STRICT),
        ("BEST-EFFORT", Alignment.BEST_EFFORT),
    ],
)
def test_refit_mode_is_read_like_the_annotation(mode: str, alignment: Alignment) -> None:
    request = decode(orjson.dumps({**REFIT_REQUEST, "mode": mode}), RefitRequest)
    assert request.alignment is alignment
    assert orjson.loads(encode(request))["mode"] == mode  # kept as sent


def test_refit_request_to_and_from_the_core() -> None:
    core = core_refit.RefitInput(
        pod_uid=UID,
        pod_namespace="ml",
        pod_name="train",
        node_name="node-1",
        container_index=1,
        container_name="main",
        device_type="NVIDIA",
        allowed_device_uuids=("GPU-b", "GPU-c"),
        mode=Alignment.STRICT,
        timeout_ms=1500,
    )
    assert encode(RefitRequest.from_core(core)) == (
        b'{"podUID":"675bf6fd-df0f-4187-9144-5e6433a7d514","podNamespace":"ml","podName":"train",'
        b'"nodeName":"node-1","containerIndex":1,"deviceType":"NVIDIA",'
        b'"allowedDeviceUUIDs":["GPU-b","GPU-c"],"mode":"strict","timeoutMs":1500,'
        b'"containerName":"main"}'
    )
    assert decode(encode(RefitRequest.from_core(core)), RefitRequest).to_core() == core
    # An empty container name is left out, as today's encoder does.
    unnamed = core_refit.RefitInput(
        pod_uid=UID,
        pod_namespace="ml",
        pod_name="train",
        node_name="node-1",
        container_index=0,
        container_name="",
        device_type="NVIDIA",
        allowed_device_uuids=("GPU-b",),
    )
    body = orjson.loads(encode(RefitRequest.from_core(unnamed)))
    assert "containerName" not in body
    assert body["mode"] == "best-effort"
    assert body["timeoutMs"] == 2000


def test_refit_reply_from_a_decision() -> None:
    moved = core_refit.RefitDecision(
        True,
        core_refit.Code.MOVED,
        container_devices=(ContainerDevice("GPU-b", "NVIDIA", 20000, 30),),
    )
    assert orjson.loads(encode(RefitReply.from_decision(moved))) == {
        "succeeded": True,
        "code": "moved",
        "containerDevices": "GPU-b,NVIDIA,20000,30:",
    }
    refused = core_refit.RefitDecision(
        False,
        core_refit.Code.NO_FIT,
        failure_reason="no allowed device fits: 2/2 CardInsufficientMemory",
        fit_reasons={"CardInsufficientMemory": 2, "AllocatedCardsInsufficientRequest": 1},
    )
    assert encode(RefitReply.from_decision(refused)) == (
        b'{"succeeded":false,"code":"no_fit",'
        b'"failureReason":"no allowed device fits: 2/2 CardInsufficientMemory",'
        b'"fitReasons":{"AllocatedCardsInsufficientRequest":1,"CardInsufficientMemory":2}}'
    )
    blank = core_refit.RefitDecision(False, core_refit.Code.API_ERROR)
    assert orjson.loads(encode(RefitReply.from_decision(blank))) == {
        "succeeded": False,
        "code": "api_error",
        "failureReason": "",
    }


def _tracked_train() -> Any:
    tracked = track_pod(
        pod_from_object(
            {
                "metadata": {
                    "uid": UID,
                    "namespace": "ml",
                    "name": "train",
                    "resourceVersion": "6",
                    "annotations": {**TRAIN_ANNOTATIONS, "example.com/other": "dropped"},
                },
                "spec": {
                    "nodeName": "node-1",
                    "initContainers": [
                        {"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                    ],
                    "containers": [{"name": "main", "image": "x"}],
                },
                "status": {"phase": "Pending"},
            }
        )
    )
    assert tracked is not None
    return tracked


def test_tracked_pod_converts_from_and_to_the_core() -> None:
    tracked = _tracked_train()
    wire = TrackedPodWire.from_core(tracked)
    # The mini pod: only hami.io/ and nvidia.com/ annotations, names and sidecar flags.
    assert as_json(wire) == TRACKED_TRAIN

    back = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [], "pod": TRACKED_TRAIN}),
        SnapshotReply,
    )
    assert isinstance(back.pod, TrackedPodWire)
    rebuilt = back.pod.to_core()
    assert rebuilt.uid == UID
    assert rebuilt.node == "node-1"
    assert rebuilt.released is False
    assert rebuilt.pod.kinds == (ContainerKind.INIT, ContainerKind.APP)
    assert rebuilt.pod.resource_version == "6"
    # Not released: the init phase peak on GPU-b, the app on GPU-a.
    assert dict(rebuilt.usage) == {"GPU-a": Usage(20000, 30, 1), "GPU-b": Usage(30000, 60, 1)}
    assert rebuilt.pending_rows == ((), (ContainerDevice("GPU-a", "NVIDIA", 20000, 30),), ())


def test_a_sidecar_keeps_its_restart_policy() -> None:
    reply = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [], "pod": TRACKED_SIDE}),
        SnapshotReply,
    )
    assert isinstance(reply.pod, TrackedPodWire)
    tracked = reply.pod.to_core()
    assert tracked.pod.kinds == (ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP)
    assert as_json(TrackedPodWire.from_core(tracked)) == TRACKED_SIDE


def test_tracked_pod_without_a_reservation_is_refused() -> None:
    body = {
        "pod": {
            "metadata": {"uid": UID, "namespace": "ml", "name": "x"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "main"}]},
        },
        "released": False,
    }
    reply = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [], "pod": body}),
        SnapshotReply,
    )
    assert isinstance(reply.pod, TrackedPodWire)
    with pytest.raises(MessageError, match="tracked pod ml/x carries no reservation"):
        reply.pod.to_core()


def test_node_state_converts_from_and_to_the_core() -> None:
    body = {**NODE_1, "pods": [TRACKED_TRAIN], "cordoned": ["GPU-b"]}
    reply = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [body]}), SnapshotReply
    )
    assert reply.nodes is not None
    state = reply.nodes[0].to_state()
    assert state.name == "node-1"
    assert state.revision == 3
    assert state.cordoned == frozenset({"GPU-b"})
    assert state.devices == (
        DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100-SXM4-40GB", 1),
        DeviceInfo("GPU-b", 1, 10, 40000, 100, "NVIDIA A100-SXM4-40GB", 0),
    )
    assert [p.uid for p in state.pods] == [UID]
    snapshot = state.snapshot()
    assert snapshot is not None
    assert snapshot.cordoned == frozenset({"GPU-b"})
    assert snapshot.usage_table() == {
        "GPU-a": {"used": 1, "usedmem": 20000, "usedcores": 30},
        "GPU-b": {"used": 1, "usedmem": 30000, "usedcores": 60},
    }
    assert as_json(NodeStateWire.from_state(state)) == body

    unregistered = NodeState("node-3", 0, None, frozenset({"GPU-x"}), ())
    assert unregistered.snapshot() is None
    assert as_json(NodeStateWire.from_state(unregistered)) == NODE_UNREGISTERED


def test_register_items_are_validated_by_the_core() -> None:
    request = decode(
        orjson.dumps(
            {
                "node": "node-1",
                "devices": [
                    {"id": "GPU-a", "count": 10, "devmem": 40000, "devcore": 100, "type": "NVIDIA"},
                    {
                        "id": "GPU-b",
                        "count": 4,
                        "devmem": 8000,
                        "devcore": 50,
                        "type": "NVIDIA",
                        "numa": 1,
                        "mode": "mig",
                        "health": False,
                    },
                ],
            }
        ),
        RegisterRequest,
    )
    # Absent index: the position; absent numa, mode and health: HAMi's defaults.
    assert messages.devices_to_core(request.devices) == (
        DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA", 0, "hami-core", True),
        DeviceInfo("GPU-b", 1, 4, 8000, 50, "NVIDIA", 1, "mig", False),
    )
    twice = decode(orjson.dumps({"node": "node-1", "devices": [GPU_A, GPU_A]}), RegisterRequest)
    with pytest.raises(MessageError, match="devices: register lists GPU 'GPU-a' twice"):
        messages.devices_to_core(twice.devices)
    nameless = decode(
        orjson.dumps({"node": "node-1", "devices": [{**GPU_A, "id": ""}]}), RegisterRequest
    )
    with pytest.raises(MessageError, match="empty id"):
        messages.devices_to_core(nameless.devices)
    assert (
        as_json(
            RegisterItem.from_device(
                DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100-SXM4-40GB", 1)
            )
        )
        == GPU_A
    )


def test_quota_converts_from_and_to_the_core() -> None:
    reply = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [], "quota": QUOTA_ML}),
        SnapshotReply,
    )
    assert reply.quota is not None
    ledger = reply.quota.to_core()
    assert ledger.limits == {"ml": QuotaLimit(200000, None)}
    assert ledger.used == {"ml": Usage(53000, 90)}
    assert ledger.limited("ml")
    assert as_json(QuotaWire.from_ledger(ledger, "ml")) == QUOTA_ML
    assert as_json(QuotaWire.from_ledger(QuotaLedger(), "other")) == QUOTA_NONE
    # usedMem and usedCores default to 0, the limits to none.
    bare = decode(
        orjson.dumps(
            {"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [], "quota": {"namespace": "x"}}
        ),
        SnapshotReply,
    )
    assert bare.quota is not None
    assert not bare.quota.to_core().limited("x")
    assert bare.quota.to_core().used == {"x": Usage(0, 0)}


def test_pending_pod_from_a_tracked_pod() -> None:
    pending = PendingPod.from_tracked(_tracked_train())
    assert as_json(pending) == {
        "uid": UID,
        "namespace": "ml",
        "name": "train",
        "numaAlignment": "best-effort",
        "entries": [{"index": 1, "containerName": "main", "devices": "GPU-a,NVIDIA,20000,30:"}],
    }
    reply = PendingReply(ok=True, code="ok", epoch=EPOCH, node="node-1", revision=5, pod=None)
    assert orjson.loads(encode(reply)) == {
        "ok": True,
        "code": "ok",
        "epoch": EPOCH,
        "node": "node-1",
        "revision": 5,
        "pod": None,
    }
    refused = PendingReply(ok=False, code="unauthorized", error="no", epoch=EPOCH)
    assert "pod" not in orjson.loads(encode(refused))


def test_usage_tables() -> None:
    state = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [NODE_1]}), SnapshotReply
    )
    assert state.nodes is not None
    snapshot = state.nodes[0].to_state().snapshot()
    assert snapshot is not None
    entries = messages.usage_entries(snapshot)
    assert as_json(entries) == snapshot.usage_table()
    assert messages.usage_entries(None) == {}

    update = decode(
        orjson.dumps(
            {
                "epoch": EPOCH,
                "node": "node-1",
                "revision": 4,
                "devices": {
                    "GPU-b": {"used": 3, "usedmem": 31000, "usedcores": 60},
                    "GPU-a": {"used": 2, "usedmem": 3000, "usedcores": 0},
                },
            }
        ),
        UsageUpdate,
    )
    applied = messages.apply_usage(snapshot, update.devices)
    assert applied is not None
    assert applied.usage_table() == {
        "GPU-a": {"used": 2, "usedmem": 3000, "usedcores": 0},
        "GPU-b": {"used": 3, "usedmem": 31000, "usedcores": 60},
    }
    assert [d.info for d in applied.devices] == [d.info for d in snapshot.devices]
    # Another device set: not applicable (the reader takes a snapshot instead).
    assert (
        messages.apply_usage(snapshot, {"GPU-a": UsageEntry(used=0, usedmem=0, usedcores=0)})
        is None
    )
    assert messages.apply_usage(snapshot, {}) is None


def test_a_message_built_by_a_service_is_todays_json() -> None:
    move = MoveRequest(
        pod_uid=UID,
        revision=3,
        pod_resource_version="6",
        container_index=1,
        to_allocate=";GPU-b,NVIDIA,20000,30:;",
        allocated="GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;",
        node="node-1",
    )
    sent = msgspec.structs.replace(move, deadline_ms=1548)
    assert orjson.loads(encode(sent)) == MOVE_REQUEST
    published = UsageUpdate(
        epoch=EPOCH, node="node-2.example", revision=3, devices={}, deleted=True
    )
    assert (
        encode(published)
        == b'{"epoch":"c42e60d33064","node":"node-2.example","revision":3,"devices":{},"deleted":true}'
    )
    first_page = SnapshotRequest(after="", limit=200, deadline_ms=1979)
    assert orjson.loads(encode(first_page)) == {"after": "", "limit": 200, "deadlineMs": 1979}
    refusal = MoveReply(ok=False, code="conflict", error="node moved on", epoch=EPOCH, revision=0)
    assert (
        encode(refusal)
        == b'{"ok":false,"code":"conflict","error":"node moved on","epoch":"c42e60d33064","revision":0}'
    )


# --- versions and unknown fields --------------------------------------------------------------


def test_schema_version() -> None:
    absent = decode(b'{"epoch":"e","node":"n","revision":1,"devices":{}}', UsageUpdate)
    assert absent.version == 1
    assert b'"v"' not in encode(absent)
    explicit = decode(b'{"v":1,"epoch":"e","node":"n","revision":1,"devices":{}}', UsageUpdate)
    assert explicit.version == 1
    assert orjson.loads(encode(explicit))["v"] == 1
    with pytest.raises(MessageError, match="usage update: schema version 2 is newer than 1"):
        decode(b'{"v":2,"epoch":"e","node":"n","revision":1,"devices":{}}', UsageUpdate)
    for bad in (b"0", b'"1"', b"1.0", b"null", b"true"):
        with pytest.raises(MessageError, match=r"\$\.v"):
            decode(
                b'{"v":' + bad + b',"epoch":"e","node":"n","revision":1,"devices":{}}', UsageUpdate
            )


def test_unknown_fields_are_ignored() -> None:
    body = {**REFIT_REQUEST, "futureField": {"nested": [1, 2]}, "podUid": "not-the-field"}
    request = decode(orjson.dumps(body), RefitRequest)
    assert request.pod_uid == UID
    assert orjson.loads(encode(request)) == REFIT_REQUEST
    node = {**NODE_1, "extra": 1, "devices": [{**GPU_A, "vendorExtra": "x"}, GPU_B]}
    reply = decode(
        orjson.dumps({"ok": True, "code": "ok", "epoch": EPOCH, "nodes": [node]}), SnapshotReply
    )
    assert reply.nodes is not None
    assert as_json(reply.nodes[0]) == NODE_1


# --- bad input ----------------------------------------------------------------------------------

BAD: list[tuple[type[Message], bytes, str]] = [
    (RefitRequest, b"not json", "refit request is not valid JSON"),
    (RefitRequest, b'{"podUID": "a",', "refit request is not valid JSON"),
    (RefitRequest, b"", "refit request is not valid JSON"),
    (RefitRequest, b"[1]", "refit request must be a JSON object"),
    (RefitRequest, b'"text"', "refit request must be a JSON object"),
    (RefitRequest, b"null", "refit request must be a JSON object"),
    (
        RefitRequest,
        b'{"containerIndex": "1"}',
        "refit request: Expected `int`, got `str` - at `$.containerIndex`",
    ),
    (
        RefitRequest,
        b'{"containerIndex": true}',
        "Expected `int`, got `bool` - at `$.containerIndex`",
    ),
    (RefitRequest, b'{"containerIndex": 1.5}', "at `$.containerIndex`"),
    (RefitRequest, b'{"containerIndex": 9223372036854775808}', "at `$.containerIndex`"),
    (RefitRequest, b'{"podUID": 7}', "Expected `str`, got `int` - at `$.podUID`"),
    (RefitRequest, b'{"podName": null}', "Expected `str`, got `null` - at `$.podName`"),
    (RefitRequest, b'{"allowedDeviceUUIDs": "GPU-a"}', "at `$.allowedDeviceUUIDs`"),
    (RefitRequest, b'{"allowedDeviceUUIDs": ["GPU-a", 1]}', "at `$.allowedDeviceUUIDs[1]`"),
    (RefitRequest, b'{"mode": 1}', "at `$.mode`"),
    (
        RefitRequest,
        b'{"mode": "sideways"}',
        "refit request: mode must be 'best-effort' or 'strict'",
    ),
    (RefitRequest, b'{"mode": ""}', "mode must be 'best-effort' or 'strict'"),
    (RefitRequest, b'{"timeoutMs": 0}', "Expected `int` >= 1 - at `$.timeoutMs`"),
    (RefitRequest, b'{"timeoutMs": 60001}', "Expected `int` <= 60000 - at `$.timeoutMs`"),
    (RefitRequest, b'{"timeoutMs": -5}', "at `$.timeoutMs`"),
    (RefitReply, b'{"code": "moved"}', "refit reply: Object missing required field `succeeded`"),
    (RefitReply, b'{"succeeded": "yes", "code": "moved"}', "at `$.succeeded`"),
    (RefitReply, b'{"succeeded": false, "code": "no_fit", "fitReasons": {"a": -1}}', "fitReasons"),
    (
        ReserveRequest,
        b'{"podUID": "u", "podNamespace": "ml", "podName": "p", "revision": 1, "node": "n"}',
        "reserve request: Object missing required field `allocated`",
    ),
    (
        ReserveRequest,
        b'{"podUID": "u", "podNamespace": "ml", "podName": "p", "revision": -1, "allocated": "", "node": "n"}',
        "Expected `int` >= 0 - at `$.revision`",
    ),
    (
        ReserveRequest,
        b'{"podUID": "u", "podNamespace": "ml", "podName": "p", "revision": 1, "allocated": ""}',
        "missing required field `node`",
    ),
    (
        ReserveRequest,
        b'{"podUID": "u", "podNamespace": "ml", "podName": "p", "revision": 1, "allocated": "", "node": "n", "deadlineMs": "5"}',
        "at `$.deadlineMs`",
    ),
    (
        BindPhaseRequest,
        b'{"podUID": "u", "node": "n"}',
        "bind-phase request: Object missing required field `phase`",
    ),
    (
        MoveRequest,
        b'{"podUID": "u", "revision": 1, "containerIndex": -1, "toAllocate": "", "allocated": "", "node": "n"}',
        "at `$.containerIndex`",
    ),
    (
        MoveRequest,
        b'{"podUID": "u", "revision": 1, "containerIndex": 0, "toAllocate": "", "allocated": "", "node": "n", "podResourceVersion": 5}',
        "at `$.podResourceVersion`",
    ),
    (ConsumeRequest, b'{"node": "n"}', "consume request: Object missing required field `devices`"),
    (ConsumeRequest, b'{"node": "n", "devices": [1]}', "at `$.devices[0]`"),
    (
        ConsumeRequest,
        b'{"node": "n", "devices": [' + b",".join([b'"g"'] * 65) + b"]}",
        "length <= 64 - at `$.devices`",
    ),
    (PendingRequest, b'{"node": 5}', "pending request: Expected `str`, got `int` - at `$.node`"),
    (SnapshotRequest, b'{"limit": 0}', "snapshot request: Expected `int` >= 1 - at `$.limit`"),
    (SnapshotRequest, b'{"after": 1}', "at `$.after`"),
    (
        RegisterRequest,
        b'{"node": "n", "devices": "x"}',
        "register request: Expected `array`, got `str` - at `$.devices`",
    ),
    (
        RegisterRequest,
        b'{"node": "n", "devices": [{"id": "g", "devmem": 1, "devcore": 1, "type": "NVIDIA"}]}',
        "missing required field `count` - at `$.devices[0]`",
    ),
    (
        RegisterRequest,
        b'{"node": "n", "devices": [{"id": "g", "count": -1, "devmem": 1, "devcore": 1, "type": "NVIDIA"}]}',
        "at `$.devices[0].count`",
    ),
    (
        RegisterRequest,
        b'{"node": "n", "devices": [{"id": "g", "count": 1, "devmem": 1, "devcore": 1, "type": "NVIDIA", "health": "yes"}]}',
        "at `$.devices[0].health`",
    ),
    (MoveReply, b'{"code": "ok"}', "move reply: Object missing required field `ok`"),
    (MoveReply, b'{"ok": true, "code": "ok", "revision": -3}', "at `$.revision`"),
    (MoveReply, b'{"ok": 1, "code": "ok"}', "Expected `bool`, got `int` - at `$.ok`"),
    (
        PendingReply,
        b'{"ok": true, "code": "ok", "pod": {"uid": "u", "namespace": "n", "name": "p", "entries": [{"index": "1", "devices": ""}]}}',
        "at `$.pod.entries[0].index`",
    ),
    (
        PendingReply,
        b'{"ok": true, "code": "ok", "pod": {"namespace": "n", "name": "p"}}',
        "missing required field `uid` - at `$.pod`",
    ),
    (
        SnapshotReply,
        b'{"ok": true, "code": "ok", "nodes": []}',
        "snapshot reply: epoch is required",
    ),
    (
        SnapshotReply,
        b'{"ok": true, "code": "ok", "epoch": "e"}',
        "snapshot reply: nodes is required",
    ),
    (
        SnapshotReply,
        b'{"ok": true, "code": "ok", "epoch": "e", "nodes": [{"node": "n", "revision": 1, "cordoned": []}]}',
        "missing required field `pods` - at `$.nodes[0]`",
    ),
    (
        SnapshotReply,
        b'{"ok": true, "code": "ok", "epoch": "e", "nodes": [{"node": "n", "revision": 1, "cordoned": [], "pods": [{"pod": {"metadata": {"uid": 1}}, "released": false}]}]}',
        "at `$.nodes[0].pods[0].pod.metadata.uid`",
    ),
    (
        SnapshotReply,
        b'{"ok": true, "code": "ok", "epoch": "e", "nodes": [], "quota": {"namespace": "x", "usedMem": null}}',
        "at `$.quota.usedMem`",
    ),
    (
        UsageUpdate,
        b'{"node": "n", "revision": 1, "devices": {}}',
        "usage update: Object missing required field `epoch`",
    ),
    (
        UsageUpdate,
        b'{"epoch": "e", "node": "n", "revision": -1, "devices": {}}',
        "Expected `int` >= 0 - at `$.revision`",
    ),
    (UsageUpdate, b'{"epoch": "e", "node": "n", "revision": 1, "devices": []}', "at `$.devices`"),
    (
        UsageUpdate,
        b'{"epoch": "e", "node": "n", "revision": 1, "devices": {"g": {"used": 1, "usedmem": -1, "usedcores": 0}}}',
        "usedmem",
    ),
    (
        UsageUpdate,
        b'{"epoch": "e", "node": "n", "revision": 1, "devices": {"g": {"used": 1, "usedmem": 1}}}',
        "missing required field `usedcores`",
    ),
    (
        UsageUpdate,
        b'{"epoch": "e", "node": "n", "revision": 1, "devices": {}, "deleted": "yes"}',
        "at `$.deleted`",
    ),
]


@pytest.mark.parametrize(
    ("kind", "data", "expected"), BAD, ids=[f"{k.__name__}-{i}" for i, (k, _, _) in enumerate(BAD)]
)
def test_bad_input_is_refused_naming_the_field(
    kind: type[Message], data: bytes, expected: str
) -> None:
    with pytest.raises(MessageError) as caught:
        decode(data, kind)
    assert expected in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert len(str(caught.value)) <= messages.MAX_ERROR_LENGTH


def test_errors_never_echo_long_input() -> None:
    long = "x" * 5000
    cases: list[tuple[type[Message], bytes]] = [
        (RefitRequest, orjson.dumps({"mode": long})),
        (RefitRequest, b'{"podUID": "' + long.encode() + b'"'),
        (RefitRequest, long.encode()),
        (
            UsageUpdate,
            orjson.dumps(
                {"epoch": "e", "node": "n", "revision": 1, "devices": {long: {"used": "1"}}}
            ),
        ),
    ]
    for kind, data in cases:
        with pytest.raises(MessageError) as caught:
            decode(data, kind)
        text = str(caught.value)
        assert len(text) <= messages.MAX_ERROR_LENGTH
        assert "x" * 200 not in text


def test_converter_errors_are_message_errors() -> None:
    reply = decode(
        orjson.dumps(
            {
                "ok": True,
                "code": "ok",
                "epoch": EPOCH,
                "nodes": [{**NODE_1, "devices": [GPU_A, GPU_A]}],
            }
        ),
        SnapshotReply,
    )
    assert reply.nodes is not None
    with pytest.raises(MessageError, match="devices: register lists GPU 'GPU-a' twice"):
        reply.nodes[0].to_state()


# --- round trips --------------------------------------------------------------------------------

names = st.text(max_size=20)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
naturals = st.integers(min_value=0, max_value=2**63 - 1)


@given(
    st.builds(
        RefitRequest,
        pod_uid=names,
        pod_namespace=names,
        pod_name=names,
        node_name=names,
        container_index=ints,
        device_type=names,
        allowed_device_uuids=st.lists(names, max_size=5).map(tuple),
        mode=st.sampled_from(["best-effort", "strict", "Strict", " best-effort "]),
        timeout_ms=st.integers(min_value=1, max_value=60000),
        container_name=names | st.just(msgspec.UNSET),
    )
)
def test_refit_request_round_trip(request: RefitRequest) -> None:
    assert decode(encode(request), RefitRequest) == request
    assert decode(orjson.dumps(orjson.loads(encode(request))), RefitRequest) == request


usage_entries = st.builds(UsageEntry, used=naturals, usedmem=naturals, usedcores=naturals)


@given(
    st.builds(
        UsageUpdate,
        epoch=names,
        node=names,
        revision=naturals,
        devices=st.dictionaries(names, usage_entries, max_size=4),
        deleted=st.booleans(),
    )
)
def test_usage_update_round_trip(update: UsageUpdate) -> None:
    assert decode(encode(update), UsageUpdate) == update


@given(
    st.builds(
        MoveReply,
        ok=st.booleans(),
        code=names,
        error=st.none() | names,
        epoch=st.none() | names,
        node=st.none() | names,
        revision=st.none() | naturals,
        pod_resource_version=st.none() | names,
        fit_reasons=st.none() | st.dictionaries(names, naturals, max_size=3),
    )
)
def test_move_reply_round_trip(reply: MoveReply) -> None:
    assert decode(encode(reply), MoveReply) == reply


@given(
    st.builds(
        SnapshotReply,
        ok=st.just(True),
        code=st.just("ok"),
        epoch=names,
        more=st.none() | st.booleans(),
        next=st.none() | names,
        nodes=st.lists(
            st.builds(
                NodeStateWire,
                node=names,
                revision=naturals,
                devices=st.none()
                | st.lists(
                    st.builds(
                        RegisterItem,
                        id=names,
                        index=ints | st.just(msgspec.UNSET),
                        count=naturals,
                        devmem=naturals,
                        devcore=naturals,
                        type=names,
                        numa=ints,
                        mode=names,
                        health=st.booleans(),
                    ),
                    max_size=3,
                ).map(tuple),
                cordoned=st.lists(names, max_size=2).map(tuple),
                pods=st.just(()),
            ),
            max_size=2,
        ).map(tuple),
        quota=st.none()
        | st.builds(
            QuotaWire,
            namespace=names,
            limit_mem=st.none() | ints,
            limit_cores=st.none() | ints,
            used_mem=ints,
            used_cores=ints,
        ),
    )
)
def test_snapshot_reply_round_trip(reply: SnapshotReply) -> None:
    assert decode(encode(reply), SnapshotReply) == reply


def test_usage_update_carries_the_node_lock_only_when_held() -> None:
    from shared.core.lock import Lock
    from shared.messages import LockWire

    free = UsageUpdate(epoch="e", node="n", revision=1, devices={})
    assert encode(free) == b'{"epoch":"e","node":"n","revision":1,"devices":{}}'
    locked = msgspec.structs.replace(
        free, allocating=LockWire.from_core(Lock("ml/train", "u-1", 1700000000))
    )
    assert orjson.loads(encode(locked))["allocating"] == {
        "pod": "ml/train",
        "uid": "u-1",
        "since": 1700000000,
    }
    back = decode(encode(locked), UsageUpdate)
    assert back.allocating is not None
    assert back.allocating.to_core() == Lock("ml/train", "u-1", 1700000000)
    assert decode(encode(free), UsageUpdate).allocating is None
