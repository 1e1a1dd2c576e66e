"""What the refit tests share: the worked example's objects, a raw refit publish, checks."""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from tests.builders import refit_request

if TYPE_CHECKING:
    from tests.integration.harness import Harness

WORKED = Path(__file__).resolve().parents[2] / "shared" / "data" / "plan-worked-example.json"


def for_create(obj: dict[str, Any]) -> dict[str, Any]:
    """What a client sends on create: no uid, no resourceVersion."""
    body = copy.deepcopy(obj)
    body["metadata"].pop("uid", None)
    body["metadata"].pop("resourceVersion", None)
    return body


def worked_objects() -> list[tuple[str, dict[str, Any]]]:
    """HAMi's worked example: `main` (container 1) reserved on GPU-a, kubelet allows GPU-b."""
    example = json.loads(WORKED.read_text())
    return [("node", example["node"]), ("pod", for_create(example["pods"][0]))]


def request_for(created: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body = refit_request(created, 1, ["GPU-b"])
    body.update(extra)
    return body


NO_RESPONDERS = "503"
"""The status header of nats-server's "no responders" answer (an empty message)."""


async def raw_refit(h: Harness, token: str, payload: bytes, within: float = 5.0) -> dict[str, Any]:
    """Publish on `numafit.refit.v1.<token>` with a one-letter reply subject, so that even a
    4000-character token keeps the test client's own control line under nats-server's limit."""
    assert h.client_nc is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        inbox = f"r{secrets.token_hex(3)}"
        sub = await h.client_nc.subscribe(inbox, max_msgs=1)
        try:
            await h.client_nc.publish(f"{subjects.REFIT_PREFIX}.{token}", payload, reply=inbox)
            msg = await sub.next_msg(timeout=max(deadline - loop.time(), 0.001))
        finally:
            await sub.unsubscribe()
        if (msg.headers or {}).get("Status") != NO_RESPONDERS:
            break
        # nats-server can say "no responders" to a request sent just after the service's
        # subscription was flushed (shared/service/natsconn.py `request` rides over it too).
        await asyncio.sleep(0.005)
    reply: dict[str, Any] = orjson.loads(msg.data)
    return reply


async def still_serving(h: Harness, created: dict[str, Any]) -> None:
    """The refit service kept its NATS connection and still moves a valid refit."""
    assert h.refit is not None
    assert h.refit.nc.is_connected
    assert h.refit.readiness.failure is None
    reply = await h.refit_request(request_for(created))
    assert reply["code"] == "moved", reply
