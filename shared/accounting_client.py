"""Request-reply client of svc_accounting's operations, used by every other service.

Each call is bounded by the caller's remaining budget, and nothing here waits past it (a paged
snapshot of every node included: all its pages share one budget); `deadlineMs` travels with the
request, a margin shorter, so accounting never commits after the caller has given up and its
answer gets home. No responders and timeouts become `AccountingUnavailable`, so callers can
apply their fallback without catching nats errors.
"""

from __future__ import annotations

import asyncio
import time
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
        self,
        op: str,
        node: str,
        body: Mapping[str, Any],
        budget: float | None = None,
        *,
        margin: float = REPLY_MARGIN,
    ) -> dict[str, Any]:
        """One operation, answered within `budget` seconds or `AccountingUnavailable`.

        Accounting is given `budget - margin` (`deadlineMs`): it stops working that much before
        this call stops waiting, so that its answer, a success included, gets home in time. An
        invalid node name raises `subjects.InvalidName` before anything is sent."""
        budget = self.default_timeout if budget is None else budget
        subject = (
            f"{subjects.ACCOUNTING_PREFIX}.snapshot.{subjects.ALL_NODES}"
            if node == subjects.ALL_NODES
            else subjects.accounting(op, node)
        )
        if budget <= 0:
            raise AccountingUnavailable(f"no budget left to ask {subject}")
        payload = dict(body)
        if node != subjects.ALL_NODES:
            payload.setdefault("node", node)
        payload["deadlineMs"] = max(int((budget - margin) * 1000), 0)
        data = dumps(payload)
        if len(data) > self.nc.max_payload:
            raise AccountingUnavailable(
                f"{op} request of {len(data)} bytes exceeds the NATS limit of {self.nc.max_payload}"
            )
        try:
            # nats-py bounds the wait for the reply; this bounds the publish before it too.
            async with asyncio.timeout(budget):
                msg = await self.nc.request(subject, data, timeout=budget)
        except nats.errors.NoRespondersError as exc:
            raise AccountingUnavailable(f"no accounting service answers {subject}") from exc
        except (nats.errors.TimeoutError, TimeoutError) as exc:
            raise AccountingUnavailable(
                f"accounting did not answer {subject} in {budget:.3f}s"
            ) from exc
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as exc:
            raise AccountingUnavailable("NATS connection closed") from exc
        except nats.errors.OutboundBufferLimitError as exc:
            raise AccountingUnavailable("NATS reconnecting, outbound buffer full") from exc
        if msg.headers and msg.headers.get("Nats-Service-Error-Code"):
            raise AccountingUnavailable(
                f"accounting error {msg.headers.get('Nats-Service-Error-Code')}: "
                f"{subjects.shown(msg.headers.get('Nats-Service-Error', ''), 200)}"
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
        """Every node, fetched page by page (one NATS message cannot hold a large cluster),
        all pages and restarts within one `budget`. Starts over when accounting's epoch changes
        between pages (it restarted meanwhile), at most three times."""
        total = self.default_timeout if budget is None else budget
        deadline = time.monotonic() + total

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AccountingUnavailable(
                    f"snapshot of every node did not finish in {total:.3f}s"
                )
            return remaining

        for _ in range(3):
            nodes: list[Any] = []
            after, epoch = "", None
            while True:
                reply = await self.call(
                    "snapshot", subjects.ALL_NODES, {"after": after, "limit": page}, left()
                )
                if not reply.get("ok", True):
                    raise AccountingUnavailable(
                        f"snapshot refused: {subjects.shown(str(reply.get('error', '')), 200)}"
                    )
                if epoch is not None and reply.get("epoch") != epoch:
                    break  # accounting restarted between pages: start over
                epoch = reply.get("epoch")
                nodes.extend(reply.get("nodes") or [])
                if not reply.get("more"):
                    return {"ok": True, "epoch": epoch, "nodes": nodes}
                following = str(reply.get("next", ""))
                if following <= after:
                    raise AccountingUnavailable("snapshot pages do not advance")
                after = following
        raise AccountingUnavailable("accounting kept restarting during a snapshot")
