"""Request-reply client of svc_accounting's operations, used by every other service.

Each call is bounded by the caller's remaining budget; `deadlineMs` travels with the request
so accounting never commits after the caller has given up. No responders and timeouts become
`AccountingUnavailable`, so callers can apply their fallback without catching nats errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client

from shared import subjects
from shared.wire import WireError, dumps, loads_object


class AccountingUnavailable(Exception):
    """No accounting replica answered in time (or none is subscribed)."""


REPLY_MARGIN = 0.02
"""Seconds kept back from the caller's budget for the reply's trip home."""


class AccountingClient:
    def __init__(self, nc: Client, default_timeout: float = 2.0) -> None:
        self.nc = nc
        self.default_timeout = default_timeout

    async def call(
        self, op: str, node: str, body: Mapping[str, Any], budget: float | None = None
    ) -> dict[str, Any]:
        budget = self.default_timeout if budget is None else budget
        payload = dict(body)
        if node != subjects.ALL_NODES:
            payload.setdefault("node", node)
        payload["deadlineMs"] = max(int((budget - REPLY_MARGIN) * 1000), 0)
        subject = (
            f"{subjects.ACCOUNTING_PREFIX}.snapshot.{subjects.ALL_NODES}"
            if node == subjects.ALL_NODES
            else subjects.accounting(op, node)
        )
        try:
            msg = await self.nc.request(subject, dumps(payload), timeout=budget)
        except nats.errors.NoRespondersError as exc:
            raise AccountingUnavailable(f"no accounting service answers {subject}") from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise AccountingUnavailable(
                f"accounting did not answer {subject} in {budget:.3f}s"
            ) from exc
        except nats.errors.ConnectionClosedError as exc:
            raise AccountingUnavailable("NATS connection closed") from exc
        if msg.headers and msg.headers.get("Nats-Service-Error-Code"):
            raise AccountingUnavailable(
                f"accounting error {msg.headers.get('Nats-Service-Error-Code')}: "
                f"{msg.headers.get('Nats-Service-Error', '')}"
            )
        try:
            return dict(loads_object(msg.data, f"accounting {op} reply"))
        except WireError as exc:
            raise AccountingUnavailable(str(exc)) from exc

    async def snapshot(
        self,
        node: str,
        *,
        pod_uid: str | None = None,
        namespace: str | None = None,
        budget: float | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if pod_uid:
            body["podUID"] = pod_uid
        if namespace:
            body["namespace"] = namespace
        return await self.call("snapshot", node, body, budget)

    async def snapshot_all(self, *, budget: float | None = None, page: int = 200) -> dict[str, Any]:
        """Every node, fetched page by page (one NATS message cannot hold a large cluster).
        Restarts when accounting's epoch changes between pages (it restarted meanwhile)."""
        for _ in range(3):
            nodes: list[Any] = []
            after, epoch = "", None
            while True:
                reply = await self.call(
                    "snapshot", subjects.ALL_NODES, {"after": after, "limit": page}, budget
                )
                if not reply.get("ok", True):
                    raise AccountingUnavailable(f"snapshot refused: {reply.get('error', '')}")
                if epoch is not None and reply.get("epoch") != epoch:
                    break  # accounting restarted between pages: start over
                epoch = reply.get("epoch")
                nodes.extend(reply.get("nodes") or [])
                if not reply.get("more"):
                    return {"ok": True, "epoch": epoch, "nodes": nodes}
                after = str(reply.get("next", ""))
        raise AccountingUnavailable("accounting kept restarting during a snapshot")
