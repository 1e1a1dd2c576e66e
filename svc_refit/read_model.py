"""svc_refit's read model: the latest state of each node accounting published.

Accounting publishes `(epoch, revision)` of a node after every change; the refit keeps the last
snapshot it fetched per node and fetches again only when a newer revision (or a new epoch, i.e.
an accounting restart) was announced. A decision made on a stale view is harmless: the move it
leads to names the revision and accounting refuses it with `conflict`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared import subjects
from shared.accounting_client import AccountingClient
from shared.core.accounting import TrackedPod
from shared.core.quota import QuotaLedger
from shared.ledger_wire import NodeState, node_state_from_wire, quota_from_wire, tracked_from_wire
from shared.wire import Reader, WireError, loads_object

log = logging.getLogger("numafit.refit")


@dataclass(frozen=True, slots=True)
class View:
    """What one refit decides on."""

    epoch: str
    node: NodeState
    pod: TrackedPod | None
    quota: QuotaLedger | None


class ReadModel:
    def __init__(self, nc: Client, accounting: AccountingClient) -> None:
        self.nc = nc
        self.accounting = accounting
        self._views: dict[str, tuple[str, NodeState, dict[str, QuotaLedger]]] = {}
        self._announced: dict[str, tuple[str, int]] = {}
        self._subscription: Subscription | None = None
        self.fetches = 0

    async def start(self) -> None:
        self._subscription = await self.nc.subscribe(subjects.USAGE_WILDCARD, cb=self._on_usage)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _on_usage(self, msg: Msg) -> None:
        try:
            reader = Reader(loads_object(msg.data, "usage update"), "usage update")
            self._announced[reader.text("node")] = (
                reader.text("epoch"),
                reader.integer("revision"),
            )
        except WireError as exc:
            log.warning("usage update ignored", extra={"error": str(exc)})

    def invalidate(self, node: str) -> None:
        self._views.pop(node, None)

    def _fresh(self, node: str, namespace: str) -> tuple[str, NodeState, QuotaLedger] | None:
        cached = self._views.get(node)
        if cached is None:
            return None
        epoch, state, quotas = cached
        announced = self._announced.get(node)
        if announced is not None and announced != (epoch, state.revision):
            return None
        quota = quotas.get(namespace)
        if quota is None:
            return None
        return epoch, state, quota

    async def view(self, node: str, pod_uid: str, namespace: str, budget: float) -> View:
        """The node's state with the target pod and its namespace's quota."""
        fresh = self._fresh(node, namespace)
        if fresh is not None:
            epoch, state, quota = fresh
            pod = next((p for p in state.pods if p.uid == pod_uid), None)
            if pod is not None:
                return View(epoch, state, pod, quota)
        # Not cached, stale, or the pod lives elsewhere (or nowhere): ask accounting.
        self.fetches += 1
        reply = await self.accounting.snapshot(
            node, pod_uid=pod_uid, namespace=namespace, budget=budget
        )
        return self._store(node, namespace, reply)

    def _store(self, node: str, namespace: str, reply: dict[str, Any]) -> View:
        reader = Reader(reply, "snapshot reply")
        epoch = reader.text("epoch")
        states = [node_state_from_wire(n) for n in reader.objects("nodes")]
        state = states[0] if states else NodeState(node, 0, None, frozenset(), ())
        quota = quota_from_wire(reply["quota"]) if reply.get("quota") else QuotaLedger()
        raw_pod = reply.get("pod")
        pod = tracked_from_wire(raw_pod) if isinstance(raw_pod, dict) else None
        cached = self._views.get(node)
        quotas = (
            dict(cached[2]) if cached is not None and cached[1].revision == state.revision else {}
        )
        quotas[namespace] = quota
        self._views[node] = (epoch, state, quotas)
        return View(epoch, state, pod, quota)
