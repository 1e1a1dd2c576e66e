"""Allocate's `consume`: accounting records the GPUs kubelet gave the container.

A `conflict` means the pod changed under accounting, which re-read it: asked again while the
call's budget allows. No answer, `node_unavailable` and `deadline_exceeded` say accounting is
away or late, not that the allocation is wrong (`Unrecorded`: with the entry known, Allocate is
answered and the consumption journalled); every other refusal fails the Allocate with
accounting's code and (cut) reason."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shared import messages
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core.errors import CoreError
from shared.core.model import ContainerDevice
from svc_deviceplugin.hops import (
    MIN_HOP_S,
    AdmissionRefused,
    code_of,
    code_text,
    outside_text,
    unreadable,
)
from svc_deviceplugin.metrics import PluginMetrics, allocation_result

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shared.core.model import ContainerEntry
    from shared.service.lifecycle import Deadline

log = logging.getLogger("numafit.deviceplugin")

CONSUME_ATTEMPTS = 3
"""consume answered `conflict` (accounting re-read the pod): asked again, this many in all."""
DEFERRED_CODES = frozenset({Code.NODE_UNAVAILABLE, Code.DEADLINE_EXCEEDED})
"""consume refusals that say accounting is away or late, not that the allocation is wrong: with
the entry known, Allocate is answered and the consumption journalled."""


class Unrecorded(Exception):
    """accounting did not record the consumption, for a reason that says nothing against it
    (no answer, a takeover, out of budget): deferred when the entry is known, else refused
    with `message`."""

    def __init__(self, message: str, result: str, reason: str) -> None:
        super().__init__(message)
        self.result = result
        """The `allocations_total` label when the Allocate fails."""
        self.reason = reason
        """The `consume_deferred_total` label when it is deferred."""


async def consume(
    accounting: AccountingClient,
    request: messages.ConsumeRequest,
    deadline: Deadline,
    reserve: float,
    *,
    accounting_timeout: float,
    call_ms: int,
    metrics: PluginMetrics,
) -> messages.ConsumeReply:
    """Ask accounting to consume the entry, leaving `reserve` seconds of the budget (see the
    module docstring)."""
    for attempt in range(1, CONSUME_ATTEMPTS + 1):
        budget = min(accounting_timeout, deadline.remaining() - reserve)
        if budget < MIN_HOP_S:
            raise Unrecorded(
                f"cannot record the allocation: the call's {call_ms} ms budget is spent",
                "deadline_exceeded",
                "deadline_exceeded",
            )
        try:
            reply = await accounting.ask(request, messages.ConsumeReply, budget)
        except AccountingUnavailable as exc:
            if unreadable(exc):
                raise unusable(exc, metrics) from exc
            raise Unrecorded(
                f"cannot record the allocation: {outside_text(str(exc))}",
                "accounting_unavailable",
                "accounting_unavailable",
            ) from exc
        if reply.ok:
            return reply
        code, shown_code = code_of(reply.code), code_text(reply.code)
        error = outside_text(reply.error or "")
        if code is Code.CONFLICT and attempt < CONSUME_ATTEMPTS:
            log.info("consume conflict; asking again", extra={"attempt": attempt})
            continue
        log.warning("allocation refused by accounting", extra={"code": shown_code, "error": error})
        message = f"allocation refused by accounting ({shown_code}): {error}"
        if code is not None and code in DEFERRED_CODES:
            raise Unrecorded(message, allocation_result(code), code.value)
        metrics.allocations.labels(allocation_result(code)).inc()
        raise AdmissionRefused(message)
    raise AssertionError("unreachable")  # pragma: no cover


def unusable(exc: Exception, metrics: PluginMetrics) -> AdmissionRefused:
    """accounting's entry (or reply) cannot be used: counted, and the Allocate fails."""
    metrics.allocations.labels("unusable_reply").inc()
    return AdmissionRefused(f"accounting sent an unusable entry: {outside_text(str(exc))}")


def running_on(reserved: ContainerEntry, gpus: Sequence[str]) -> ContainerEntry:
    """The entry as it runs on `gpus`, as accounting's consume records it
    (`shared.core.consume.plan_consume`): each reserved amount stays on its GPU when kubelet
    gave that GPU, and the others' amounts go, in order, to the GPUs kubelet gave instead."""
    if len(gpus) != len(reserved) or len(set(gpus)) != len(gpus):
        raise CoreError(
            f"Allocate of {len(gpus)} device(s) does not match the pending entry of {len(reserved)}"
        )
    if {d.uuid for d in reserved} == set(gpus):
        return reserved  # no drift: the reservation as it stands, in its own order
    kept = {d.uuid: d for d in reserved}
    spare = iter([d for d in reserved if d.uuid not in gpus])
    running = []
    for uuid in gpus:
        device = kept[uuid] if uuid in kept else next(spare)
        running.append(ContainerDevice(uuid, device.type, device.usedmem, device.usedcores))
    return tuple(running)
