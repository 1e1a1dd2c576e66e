"""Kubernetes Events, recorded in the background.

An Event is informational (the drift accounting saw at consume, a refit's outcome, a failed
Binding): it is never worth delaying a reply or a shutdown for. So `record` returns at once and
the write runs as a child of the service's supervisor, bounded by `timeout`; at most `limit`
are in flight, and one more is dropped (and counted) rather than queued. Stopping the
supervisor bounds the rest: nothing outlives the service.

Results are reported to `on_result` as `recorded`, `failed` (an API error or the timeout) and
`dropped` (too many in flight), for a service's counter of them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from shared.service import kube_io

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from shared.service.kube_io import Kube
    from shared.service.supervisor import Supervisor

log = logging.getLogger("numafit")

TIMEOUT = 2.0
"""Seconds one Event may take to record."""
LIMIT = 256
"""Events being recorded at once; beyond it new ones are dropped."""
RESULTS = ("recorded", "failed", "dropped")
TEXT_LIMIT = 300


class EventRecorder:
    def __init__(
        self,
        kube: Kube | None,
        supervisor: Supervisor,
        *,
        timeout: float = TIMEOUT,
        limit: int = LIMIT,
        on_result: Callable[[str], None] | None = None,
        task_name: str = "event",
        logger: logging.Logger = log,
    ) -> None:
        self.kube = kube
        self.supervisor = supervisor
        self.timeout = timeout
        self.limit = limit
        self.on_result = on_result
        self.task_name = task_name
        self.log = logger
        self.in_flight = 0

    def record(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str
    ) -> bool:
        """Start recording an Event on the object `involved` names (namespace, name, uid);
        False when it is not: no Kubernetes client, too many in flight (dropped), or the
        service stopped."""
        if self.kube is None or not self.supervisor.running:
            return False
        if self.in_flight >= self.limit:
            self._result("dropped")
            return False
        work = self._write(self.kube, dict(involved), event_type, reason, message)
        try:
            task = self.supervisor.spawn(work, self.task_name)
        except RuntimeError:
            return False
        self.in_flight += 1
        task.add_done_callback(self._done)
        return True

    def _done(self, _: object) -> None:
        self.in_flight -= 1

    async def _write(
        self, kube: Kube, involved: dict[str, str], event_type: str, reason: str, message: str
    ) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await kube.create_event(involved, event_type, reason, message)
        except (TimeoutError, kube_io.KubeError) as exc:
            self._result("failed")
            where = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
            error = (str(exc) or type(exc).__name__)[:TEXT_LIMIT]
            self.log.warning(
                "event not recorded", extra={"pod": where, "reason": reason, "error": error}
            )
        else:
            self._result("recorded")

    def _result(self, result: str) -> None:
        if self.on_result is not None:
            self.on_result(result)
