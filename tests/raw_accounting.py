"""Untyped accounting requests for tests: a body given as a dict, the reply returned as one.

Production code speaks `shared.messages` through `AccountingClient.ask`; tests also send what
no typed struct can describe (wrong types, made-up fields) and read replies field by field, so
they use this subclass, which shares the client's subject, deadline and error handling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from shared import subjects
from shared.accounting_client import REPLY_MARGIN, AccountingClient, AccountingUnavailable

if TYPE_CHECKING:
    from collections.abc import Mapping


class RawAccounting(AccountingClient):
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
            subjects.accounting("snapshot", subjects.ALL_NODES)
            if node == subjects.ALL_NODES
            else subjects.accounting(op, node)
        )
        if budget <= 0:
            raise AccountingUnavailable(f"no budget left to ask {subject}")
        payload = dict(body)
        if node != subjects.ALL_NODES:
            payload.setdefault("node", node)
        payload["deadlineMs"] = max(int((budget - margin) * 1000), 0)
        data = await self._roundtrip(op, subject, orjson.dumps(payload), budget)
        try:
            reply = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise AccountingUnavailable(f"accounting {op} reply is not JSON: {exc}") from exc
        if not isinstance(reply, dict):
            raise AccountingUnavailable(f"accounting {op} reply is not a JSON object")
        return reply

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
        """Every node as plain JSON, through the typed client's paging (one budget)."""
        epoch, nodes = await self.every_node(budget=budget, page=page)
        return {"ok": True, "epoch": epoch, "nodes": [msgspec.to_builtins(n) for n in nodes]}
