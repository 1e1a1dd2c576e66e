"""What an Allocate knows of its container before accounting answers it.

GetPreferredAllocation fetched the container's entry (`Admitting`, the refit's move applied),
or, when kubelet hands an app container the replicas it already gave the pod's init container
(kubelet's device reuse: no GetPreferredAllocation is asked), the plugin finds the pod's pending
entry and moves its reservation onto those GPUs first when it is elsewhere (`follow_reuse`), so
that accounting records what runs without calling it a difference from the reservation."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from shared import messages
from shared.core import keys
from shared.core.errors import CoreError
from shared.core.pods import Alignment, parse_alignment
from svc_deviceplugin.hops import ask_refit, code_text, outside_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nats.aio.client import Client

    from shared.core.model import ContainerEntry
    from shared.service.lifecycle import Deadline
    from svc_deviceplugin.config import PluginConfig
    from svc_deviceplugin.metrics import PluginMetrics

log = logging.getLogger("numafit.deviceplugin")

DEFER_RESERVE_S = 0.25
"""Seconds of an Allocate's budget kept back from its consume, when the entry is known, for
writing the journal should the consume not be answered."""


@dataclass(frozen=True, slots=True)
class Admitting:
    """A container entry GetPreferredAllocation fetched (the refit's move applied): what an
    Allocate needs to be answered without accounting."""

    uid: str
    namespace: str
    name: str
    index: int
    container_name: str
    devices: str
    """The reserved entry, HAMi's per-container encoding."""


async def follow_reuse(
    nc: Client,
    config: PluginConfig,
    metrics: PluginMetrics,
    found: Admitting,
    alignment: str | None,
    reserved: ContainerEntry,
    gpus: Sequence[str],
    deadline: Deadline,
) -> Admitting:
    """The entry of a container kubelet gave its init container's replicas (`gpus`), moved
    onto them by a refit when the reservation (`reserved`) is elsewhere; as it was when the
    refit does not move it (accounting then records what runs)."""
    where = {"pod": f"{found.namespace}/{found.name}", "container": found.index}
    if {d.uuid for d in reserved} == set(gpus):
        metrics.init_reuses.labels("same").inc()
        log.info(
            "kubelet reused the init container's replicas",
            extra={**where, "devices": list(gpus)},
        )
        return found
    try:
        mode = parse_alignment(alignment) or Alignment.BEST_EFFORT
    except CoreError:
        mode = Alignment.BEST_EFFORT
    refit = messages.RefitRequest(
        pod_uid=found.uid,
        pod_namespace=found.namespace,
        pod_name=found.name,
        node_name=config.node,
        container_index=found.index,
        container_name=found.container_name or msgspec.UNSET,
        device_type=keys.NVIDIA,
        allowed_device_uuids=tuple(dict.fromkeys(gpus)),
        mode=mode.value,
        # The consume comes after it: keep its share of the call.
        timeout_ms=max(deadline.remaining_ms() - int(DEFER_RESERVE_S * 2000), 1),
    )
    answer = await ask_refit(nc, refit, config.refit_timeout_ms)
    reply = answer.reply
    if reply is not None and reply.succeeded and reply.container_devices:
        metrics.init_reuses.labels("moved").inc()
        log.info(
            "kubelet reused the init container's replicas; the reservation followed",
            extra={**where, "devices": list(gpus), "code": code_text(reply.code)},
        )
        return dataclasses.replace(found, devices=reply.container_devices)
    metrics.init_reuses.labels("unmoved").inc()
    why = answer.failure or (reply.failure_reason if reply is not None else "") or "refused"
    log.warning(
        "kubelet reused the init container's replicas; the reservation could not follow, "
        "accounting records what runs",
        extra={**where, "devices": list(gpus), "why": outside_text(why or "")},
    )
    return found
