"""Recording bind-phase `failed` for a pod whose admission failed, so that the scheduler's node
lock is released: within what is left of the kubelet call and, when that is not enough, after
the call, in the background, a few times with backoff."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from shared import messages
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core import keys
from shared.service.backoff import Backoff
from svc_deviceplugin.hops import MIN_HOP_S, code_of, code_text, outside_text

if TYPE_CHECKING:
    from shared.service.supervisor import Supervisor

log = logging.getLogger("numafit.deviceplugin")

LATER_ATTEMPTS = 3
"""Attempts of recording a failed binding after the kubelet call has ended."""
RETRIED_BIND_PHASE = frozenset({Code.DEADLINE_EXCEEDED, Code.CONFLICT, Code.API_ERROR})
"""A bind-phase `failed` refused with one of these may be recorded by asking again."""


class BindFailures:
    """Records failed bindings of the node's pods through accounting."""

    def __init__(
        self,
        accounting: AccountingClient,
        node: str,
        accounting_timeout: float,
        tasks: Supervisor,
    ) -> None:
        self.accounting = accounting
        self.node = node
        self.accounting_timeout = accounting_timeout
        self.tasks = tasks
        """Owns the records that outlive a kubelet call."""

    async def record(self, uid: str, budget: float) -> None:
        """Record bind-phase `failed` within `budget` (what is left of the call); when that is
        not enough, after the call, in the background."""
        if budget >= MIN_HOP_S and await self._record_failed(uid, budget):
            return
        log.info("bind-phase failed recorded after the call", extra={"pod_uid": uid})
        self.tasks.spawn(self._record_failed_later(uid), f"bind-phase-failed:{uid}")

    async def _record_failed(self, uid: str, budget: float) -> bool:
        """One attempt; True when accounting recorded it (or can never record it)."""
        request = messages.BindPhaseRequest(pod_uid=uid, phase=keys.PHASE_FAILED, node=self.node)
        try:
            reply = await self.accounting.ask(request, messages.BindPhaseReply, budget)
        except AccountingUnavailable as exc:
            log.warning("bind-phase failed not recorded", extra={"error": outside_text(str(exc))})
            return False
        if reply.ok:
            return True
        log.warning(
            "bind-phase failed refused",
            extra={"code": code_text(reply.code), "error": outside_text(reply.error or "")},
        )
        return code_of(reply.code) not in RETRIED_BIND_PHASE

    async def _record_failed_later(self, uid: str) -> None:
        backoff = Backoff()
        for _ in range(LATER_ATTEMPTS):
            if await self._record_failed(uid, self.accounting_timeout):
                return
            await backoff.wait()
        log.error("bind-phase failed never recorded", extra={"pod_uid": uid})
