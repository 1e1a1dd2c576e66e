"""Where a container may run when its reservation cannot follow kubelet: one pure rule.

A best-effort pod gives up NUMA alignment, never its own hard constraints. When the refit does
not move its reservation onto the GPUs kubelet offers (refused, unanswered, timed out), or a
pod that did not opt in meets a mismatch, the device plugin still tells kubelet which replicas
it prefers, and picks them by this rule: the pod's own fit (its `nvidia.com/use-gpuuuid`,
`nouse-gpuuuid`, `use-gputype`, `nouse-gputype`, the memory and cores the container asked for,
health, cordons, exclusive cards) restricted to the offered GPUs, on the node's usage with the
pod's own reservation taken out and its other phases put back (phase-aware, as the refit fits:
the same restricted fit, `shared.core.refit.restricted_fit`, without the namespace quota, which
is the scheduler's admission rule and not a property of a GPU). The GPUs come distinct and in
the order of the pod's GPU policy. When no offered GPU satisfies the pod, the reasons say why
(HAMi's names and counts), and a best-effort pod is refused rather than over-commit a GPU or
break a pin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.core import keys
from shared.core.config import CoreConfig
from shared.core.refit import (
    RefitDecision,
    RefitInput,
    check_refittable,
    find_container_entry,
    restricted_fit,
)

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from shared.core.accounting import TrackedPod
    from shared.core.model import NodeSnapshot


@dataclass(frozen=True, slots=True)
class FallbackChoice:
    """The offered GPUs the container may run on, best first (empty: none may), and why not."""

    gpus: tuple[str, ...] = ()
    reason: str = ""
    """HAMi's reasons when no offered GPU satisfies the pod (`4/4 CardInsufficientMemory`)."""
    fit_reasons: Mapping[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.gpus)


def fallback_choice(
    tracked: TrackedPod,
    index: int,
    node: NodeSnapshot,
    offered: Collection[str],
    config: CoreConfig | None = None,
) -> FallbackChoice:
    """The offered GPUs (physical UUIDs) container `index` of `tracked` may run on, in the
    pod's policy order, judged on `node` (its usage counting every tracked pod, this one
    included, as accounting publishes it)."""
    request = RefitInput(
        pod_uid=tracked.uid,
        pod_namespace=tracked.pod.namespace,
        pod_name=tracked.pod.name,
        node_name=node.name,
        container_index=index,
        container_name="",
        device_type=keys.NVIDIA,
        allowed_device_uuids=tuple(dict.fromkeys(offered)),
    )
    found = find_container_entry(request, tracked)
    if isinstance(found, RefitDecision):
        return FallbackChoice(reason=found.failure_reason)
    usable = check_refittable(request, found, node)
    if isinstance(usable, RefitDecision):
        return FallbackChoice(reason=usable.failure_reason)
    fitted = restricted_fit(request, found, usable, None, config or CoreConfig())
    if isinstance(fitted, RefitDecision):
        return FallbackChoice(
            reason=fitted.failure_reason.removeprefix("no allowed device fits: "),
            fit_reasons=dict(fitted.fit_reasons),
        )
    return FallbackChoice(tuple(d.uuid for d in fitted.moved))
