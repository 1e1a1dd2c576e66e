"""HAMi's device fit: per-device checks in policy order (d.5) and whole-pod fitting (d.6).

The fit never mutates the snapshot it is given except through `apply_entry`, so callers decide
which copy receives a container (d.6 fits regular init containers into throw-away copies).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core import inputs, keys
from shared.core.codec import parse_go_bool, parse_uuid_list
from shared.core.model import (
    ContainerDevice,
    ContainerEntry,
    ContainerKind,
    DeviceUsage,
    NodeSnapshot,
)
from shared.core.policy import (
    Policy,
    ScoringWeights,
    order_devices,
    parse_policy,
    parse_scoring_weights,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.core.config import CoreConfig
    from shared.core.quota import QuotaProbe
    from shared.core.requests import ContainerRequest

# HAMi's reason names (pkg/device/common).
CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
CARD_TYPE_MISMATCH = "CardTypeMismatch"
NUMA_NOT_FIT = "NumaNotFit"
CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
EXCLUSIVE_CONFLICT = "ExclusiveDeviceAllocateConflict"
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_MIG_INFEASIBLE = "CardMigTopologyInfeasible"
ALLOCATED_INSUFFICIENT = "AllocatedCardsInsufficientRequest"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
DEVICE_TYPE_NOT_FOUND = "Device type not found"
ALLOWED_SET_UNMATCHED = "AllowedDeviceSetUnmatched"

PICKED = "picked"


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Pod-level fit settings, from the pod's annotations and the scheduler config."""

    policy: Policy
    numa_bind: bool = False
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    vgpu_mode: str | None = None
    weights: ScoringWeights = ScoringWeights()


