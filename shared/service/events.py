"""Kubernetes Events, recorded in the background.

An Event is informational (the drift accounting saw at consume, a refit's outcome, a failed
Binding): it is never worth delaying a reply or a shutdown for. So `record` returns at once and
the write runs as a child of the service's supervisor, bounded by `timeout`; at most `limit`
are in flight, and one more is dropped (and counted) rather than queued. Stopping the
supervisor bounds the rest: nothing outlives the service.

Like client-go's event recorder, it keeps one object from flooding the API server: each object
(by UID, else namespace/name) has a token bucket of SPAM_BURST Events refilled at one per
SPAM_REFILL_SECONDS; beyond it an Event is `throttled` (counted, not written). A pod refitted
in a loop, or a bind retried hundreds of times, then costs the API server a few writes, not one
per attempt (and the writes do not compete with the requests that matter).

Results are reported to `on_result` as `recorded`, `failed` (an API error or the timeout),
`dropped` (too many in flight) and `throttled` (the object's burst spent), for a service's
counter of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
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
RESULTS = ("recorded", "failed", "dropped", "throttled")
TEXT_LIMIT = 300
SPAM_BURST = 25
"""Events one object may get at once (client-go's default spam filter burst)."""
SPAM_REFILL_SECONDS = 300.0
"""One more Event per object per this many seconds once the burst is spent (client-go's)."""
SPAM_KEYS = 4096
"""Objects whose buckets are remembered (least recently used forgotten first)."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class SpamFilter:
    """A token bucket per object: `allow` is False once the object's burst is spent."""

    def __init__(
        self,
        burst: int = SPAM_BURST,
        refill_seconds: float = SPAM_REFILL_SECONDS,
        keys: int = SPAM_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.keys = keys
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def allow(self, key: str) -> bool:
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            while len(self._buckets) > self.keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            refilled = (now - bucket.at) / self.refill_seconds
            bucket.tokens = min(float(self.burst), bucket.tokens + refilled)
            bucket.at = now
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True


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
        spam: SpamFilter | None = None,
    ) -> None:
        self.kube = kube
        self.supervisor = supervisor
        self.timeout = timeout
        self.limit = limit
        self.on_result = on_result
        self.task_name = task_name
        self.log = logger
        self.spam = spam if spam is not None else SpamFilter()
        self.in_flight = 0

    def record(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str
    ) -> bool:
        """Start recording an Event on the object `involved` names (namespace, name, uid);
        False when it is not: no Kubernetes client, the object's burst spent (throttled), too
        many in flight (dropped), or the service stopped."""
        if self.kube is None or not self.supervisor.running:
            return False
        key = involved.get("uid") or f"{involved.get('namespace', '')}/{involved.get('name', '')}"
        if not self.spam.allow(key):
            self._result("throttled")
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
