"""Events on pods as kube-scheduler and kubelet record them, repeats folded into one.

client-go's recorder folds an Event identical to an earlier one (same object, type, reason,
message and source) into that Event: `count` grows and `lastTimestamp` moves, so a pod retried
every ten seconds shows `FailedScheduling ... (x12 over 2m)` in `kubectl describe`, not twelve
lines. The same here: the first occurrence is created, the next ones patch it. Recording never
raises: an Event is informational, and a failure is logged.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client.exceptions import ApiException

from shared.service.kube_io import MERGE_PATCH

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.up.events")

TIMEOUT = 2.0
"""Seconds one Event write may take."""
REMEMBERED = 4096
"""Distinct Events whose names are kept for folding repeats (least recently used out)."""
MESSAGE_LIMIT = 1024


@dataclass(slots=True)
class _Seen:
    name: str
    namespace: str
    count: int


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventSink:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()

    async def record(
        self,
        pod: Mapping[str, Any],
        event_type: str,
        reason: str,
        message: str,
        component: str,
        host: str = "",
    ) -> None:
        meta = pod.get("metadata") or {}
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        uid = meta.get("uid", "")
        message = message[:MESSAGE_LIMIT]
        key = (namespace, name, uid, event_type, reason, message, component)
        seen = self._seen.get(key)
        try:
            if seen is not None:
                self._seen.move_to_end(key)
                seen.count += 1
                body = {"count": seen.count, "lastTimestamp": _now()}
                if await self._send(
                    lambda: self.kube.core.patch_namespaced_event(  # type: ignore[call-arg]
                        seen.name,
                        seen.namespace,
                        body,
                        _content_type=MERGE_PATCH,
                        _preload_content=False,
                    )
                ):
                    return
            event_name = f"{name[:235]}.{time.time_ns():x}"  # as client-go: listed in order
            now = _now()
            source = {"component": component, **({"host": host} if host else {})}
            created = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": event_name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": namespace,
                    "name": name,
                    "uid": uid,
                },
                "reason": reason,
                "message": message,
                "type": event_type,
                "source": source,
                "reportingComponent": component,
                "reportingInstance": host or component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            await self._send(
                lambda: self.kube.core.create_namespaced_event(
                    namespace,
                    created,  # type: ignore[arg-type]
                    _preload_content=False,
                )
            )
        except Exception as exc:  # informational: never fail the caller
            log.warning(
                "event not recorded",
                extra={"pod": f"{namespace}/{name}", "reason": reason, "error": str(exc)},
            )
            return
        self._seen[key] = _Seen(event_name, namespace, 1)
        while len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)

    async def _send(self, call: Callable[[], Awaitable[Any]]) -> bool:
        """True when written; False when the Event to patch is gone (create it anew)."""
        try:
            async with asyncio.timeout(TIMEOUT):
                response = await call()
                try:
                    status = int(response.status)
                    if status == 404:
                        return False
                    if status >= 400:
                        text = (await response.read()).decode(errors="replace")[:200]
                        raise RuntimeError(f"{status} {text}")
                finally:
                    response.release()
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise RuntimeError(f"{exc.status} {exc.reason}") from exc
        return True