def _type_list(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    return tuple(t.strip().lower() for t in text.split(",") if t.strip())


_OPTION_KEYS = inputs.READ_ANNOTATIONS
"""Every annotation numafit reads, node policy and alignment included (not fit settings, but
read from the same pods: checked here so that the filter, which reads a pod's settings only
through fit_options, refuses what the webhook refuses)."""
OPTIONS_CACHE = 1024
"""Distinct settings remembered: most pods carry none of these annotations, or a few shapes."""
OPTIONS_CACHE_LENGTH = 4096
"""Settings longer than this (all values together) are parsed afresh, never remembered."""


def fit_options(annotations: Mapping[str, str], config: CoreConfig) -> FitOptions:
    """Read the pod's fit settings; raises PodAnnotationError naming the first annotation
    numafit reads whose value breaks its rule (`inputs`), node policy and alignment included."""
    values = tuple(annotations.get(key) for key in _OPTION_KEYS)
    default = config.gpu_scheduler_policy
    if sum(len(v) for v in values if v) + len(default) > OPTIONS_CACHE_LENGTH:
        return _parse_options(values, default)
    return _cached_options(values, default)


def _parse_options(values: tuple[str | None, ...], default_policy: str) -> FitOptions:
    given = dict(zip(_OPTION_KEYS, values, strict=True))
    inputs.check_annotations(given)
    policy = given[keys.GPU_POLICY]
    return FitOptions(
        policy=parse_policy(default_policy if policy is None else policy),
        numa_bind=parse_go_bool((given[keys.NUMA_BIND] or "").strip()) is True,
        use_uuids=parse_uuid_list(given[keys.USE_UUID]),
        nouse_uuids=parse_uuid_list(given[keys.NOUSE_UUID]),
        use_types=_type_list(given[keys.USE_TYPE]),
        nouse_types=_type_list(given[keys.NOUSE_TYPE]),
        vgpu_mode=given[keys.VGPU_MODE] or None,
        weights=parse_scoring_weights(given[keys.SCORING_WEIGHTS]),
    )


# FitOptions is frozen (its sets are frozensets): one parsed value serves every caller. An
# invalid value raises, and exceptions are not remembered.
_cached_options = functools.lru_cache(maxsize=OPTIONS_CACHE)(_parse_options)


@dataclass(frozen=True, slots=True)
class DeviceVerdict:
    """What the fit concluded about one device it walked (for `--explain` and logs)."""

    uuid: str
    numa: int
    outcome: str


@dataclass(frozen=True, slots=True)
class ContainerFit:
    """The outcome of fitting one container: its devices, or the counted refusal reasons."""

    devices: ContainerEntry
    reasons: Mapping[str, int]
    considered: int
    verdicts: tuple[DeviceVerdict, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.devices) and not self.reasons

    @property
    def reason_text(self) -> str:
        return format_reasons(self.reasons, self.considered)


def format_reasons(reasons: Mapping[str, int], considered: int) -> str:
    """HAMi's `"<count>/<considered> <Reason>"` items, sorted and joined by `", "`."""
    return ", ".join(sorted(f"{count}/{considered} {name}" for name, count in reasons.items()))


def _type_mismatch(device: DeviceUsage, request: ContainerRequest, options: FitOptions) -> bool:
    info = device.info
    if not info.matches_vendor(request.type):
        return True
    model = info.type.lower()
    if options.use_types and not any(t in model for t in options.use_types):
        return True
    if any(t in model for t in options.nouse_types):
        return True
    return options.vgpu_mode is not None and info.mode not in options.vgpu_mode


def _early_refusal(
    device: DeviceUsage, node: NodeSnapshot, request: ContainerRequest, options: FitOptions
) -> str | None:
    """The checks that come before the numa-bind run (a refused device does not start one)."""
    info = device.info
    if not info.health:
        return CARD_NOT_HEALTH
    if info.id in node.cordoned:
        return CARD_CORDONED
    if _type_mismatch(device, request, options):
        return CARD_TYPE_MISMATCH
    return None


def _selection_refusal(device: DeviceUsage, options: FitOptions) -> str | None:
    """The checks on the pod's uuid settings and on sharing, before the quota probe."""
    info = device.info
    if (options.use_uuids and info.id not in options.use_uuids) or (info.id in options.nouse_uuids):
        return CARD_UUID_MISMATCH
    if device.used >= info.count:
        return CARD_TIME_SLICING_EXHAUSTED
    if options.policy.mutex and device.used > 0:
        return EXCLUSIVE_CONFLICT
    return None


def _capacity_refusal(device: DeviceUsage, memreq: int, cores: int) -> str | None:
    """The checks on the device's free memory and cores, after the quota probe."""
    info = device.info
    if info.devmem - device.usedmem < memreq:
        return CARD_INSUFFICIENT_MEMORY
    if info.devcore - device.usedcores < cores:
        return CARD_INSUFFICIENT_CORE
    if info.devcore == 100 and cores == 100 and device.used > 0:
        return EXCLUSIVE_CONFLICT
    if info.devcore != 0 and device.usedcores == info.devcore and cores == 0:
        return CARD_COMPUTE_UNITS_EXHAUSTED
    if info.mode == "mig":
        # MIG placement needs the GPU's MIG geometry, which the register does not carry.
        return CARD_MIG_INFEASIBLE
    return None


def _node_refusal(node: NodeSnapshot, request: ContainerRequest) -> str | None:
    """A refusal of the whole node, before any device is walked."""
    if request.type not in keys.KNOWN_VENDORS:
        return DEVICE_TYPE_NOT_FOUND
    of_type = sum(1 for d in node.devices if d.info.matches_vendor(request.type))
    if request.nums > of_type:
        return NODE_INSUFFICIENT_DEVICE
    return None


def fit_container(
    node: NodeSnapshot,
    request: ContainerRequest,
    options: FitOptions,
    position: int,
    pod_rows: Mapping[int, ContainerEntry],
    quota: QuotaProbe | None = None,
) -> ContainerFit:
    """Pick `request.nums` devices for the container at `position`, most preferred first.

    `pod_rows` holds the pod's already-placed containers by position (for the quota probe).
    """
    devices = node.devices
    considered = len(devices)
    refused = _node_refusal(node, request)
    if refused is not None:
        return ContainerFit((), {refused: 1}, considered)

    cores = min(request.coresreq, 100)
    reasons: Counter[str] = Counter()
    verdicts: list[DeviceVerdict] = []
    taken: list[ContainerDevice] = []
    run_numa: int | None = None
    ordered = order_devices(devices, request, options.policy, options.numa_bind, options.weights)

    for device in reversed(ordered):
        info = device.info
        reason = _early_refusal(device, node, request, options)
        if reason is None and options.numa_bind and info.numa != run_numa:
            # A new NUMA run starts: picks of the previous run cannot be combined with it.
            if taken:
                reasons[NUMA_NOT_FIT] += len(taken)
                taken = []
            run_numa = info.numa
        if reason is None:
            reason = _selection_refusal(device, options)
        # The candidate is built only for a device that passed the cheap checks (this loop
        # runs for every device of every candidate node on each filter).
        picked = reason or _try_device(device, request, cores, taken, quota, pod_rows, position)
        if isinstance(picked, str):
            reasons[picked] += 1
            verdicts.append(DeviceVerdict(info.id, info.numa, picked))
            continue
        taken.append(picked)
        verdicts.append(DeviceVerdict(info.id, info.numa, PICKED))
        if len(taken) == request.nums:
            return ContainerFit(tuple(taken), {}, considered, tuple(verdicts))
    if taken:
        reasons[ALLOCATED_INSUFFICIENT] += len(taken)
    return ContainerFit((), dict(reasons), considered, tuple(verdicts))


def _try_device(
    device: DeviceUsage,
    request: ContainerRequest,
    cores: int,
    taken: Sequence[ContainerDevice],
    quota: QuotaProbe | None,
    pod_rows: Mapping[int, ContainerEntry],
    position: int,
) -> ContainerDevice | str:
    """The container's share of `device`, or why it cannot have it: the quota probe with the
    picks so far, then the device's free memory and cores."""
    info = device.info
    memreq = request.mem_on(info.devmem)
    candidate = ContainerDevice(info.id, request.type, memreq, cores, info.index)
    if not _quota_fits(quota, pod_rows, position, (*taken, candidate)):
        return RESOURCE_QUOTA_NOT_FIT
    return _capacity_refusal(device, memreq, cores) or candidate


def _quota_fits(
    quota: QuotaProbe | None,
    pod_rows: Mapping[int, ContainerEntry],
    position: int,
    entry: ContainerEntry,
) -> bool:
    """Whether the pod, with `entry` at `position`, still fits its namespace quota."""
    if quota is None:
        return True
    rows = dict(pod_rows)
    rows[position] = entry
    return quota.fits(rows)


def restrict(node: NodeSnapshot, allowed: frozenset[str], vendor: str) -> NodeSnapshot:
    """Reference d.7: a copy of `node` keeping every device of another vendor and only the
    allowed devices of `vendor`; allowed IDs the node does not have are ignored."""
    return NodeSnapshot(
        node.name,
        [
            d.copy()
            for d in node.devices
            if not d.info.matches_vendor(vendor) or d.info.id in allowed
        ],
        node.cordoned,
    )


def apply_entry(node: NodeSnapshot, entry: ContainerEntry) -> None:
    """Count a placed container on the snapshot (`Used++`, memory and cores added)."""
    devices = node.by_uuid()
    for placed in entry:
        device = devices[placed.uuid]
        device.used += 1
        device.usedmem += placed.usedmem
        device.usedcores += placed.usedcores


@dataclass(frozen=True, slots=True)
class PodFit:
    """Whole-pod fit on one node: rows by position and the node's usage afterwards, or the
    position of the first container that did not fit and why."""

    rows: tuple[ContainerEntry, ...]
    node: NodeSnapshot | None
    failed_position: int | None = None
    failure: ContainerFit | None = None

    @property
    def ok(self) -> bool:
        return self.failed_position is None


def fit_pod(
    node: NodeSnapshot,
    requests: Sequence[ContainerRequest | None],
    kinds: Sequence[ContainerKind],
    options: FitOptions,
    quota: QuotaProbe | None = None,
    *,
    numa_first: Mapping[int, int] | None = None,
    numa_only: bool = False,
) -> PodFit:
    """Reference d.6: sidecars and apps accumulate; each regular init container is fitted into
    a copy pre-charged with the sidecars declared before it; usage is the per-device peak.

    `numa_first` maps container positions to the NUMA node kubelet is predicted to give them
    (shared/core/numa_prediction.py): such a container is fitted on that node's GPUs first and,
    unless `numa_only`, on the whole node when they cannot hold it."""
    # The phase peak only matters when init containers or sidecars exist (most pods have
    # neither; skipping the copy keeps the extender's per-node cost down).
    phased = any(kinds[p] is not ContainerKind.APP for p, r in enumerate(requests) if r)
    peak = node.copy() if phased else None
    app = node.copy()
    rows: dict[int, ContainerEntry] = {}
    for position, request in enumerate(requests):
        if request is None:
            rows[position] = ()
            continue
        kind = kinds[position]
        target = app.copy() if kind is ContainerKind.INIT else app
        numa = numa_first.get(position) if numa_first else None
        if numa is None:
            fit = fit_container(target, request, options, position, rows, quota)
        else:
            fit = _fit_numa_first(target, request, options, position, rows, quota, numa, numa_only)
        if not fit.ok:
            return PodFit((), None, position, fit)
        apply_entry(target, fit.devices)
        rows[position] = fit.devices
        if peak is not None and kind is not ContainerKind.APP:
            for top, seen in zip(peak.devices, target.devices, strict=True):
                top.raise_to(seen)
    if peak is not None:
        for current, top in zip(app.devices, peak.devices, strict=True):
            current.raise_to(top)
    return PodFit(tuple(rows[p] for p in range(len(requests))), app)


def _fit_numa_first(
    node: NodeSnapshot,
    request: ContainerRequest,
    options: FitOptions,
    position: int,
    rows: Mapping[int, ContainerEntry],
    quota: QuotaProbe | None,
    numa: int,
    only: bool,
) -> ContainerFit:
    """The container fitted on NUMA node `numa`'s devices (the same usage records: the fit
    only reads them), then, unless `only`, on the whole node."""
    local = NodeSnapshot(node.name, [d for d in node.devices if d.info.numa == numa], node.cordoned)
    fit = fit_container(local, request, options, position, rows, quota)
    if fit.ok or only:
        return fit
    return fit_container(node, request, options, position, rows, quota)
