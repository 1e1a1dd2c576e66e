"""The rules of numafit's pod webhook (HAMi's): what to refuse at creation, and how to normalise
what is allowed. Pure; svc_scheduler/webhook.py serves them as a mutating webhook (and the API
emulator calls them in process). Named for the webhook, not "admission": kubelet's admission of
a pod to its node (the kubelet emulator) and the API server's admission chain are other things.

Refusals, each naming the annotation or resource and the value at fault:
- a scheduler-owned annotation (`hami.io/vgpu-node`, the allocation annotations, bind phase and
  times) set at creation: it would make accounting adopt a reservation nobody made (any pod);
- for pods asking for GPU resources: any annotation or GPU resource numafit reads whose value
  breaks its rule in `inputs` (an unknown `hami.io/gpu-scheduler-policy`, an invalid
  `hami.io/numa-alignment`, `nvidia.com/gpucores: 101`, a non-integer memory, ...: values
  HAMi would clamp or ignore included), read through the same `fit_options` and
  `pod_requests` as the extender's filter, so both refuse the same values in the same words;
  and a pod whose phase-aware need alone exceeds its namespace's GPU quota (reference e.5):
  such a pod could never be scheduled, so it is refused at once instead of staying Pending
  forever.

Mutation (JSON Patch, applied only to admitted GPU pods that use the default scheduler or
one of numafit's): the numafit scheduler name (the first of numafit's names, unless the pod
already names one of them); the GPU count `defaultGPUNum` injected when a container
names GPU memory or cores but no count; cores forced to 100 (exclusive) when a container asks
for a whole card without naming cores (reference d.1). Privileged containers are skipped, as
HAMi does: they see every GPU anyway.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.core import inputs, keys
from shared.core.errors import (
    AnnotationError,
    CoreError,
    ObjectError,
    PodAnnotationError,
    RequestError,
    shown,
)
from shared.core.fit import fit_options
from shared.core.model import ContainerKind, Usage
from shared.core.pods import pod_from_object
from shared.core.quantity import parse_quantity
from shared.core.requests import ContainerRequest, asks_for_gpu, pod_requests

if TYPE_CHECKING:
    from shared.core.config import CoreConfig
    from shared.core.quota import QuotaLimit

DEFAULT_SCHEDULER = "default-scheduler"
"""What the API server gives a pod that names no scheduler."""
DEFAULT_SCHEDULER_NAME = "numafit-scheduler"
"""numafit's scheduler name when none is configured: the kube-scheduler profile with numafit's
extender, which the webhook gives GPU pods, and the only pods the extender schedules."""
WHOLE_CARD_CORES = 100
SHOWN_SCHEDULER_NAME = 64
"""Characters of a pod's schedulerName quoted in a refusal (the rest is cut)."""

# Reasons (metric labels and log fields).
ALLOWED = "allowed"
OWNED_ANNOTATION = "scheduler_owned_annotation"
INVALID_NUMA_ALIGNMENT = "invalid_numa_alignment"
INVALID_SCORING_WEIGHTS = "invalid_scoring_weights"
INVALID_ANNOTATION = "invalid_annotation"
INVALID_REQUEST = "invalid_request"
QUOTA_EXCEEDED = "quota_exceeded"
INVALID_POD = "invalid_pod"


@dataclass(frozen=True, slots=True)
class WebhookDecision:
    """Allowed (possibly with JSON Patch operations) or refused with a message and HTTP code."""

    allowed: bool
    reason: str = ALLOWED
    message: str = ""
    code: int = 200
    patch: tuple[dict[str, Any], ...] = field(default_factory=tuple)


def _deny(reason: str, message: str, code: int = 400) -> WebhookDecision:
    return WebhookDecision(False, reason, message, code)


def pod_quota_need(
    kinds: Sequence[ContainerKind], requests: Sequence[ContainerRequest | None]
) -> Usage:
    """Reference e.5: the pod's phase-aware GPU need (MiB, core percent) for quota.

    Apps add up (`Memreq×Nums`, `Coresreq×Nums`); init containers are walked in order with a
    running sidecar sum: a sidecar adds to the sum and raises the peak to it, a regular init
    container raises the peak to the sum plus its own request. Need = max(peak, sidecars +
    apps). Cores are counted as the fit records them (at most 100 per GPU). Percentage-only
    memory counts 0 MiB: its size depends on the card, as in HAMi.
    """
    sidecars = peak = apps = Usage()
    for kind, request in zip(kinds, requests, strict=True):
        if request is None:
            continue
        row = Usage(
            request.memreq * request.nums, min(request.coresreq, WHOLE_CARD_CORES) * request.nums
        )
        if kind is ContainerKind.SIDECAR:
            sidecars = sidecars + row
            peak = peak.max(sidecars)
        elif kind is ContainerKind.INIT:
            peak = peak.max(sidecars + row)
        else:
            apps = apps + row
    return peak.max(sidecars + apps)


