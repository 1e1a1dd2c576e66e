"""kubelet's offered replicas judged by the fallback rule (`shared.core.fallback`: the pod's own
constraints, its GPU policy's order, distinct GPUs) on accounting's usage, for a container left
to kubelet's choice; and distinct GPUs, unjudged, when there is nothing better to go on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared import messages
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core import codec
from shared.core.fallback import fallback_choice
from shared.core.replicas import SelectionError, distinct_selection, select_replicas
from svc_deviceplugin.hops import MIN_HOP_S, code_text, outside_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shared.messages import PendingEntry, PendingPod

log = logging.getLogger("numafit.deviceplugin")


@dataclass(frozen=True, slots=True)
class ContainerPreference:
    """One container of a GetPreferredAllocation: the replicas kubelet offers, those it must
    include, and how many it wants."""

    available: Sequence[str]
    required: Sequence[str]
    size: int


@dataclass(frozen=True, slots=True)
class Judged:
    """The fallback rule's answer for kubelet's offered replicas: the preferred ones, or why
    none satisfies the pod (`refusal`), or neither when it could not be judged."""

    selection: list[str] | None = None
    refusal: str = ""
    source: str = "fallback"


def distinct(request: ContainerPreference, known: frozenset[str]) -> list[str]:
    """Replicas of distinct GPUs among those offered (empty when there are too few)."""
    try:
        return distinct_selection(request.available, request.required, request.size, known)
    except SelectionError:
        return []


async def judge_offered(
    accounting: AccountingClient,
    node_name: str,
    known: frozenset[str],
    pod: PendingPod,
    entry: PendingEntry,
    request: ContainerPreference,
    budget: float,
) -> Judged:
    """kubelet's offered replicas judged by the fallback rule on accounting's usage (one
    snapshot of the node with the pod, within `budget`); distinct GPUs, unjudged, when the
    usage cannot be had."""
    where = {"pod": f"{pod.namespace}/{pod.name}", "container": entry.index}
    try:
        if budget < MIN_HOP_S:
            raise AccountingUnavailable("the call's budget is spent")
        reply = await accounting.ask(
            messages.SnapshotRequest(node=node_name, pod_uid=pod.uid),
            messages.SnapshotReply,
            budget,
        )
        states = reply.nodes or ()
        wire = reply.pod
        if not reply.ok or not states or not isinstance(wire, messages.TrackedPodWire):
            raise AccountingUnavailable(f"no usage for the pod ({code_text(reply.code)})")
        node = states[0].to_state().snapshot()
        tracked = wire.to_core()
    except (AccountingUnavailable, messages.MessageError) as exc:
        log.warning(
            "kubelet's GPUs not judged: no usage at hand",
            extra={**where, "error": outside_text(str(exc))},
        )
        selection = distinct(request, known)
        return Judged(selection or None, source="distinct")
    if node is None:
        return Judged(distinct(request, known) or None, source="distinct")
    offered = codec.unique_physical_ids(request.available, known)
    choice = fallback_choice(tracked, entry.index, node, offered)
    if not choice.ok:
        return Judged(refusal=outside_text(choice.reason))
    try:
        selection = select_replicas(
            request.available, request.required, list(choice.gpus), request.size, known
        )
    except SelectionError:
        # kubelet's must-include replicas are not among the picks: distinct GPUs instead.
        return Judged(distinct(request, known) or None, source="distinct")
    return Judged(selection)
