"""The NUMA refit decision (reference (f), d.7, e.8): pure, in HAMi's validation order.

Given a refit request, the tracked pods, the node's usage snapshot and the quota ledger, decide
whether the container's pending reservation can move onto one of kubelet's allowed GPUs, and if
so produce the new annotation values. Committing them (with the pod's resourceVersion as a
precondition, within the caller's deadline) is the accounting service's job, not the core's.

Reply codes are `shared.codes.Code` (re-exported here as `Code`): one enum for every service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.codes import Code as Code
from shared.core import codec, keys
from shared.core.accounting import TrackedPod, effective, kind_at, total
from shared.core.config import CoreConfig
from shared.core.errors import AnnotationError, PodAnnotationError
from shared.core.fit import (
    ALLOWED_SET_UNMATCHED,
    RESOURCE_QUOTA_NOT_FIT,
    ContainerFit,
    fit_container,
    fit_options,
    restrict,
)
from shared.core.model import ContainerDevice, ContainerEntry, ContainerKind, NodeSnapshot, Usage
from shared.core.nodes import without_pod
from shared.core.pods import Alignment, PodInfo
from shared.core.quota import QuotaLedger, QuotaProbe
from shared.core.requests import ContainerRequest

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


@dataclass(frozen=True, slots=True)
class RefitInput:
    """What a refit is asked, as the core decides on it: a `numafit.refit.v1.<node>` request
    (HAMi's fields plus mode and timeoutMs) once read. The wire message it is read from is
    `shared.messages.RefitRequest`."""

    pod_uid: str
    pod_namespace: str
    pod_name: str
    node_name: str
    container_index: int
    container_name: str
    device_type: str
    allowed_device_uuids: tuple[str, ...]
    mode: Alignment = Alignment.BEST_EFFORT
    timeout_ms: int = keys.DEFAULT_REFIT_TIMEOUT_MS


MAX_TIMEOUT_MS = 60_000


@dataclass(frozen=True, slots=True)
class Event:
    """The Kubernetes Event a refit outcome records on the pod."""

    type: str  # Normal | Warning
    reason: str  # NumaRefitSucceed | NumaRefitFailed
    message: str


@dataclass(frozen=True, slots=True)
class RefitDecision:
    """The refit's answer. On `moved`, `annotations` holds the two new values to patch and
    `stored_usage` the pod's new stored (effective) usage per GPU."""

    succeeded: bool
    code: Code
    container_devices: ContainerEntry = ()
    failure_reason: str = ""
    fit_reasons: Mapping[str, int] = field(default_factory=dict)
    annotations: Mapping[str, str] | None = None
    previous_devices: ContainerEntry = ()
    stored_usage: Mapping[str, Usage] | None = None
    event: Event | None = None
    fit: ContainerFit | None = None
    preloaded: NodeSnapshot | None = None
    """The restricted, preloaded snapshot the fit ran on (for `--explain`)."""


def refused(code: Code, reason: str, *, event: bool = True, **extra: Any) -> RefitDecision:
    return RefitDecision(
        False,
        code,
        failure_reason=reason,
        event=Event("Warning", "NumaRefitFailed", reason) if event else None,
        **extra,
    )


def _uuids(entry: ContainerEntry) -> str:
    return "[" + " ".join(d.uuid for d in entry) + "]"


def decide_refit(
    request: RefitInput,
    *,
    pods: Mapping[str, TrackedPod],
    node: NodeSnapshot | None,
    quota: QuotaLedger | None = None,
    config: CoreConfig = CoreConfig(),
) -> RefitDecision:
    """Validate and compute one refit, in the order of reference (f).

    `node` is the usage snapshot of `request.node_name` counting every tracked pod (the target
    pod included), or None when the node is not registered. Each step either refuses (its
    `RefitDecision` is the answer) or hands the next step what it needs.
    """
    if (refusal := check_request(request)) is not None:
        return refusal
    if isinstance(found := find_reservation(request, pods), RefitDecision):
        return found
    if (aligned := already_aligned(request, found)) is not None:
        return aligned
    if isinstance(usable := check_refittable(request, found, node), RefitDecision):
        return usable
    if isinstance(fitted := restricted_fit(request, found, usable, quota, config), RefitDecision):
        return fitted
    if isinstance(usage := check_positional_quota(found, fitted, quota), RefitDecision):
        return usage
    return rewrite(found, fitted, usage)


@dataclass(frozen=True, slots=True)
class Reservation:
    """The container's reservation a refit would move: what `find_reservation` located."""

    tracked: TrackedPod
    index: int
    current: ContainerEntry
    """The container's pending entry (non-empty): the devices the scheduler picked."""
    rows: tuple[ContainerEntry, ...]
    """The pod's recorded (allocated) rows by position; the container's row is non-empty."""

    @property
    def pod(self) -> PodInfo:
        return self.tracked.pod


@dataclass(frozen=True, slots=True)
class RestrictedFit:
    """A successful restricted fit: the container's new devices and what the fit ran on."""

    fit: ContainerFit
    moved: ContainerEntry
    restricted: NodeSnapshot
    """The preloaded snapshot restricted to kubelet's allowed devices (for `--explain`)."""


def check_request(request: RefitInput) -> RefitDecision | None:
    """Rows 1-5: the request itself (None when it passes). Nothing is known about a pod yet,
    so no refusal here records an event."""
    if not (request.pod_uid and request.pod_namespace and request.pod_name and request.node_name):
        return refused(
            Code.INVALID_REQUEST,
            "incomplete refit request: podUID, podNamespace, podName and nodeName are required",
            event=False,
        )
    if not request.allowed_device_uuids:
        return refused(Code.INVALID_REQUEST, "empty allowed device set", event=False)
    if len(request.allowed_device_uuids) > keys.MAX_ALLOWED_UUIDS:
        return refused(
            Code.INVALID_REQUEST,
            f"{len(request.allowed_device_uuids)} allowed devices, "
            f"limit is {keys.MAX_ALLOWED_UUIDS}",
            event=False,
        )
    if request.device_type not in keys.KNOWN_VENDORS:
        return refused(
            Code.UNKNOWN_DEVICE_TYPE, f"unknown device type {request.device_type!r}", event=False
        )
    if request.device_type != keys.NVIDIA:
        return refused(
            Code.UNSUPPORTED_DEVICE_TYPE,
            f"device type {request.device_type!r} is not supported by the NUMA refit yet",
            event=False,
        )
    return None


def find_reservation(
    request: RefitInput, pods: Mapping[str, TrackedPod]
) -> RefitDecision | Reservation:
    """Rows 6-13: the pod, then the container and its reservation."""
    tracked = find_pod(request, pods)
    if isinstance(tracked, RefitDecision):
        return tracked
    return find_container_entry(request, tracked)


def find_pod(request: RefitInput, pods: Mapping[str, TrackedPod]) -> RefitDecision | TrackedPod:
    """Rows 6-8: the pod by UID (guards against a recreated pod with the same name), then its
    name and node as the request states them."""
    tracked = pods.get(request.pod_uid)
    if tracked is None:
        return refused(
            Code.POD_NOT_TRACKED,
            f"pod {request.pod_uid} is not tracked by the scheduler",
            event=False,
        )
    pod = tracked.pod
    if (pod.namespace, pod.name) != (request.pod_namespace, request.pod_name):
        return refused(
            Code.POD_MISMATCH,
            f"pod {request.pod_uid} is {pod.key}, which does not match "
            f"{request.pod_namespace}/{request.pod_name}",
        )
    if tracked.node != request.node_name:
        return refused(
            Code.NODE_MISMATCH,
            f"pod {pod.key} is tracked on node {tracked.node}, not {request.node_name}",
        )
    return tracked


def find_container_entry(request: RefitInput, tracked: TrackedPod) -> RefitDecision | Reservation:
    """Rows 9-13: the container, checked against the spec before any annotation index is used
    (the decoder's trailing entry must never be addressable), then its two entries."""
    pod, index = tracked.pod, request.container_index
    if not 0 <= index < len(pod.containers):
        return refused(
            Code.CONTAINER_OUT_OF_RANGE,
            f"container index {index} is outside the pod's containers "
            f"(0..{len(pod.containers) - 1})",
        )
    actual = pod.containers[index].name
    if request.container_name and request.container_name != actual:
        return refused(
            Code.CONTAINER_NAME_MISMATCH,
            f'container {index} is "{actual}", not "{request.container_name}"',
        )
    if tracked.decode_error is not None:
        return refused(Code.ANNOTATION_INVALID, tracked.decode_error)
    pending_rows, rows = tracked.pending_rows, tracked.rows
    if pending_rows is None or index >= len(pending_rows) or not pending_rows[index]:
        return refused(
            Code.NOTHING_PENDING, f"container {index} has no pending NVIDIA allocation to refit"
        )
    if rows is None or index >= len(rows) or not rows[index]:
        return refused(
            Code.NOTHING_RECORDED, f"container {index} has no recorded NVIDIA allocation"
        )
    return Reservation(tracked, index, pending_rows[index], rows)


def already_aligned(request: RefitInput, found: Reservation) -> RefitDecision | None:
    """Row 14: every device the container holds is one kubelet allows: a no-op success (None
    when a move is needed)."""
    current, allowed = found.current, frozenset(request.allowed_device_uuids)
    if not all(d.uuid in allowed for d in current):
        return None
    return RefitDecision(
        True,
        Code.ALREADY_ALIGNED,
        container_devices=current,
        previous_devices=current,
        event=Event(
            "Normal",
            "NumaRefitSucceed",
            f"NUMA refit: container {found.index} already on allowed devices {_uuids(current)}",
        ),
    )


def check_refittable(
    request: RefitInput, found: Reservation, node: NodeSnapshot | None
) -> RefitDecision | NodeSnapshot:
    """Rows 15-17: what the refit can handle (one amount per device, a registered node, no MIG
    among the allowed devices); passes on the node's snapshot."""
    first = found.current[0]
    if any(d.usedmem != first.usedmem or d.usedcores != first.usedcores for d in found.current):
        amounts = ", ".join(f"{d.uuid}={d.usedmem}MiB/{d.usedcores}%" for d in found.current)
        return refused(
            Code.HETEROGENEOUS_RESERVATION,
            f"container {found.index} holds differing amounts per device ({amounts}); "
            "heterogeneous reservations cannot be refitted",
        )
    if node is None or not node.devices:
        return refused(
            Code.NODE_UNAVAILABLE, f"node {request.node_name} unavailable: node unregistered"
        )
    by_uuid = node.by_uuid()
    for uuid in request.allowed_device_uuids:
        device = by_uuid.get(uuid)
        if device is not None and device.info.mode == "mig":
            return refused(
                Code.MIG_UNSUPPORTED,
                f"device {uuid} is in MIG mode; the NUMA refit does not support MIG",
            )
    return node


def restricted_fit(
    request: RefitInput,
    found: Reservation,
    node: NodeSnapshot,
    quota: QuotaLedger | None,
    config: CoreConfig,
) -> RefitDecision | RestrictedFit:
    """Rows 18-20 (e.8, d.7): the fit restricted to kubelet's allowed devices, on the node
    preloaded so the additive fit equals the phase-aware truth, seeded with the pod's other
    containers at their real positions, with the pod's own stored usage excluded from its
    namespace quota."""
    tracked, index, current = found.tracked, found.index, found.current
    allowed, vendor = frozenset(request.allowed_device_uuids), request.device_type
    preloaded = preload(node, tracked, index, allowed, vendor)
    try:
        options = fit_options(tracked.pod.annotations, config)
    except AnnotationError as exc:
        if isinstance(exc, PodAnnotationError) and exc.key != keys.SCORING_WEIGHTS:
            # Another annotation the fit reads (a pod admitted before its rule existed).
            return refused(Code.ANNOTATION_INVALID, f"invalid pod annotation: {exc}")
        return refused(Code.INVALID_SCORING_WEIGHTS, f"invalid device scoring weights: {exc}")
    restricted = restrict(preloaded, allowed, vendor)
    if not any(d.info.matches_vendor(vendor) for d in restricted.devices):
        return refused(
            Code.NO_FIT,
            f"no allowed device fits: {ALLOWED_SET_UNMATCHED}: "
            + unmatched_reason(request.allowed_device_uuids, node, vendor),
            fit_reasons={ALLOWED_SET_UNMATCHED: 1},
            previous_devices=current,
            preloaded=restricted,
        )
    same_amounts = ContainerRequest(
        nums=len(current), type=vendor, memreq=current[0].usedmem, coresreq=current[0].usedcores
    )
    seeded = {p: e for p, e in enumerate(found.rows) if e and p != index}
    fit = fit_container(restricted, same_amounts, options, index, seeded, _probe(tracked, quota))
    if not fit.ok:
        quota_only = set(fit.reasons) == {RESOURCE_QUOTA_NOT_FIT}
        return refused(
            Code.QUOTA_EXCEEDED if quota_only else Code.NO_FIT,
            f"no allowed device fits: {fit.reason_text}",
            fit_reasons=dict(fit.reasons),
            previous_devices=current,
            fit=fit,
            preloaded=restricted,
        )
    moved = tuple(ContainerDevice(d.uuid, d.type, d.usedmem, d.usedcores) for d in fit.devices)
    return RestrictedFit(fit, moved, restricted)


SHOWN_IDS = 3
"""Allowed IDs quoted in the AllowedDeviceSetUnmatched reason (a request may carry 512)."""
SHOWN_GPUS = 8
"""The node's GPU UUIDs quoted beside them."""


def unmatched_reason(allowed: Sequence[str], node: NodeSnapshot, vendor: str) -> str:
    """Why no allowed ID names a `vendor` GPU of `node`, for the operator: replica IDs
    (`GPU-b-0`, `GPU-b::0`) sent where HAMi's contract wants physical GPU UUIDs are named
    with the GPU they belong to; anything else is listed beside the node's GPUs."""
    gpus = [d.info.id for d in node.devices if d.info.matches_vendor(vendor)]
    known = frozenset(gpus)
    replicas = [
        (item, gpu)
        for item in allowed
        if (gpu := codec.physical_id(item, known)) != item and gpu in known
    ]
    head = f"no allowed ID names a GPU of node {node.name}"
    if replicas:
        shown = ", ".join(
            f"{_short(item)} is a replica of {_short(gpu)}" for item, gpu in replicas[:SHOWN_IDS]
        )
        more = f" (and {len(replicas) - SHOWN_IDS} more)" if len(replicas) > SHOWN_IDS else ""
        return (
            f"{head}: allowedDeviceUUIDs takes physical GPU UUIDs, not replica IDs ({shown}{more})"
        )
    listed = ", ".join(map(_short, allowed[:SHOWN_IDS]))
    listed += ", ..." if len(allowed) > SHOWN_IDS else ""
    has = ", ".join(map(_short, gpus[:SHOWN_GPUS])) if gpus else "none"
    has += ", ..." if len(gpus) > SHOWN_GPUS else ""
    return f"{head} (allowed: {listed}; the node's GPUs: {has})"


def _short(text: str, limit: int = 64) -> str:
    """An ID as quoted in a reason: whole when short, cut otherwise (IDs come from outside)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _probe(tracked: TrackedPod, quota: QuotaLedger | None) -> QuotaProbe | None:
    """The fit's quota probe for the pod's namespace, its own stored usage excluded (None when
    the namespace has no GPU quota)."""
    namespace = tracked.pod.namespace
    if quota is None or not quota.limited(namespace):
        return None
    return QuotaProbe(quota, namespace, tracked.pod.kinds, tracked.released, total(tracked.usage))


def check_positional_quota(
    found: Reservation, fitted: RestrictedFit, quota: QuotaLedger | None
) -> RefitDecision | dict[str, Usage]:
    """Row 21: the quota on the original positional layout with the target entry replaced
    (defence in depth: the probe already used real positions); passes on the pod's new stored
    (effective) usage."""
    pod = found.pod
    new_rows = list(found.rows)
    new_rows[found.index] = fitted.moved
    new_usage = effective(pod.kinds, new_rows, found.tracked.released)
    if quota is not None and not quota.fits(
        pod.namespace, total(new_usage), exclude=total(found.tracked.usage)
    ):
        return refused(
            Code.QUOTA_EXCEEDED,
            f"moving container {found.index} would exceed the NVIDIA resource quota in namespace "
            f"{pod.namespace}",
            previous_devices=found.current,
            fit=fitted.fit,
            preloaded=fitted.restricted,
        )
    return new_usage


def rewrite(
    found: Reservation, fitted: RestrictedFit, new_usage: Mapping[str, Usage]
) -> RefitDecision:
    """Row 22 and success: the byte-preserving rewrite of both annotations, the move decided."""
    index, moved = found.index, fitted.moved
    try:
        to_allocate = codec.rewrite_entry(found.tracked.to_allocate or "", index, moved)
    except AnnotationError as exc:
        return refused(
            Code.ANNOTATION_INVALID, f"cannot rewrite pending allocation annotation: {exc}"
        )
    try:
        allocated = codec.rewrite_entry(found.tracked.allocated or "", index, moved)
    except AnnotationError as exc:
        return refused(Code.ANNOTATION_INVALID, f"cannot rewrite allocated annotation: {exc}")
    return RefitDecision(
        True,
        Code.MOVED,
        container_devices=moved,
        annotations={keys.TO_ALLOCATE: to_allocate, keys.ALLOCATED: allocated},
        previous_devices=found.current,
        stored_usage=new_usage,
        event=Event(
            "Normal",
            "NumaRefitSucceed",
            f"NUMA refit moved container {index} from {_uuids(found.current)} to {_uuids(moved)}",
        ),
        fit=fitted.fit,
        preloaded=fitted.restricted,
    )


def preload(
    node: NodeSnapshot,
    tracked: TrackedPod,
    index: int,
    allowed: frozenset[str],
    vendor: str,
) -> NodeSnapshot:
    """Reference e.8 on a copy of `node`: take the pod's stored usage out, then put back, per
    device, what the pod will still use there besides the moved container, so that adding the
    moved container's (mem, cores, 1 slot) lands exactly on the pod's true effective usage."""
    result = without_pod(node, tracked.usage)
    assert tracked.rows is not None
    assert tracked.pending_rows is not None
    moved = tracked.pending_rows[index][0]
    kinds = tracked.pod.kinds
    without = list(tracked.rows)
    without[index] = ()
    if not any(without) and not (tracked.released and kind_at(kinds, index) is ContainerKind.INIT):
        # The container is the pod's only one with GPUs (the common case): nothing of the pod
        # stays on any device, and the moved container alone is exactly (mem, cores, 1 slot)
        # wherever it lands, so nothing is put back.
        return result
    without_usage = effective(kinds, without, tracked.released)
    for device in result.devices:
        if not device.info.matches_vendor(vendor):
            continue
        uuid = device.info.id
        if uuid not in allowed:
            remaining = without_usage.get(uuid)
            if remaining is not None:
                device.add(remaining.counted)
            continue
        rows: dict[int, ContainerEntry] = {
            p: tuple(d for d in entry if d.uuid == uuid) for p, entry in enumerate(without)
        }
        rows[index] = (ContainerDevice(uuid, vendor, moved.usedmem, moved.usedcores),)
        with_usage = effective(kinds, rows, tracked.released)[uuid]
        extra = with_usage.clamp_sub(Usage(moved.usedmem, moved.usedcores, 1))
        if not extra.is_zero:
            device.add(extra)
    return result