def quota_refusal(
    need: Usage, limit: QuotaLimit | None, namespace: str, config: CoreConfig
) -> str | None:
    """Why `need` can never fit the namespace's explicit limits on its own, or None."""
    if limit is None:
        return None
    if limit.mem is not None and need.mem > limit.mem:
        return (
            f"pod needs {need.mem} MiB of {config.resource_memory_name} at its peak but the "
            f"ResourceQuota of namespace {namespace} allows {limit.mem}"
        )
    if limit.cores is not None and need.cores > limit.cores:
        return (
            f"pod needs {need.cores} of {config.resource_core_name} at its peak but the "
            f"ResourceQuota of namespace {namespace} allows {limit.cores}"
        )
    return None


def _containers(pod: Mapping[str, Any]) -> list[tuple[str, int, Mapping[str, Any]]]:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    found: list[tuple[str, int, Mapping[str, Any]]] = []
    for key in ("initContainers", "containers"):
        items = spec.get(key)
        if isinstance(items, list):
            found.extend(
                (key, i, item) for i, item in enumerate(items) if isinstance(item, Mapping)
            )
    return found


def _privileged(container: Mapping[str, Any]) -> bool:
    context = container.get("securityContext")
    return isinstance(context, Mapping) and context.get("privileged") is True


def _resources(container: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return {}
    value = resources.get(section)
    return value if isinstance(value, Mapping) else {}


def _has(container: Mapping[str, Any], name: str) -> bool:
    return name in _resources(container, "limits") or name in _resources(container, "requests")


def asks_for_gpus(pod: Mapping[str, Any], config: CoreConfig) -> bool:
    """Does any non-privileged container name a GPU resource (limits or requests)?"""
    return any(
        not _privileged(c)
        and (
            asks_for_gpu(_resources(c, "limits"), config)
            or asks_for_gpu(_resources(c, "requests"), config)
        )
        for _, _, c in _containers(pod)
    )


def _pointer(*parts: str | int) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _container_additions(container: Mapping[str, Any], config: CoreConfig) -> dict[str, str]:
    """Reference d.1's admission mutation for one container: resources to add to its limits."""
    if _privileged(container):
        return {}
    added: dict[str, str] = {}
    has_count = _has(container, config.resource_count_name)
    named = (
        config.resource_memory_name,
        config.resource_memory_percentage_name,
        config.resource_core_name,
    )
    if not has_count and config.default_gpu_num > 0 and any(_has(container, n) for n in named):
        added[config.resource_count_name] = str(config.default_gpu_num)
        has_count = True
    if (
        has_count
        and not _has(container, config.resource_core_name)
        and _whole_card(container, config)
    ):
        added[config.resource_core_name] = str(WHOLE_CARD_CORES)
    return added


def _lookup(container: Mapping[str, Any], name: str) -> Any:
    """Limits first, requests as the fallback (as the request derivation reads them)."""
    limits = _resources(container, "limits")
    return limits[name] if name in limits else _resources(container, "requests").get(name)


def _whole_card(container: Mapping[str, Any], config: CoreConfig) -> bool:
    """No memory size given: a percentage of 100 (or more), or no usable percentage either
    (the request derivation then takes the whole card, unless `defaultMemory` sizes it)."""
    if _has(container, config.resource_memory_name):
        return False
    value = _lookup(container, config.resource_memory_percentage_name)
    try:
        percentage = parse_quantity(value) if value is not None else None
    except CoreError:
        return False  # refused later by the request derivation, with its own message
    if percentage is None or percentage <= 0:
        return config.default_memory == 0
    return percentage >= 100


def mutation(
    pod: Mapping[str, Any], config: CoreConfig, scheduler_names: tuple[str, ...]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The JSON Patch for a GPU pod and the pod as it looks once the patch is applied: a pod
    of none of `scheduler_names` gets the first."""
    ops: list[dict[str, Any]] = []
    patched: dict[str, Any] = copy.deepcopy(dict(pod))
    for key, index, container in _containers(pod):
        added = _container_additions(container, config)
        if not added:
            continue
        target = patched["spec"][key][index]
        resources = container.get("resources")
        if not isinstance(resources, Mapping):
            ops.append(
                {
                    "op": "add",
                    "path": _pointer("spec", key, index, "resources"),
                    "value": {"limits": dict(added)},
                }
            )
            target["resources"] = {"limits": dict(added)}
            continue
        if not isinstance(resources.get("limits"), Mapping):
            ops.append(
                {
                    "op": "add",
                    "path": _pointer("spec", key, index, "resources", "limits"),
                    "value": dict(added),
                }
            )
            target["resources"]["limits"] = dict(added)
            continue
        for name, value in added.items():
            ops.append(
                {
                    "op": "add",
                    "path": _pointer("spec", key, index, "resources", "limits", name),
                    "value": value,
                }
            )
            target["resources"]["limits"][name] = value
    spec = pod.get("spec")
    current = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    if current not in scheduler_names:
        # Already one of numafit's profiles (several may share the extender): left as it is.
        scheduler_name = scheduler_names[0]
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
        patched.setdefault("spec", {})["schedulerName"] = scheduler_name
    return ops, patched


def pod_scheduler_name(pod: Mapping[str, Any]) -> str:
    """The pod's `spec.schedulerName`, as the API server stores it: `default-scheduler` when
    the pod names none (or not as a string)."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER


def other_scheduler_message(key: str, name: str, scheduler_names: tuple[str, ...]) -> str:
    """Why numafit refuses pod `key`, whose schedulerName `name` is none of `scheduler_names`.

    An extender is called for every profile of the kube-scheduler configured with it, and
    /filter and /bind can be called by anyone reaching the port: a pod of another scheduler
    placed by numafit would hold GPUs (and be bound) without its scheduler knowing."""
    quoted = name if len(name) <= SHOWN_SCHEDULER_NAME else name[:SHOWN_SCHEDULER_NAME] + "..."
    return (
        f"pod {key} has schedulerName {quoted!r}, not one of numafit's "
        f"({', '.join(scheduler_names)}): numafit does not schedule it"
    )


def uses_other_scheduler(pod: Mapping[str, Any], scheduler_names: tuple[str, ...]) -> bool:
    """A scheduler other than the default one and numafit's: the webhook leaves the pod be."""
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return bool(name) and name != DEFAULT_SCHEDULER and name not in scheduler_names


def review_pod_creation(
    pod: Any,
    *,
    namespace: str,
    config: CoreConfig,
    scheduler_names: tuple[str, ...],
    quota: QuotaLimit | None = None,
) -> WebhookDecision:
    """Decide the creation of one Pod (its JSON object as the API server received it);
    `scheduler_names`: numafit's, the first the one given to GPU pods."""
    if not isinstance(pod, Mapping):
        return _deny(INVALID_POD, "the object is not a Pod")
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    annotations = annotations if isinstance(annotations, Mapping) else {}
    owned = [key for key in keys.SCHEDULER_OWNED if key in annotations]
    if owned:
        return _deny(
            OWNED_ANNOTATION,
            f"annotation {owned[0]}={shown(annotations[owned[0]])} is written by the numafit "
            "scheduler and may not be set when a pod is created",
            403,
        )
    if not asks_for_gpus(pod, config) or uses_other_scheduler(pod, scheduler_names):
        return WebhookDecision(True)
    read = {key: _text(annotations[key]) for key in inputs.READ_ANNOTATIONS if key in annotations}
    try:
        # The very reading the filter does, so that both refuse the same values (inputs.py).
        fit_options(read, config)
    except AnnotationError as exc:
        key = exc.key if isinstance(exc, PodAnnotationError) else ""
        return _deny(_ANNOTATION_REASONS.get(key, INVALID_ANNOTATION), str(exc))
    ops, patched = mutation(pod, config, scheduler_names)
    try:
        info = pod_from_object(_with_placeholder_uid(patched))
    except ObjectError as exc:
        return _deny(INVALID_POD, str(exc))
    try:
        requests = pod_requests(info, config)
    except RequestError as exc:
        return _deny(INVALID_REQUEST, f"GPU request can never be scheduled: {exc}")
    refusal = quota_refusal(pod_quota_need(info.kinds, requests), quota, namespace, config)
    if refusal is not None:
        return _deny(QUOTA_EXCEEDED, refusal, 403)
    return WebhookDecision(True, patch=tuple(ops))


_ANNOTATION_REASONS = {
    keys.NUMA_ALIGNMENT: INVALID_NUMA_ALIGNMENT,
    keys.SCORING_WEIGHTS: INVALID_SCORING_WEIGHTS,
}
"""Refusal reasons of their own (older than INVALID_ANNOTATION, kept for dashboards)."""


def _text(value: Any) -> str:
    # The API server decodes annotations into strings (a JSON null becomes "").
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _with_placeholder_uid(pod: dict[str, Any]) -> dict[str, Any]:
    """The API server assigns the uid after admission; the core's parser wants one."""
    meta = pod.get("metadata")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    meta["uid"] = meta.get("uid") or "admission-review"
    return {**pod, "metadata": meta}
