"""The broker (a nats-server process of its own) restarted while refits are being served.

Four requesters refit 60 pods from GPU-a to GPU-b; after the first replies the broker is
stopped and started again on the same port. Nothing may be lost: every reply that came back is
consistent with the pods' annotations (a success has landed; a definite refusal has not), the
services reconnect by themselves and refits succeed again (waited for with a timeout), and in
the end every pod has moved and accounting's ledger equals the annotations.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import nats.errors
import orjson

from shared import subjects
from shared.core import keys
from shared.service import natsconn
from shared.testing.nats_server import NatsServer
from tests.builders import gpu, node
from tests.chaos.support import (
    Stopwatch,
    allocated_by_uid,
    entry_devices,
    ledger_allocated,
    list_pods,
    refit_body,
    reserved_pod,
    tally,
)
from tests.integration.harness import Harness, harness, wait_for
from tests.integration.processes import free_port
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path

PODS = 60
REQUESTERS = 4
RESTART_AFTER = 12
MAYBE_LANDED = ("deadline_exceeded", "api_error")
"""Refusals that do not say whether the commit landed (the answer was lost, not the move)."""


def objects() -> list[tuple[str, dict[str, Any]]]:
    gpus = [gpu("GPU-a", 0, mem=200000, count=100), gpu("GPU-b", 1, mem=200000, count=100)]
    found: list[tuple[str, dict[str, Any]]] = [("node", node("node-1", gpus))]
    for i in range(PODS):
        found.append(("pod", for_create(reserved_pod(f"load-{i}", "GPU-a", 1000, 1))))
    return found


async def refit(h: Harness, target: dict[str, Any]) -> dict[str, Any]:
    assert h.client_nc is not None
    body = orjson.dumps(refit_body(target, ["GPU-b"]))
    try:
        msg = await natsconn.request(h.client_nc, subjects.refit("node-1"), body, 3)
    except (
        nats.errors.TimeoutError,
        nats.errors.NoRespondersError,
        nats.errors.ConnectionClosedError,
        nats.errors.ConnectionReconnectingError,
    ) as exc:
        return {"lost": type(exc).__name__}
    reply: dict[str, Any] = orjson.loads(msg.data)
    return reply


def gpu_of(obj: dict[str, Any]) -> str:
    return entry_devices(obj["metadata"]["annotations"][keys.ALLOCATED])[0][0][0]


async def test_refits_lose_nothing_across_a_broker_restart(tmp_path: Path) -> None:
    broker = NatsServer(port=free_port())
    broker.start()
    try:
        async with harness(broker.url, tmp_path, objects()) as h:
            assert h.kube is not None
            pods = [p for p in await list_pods(h.kube) if p["metadata"]["name"].startswith("load")]
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
            for p in pods:
                queue.put_nowait(p)
            replies: dict[str, dict[str, Any]] = {}
            enough = asyncio.Event()
            clock = Stopwatch()

            async def requester() -> None:
                while not queue.empty():
                    target = queue.get_nowait()
                    replies[target["metadata"]["uid"]] = await refit(h, target)
                    if sum("code" in r for r in replies.values()) >= RESTART_AFTER:
                        enough.set()

            workers = [asyncio.ensure_future(requester()) for _ in range(REQUESTERS)]
            await asyncio.wait_for(enough.wait(), 30)
            await asyncio.to_thread(broker.stop)
            await asyncio.to_thread(broker.start)  # the same port, so the same URL
            await asyncio.wait_for(asyncio.gather(*workers), 60)
            load_seconds = clock.seconds

            # Every answer is consistent with the annotations, before anything is retried.
            after_load = {p["metadata"]["uid"]: p for p in await list_pods(h.kube)}
            wrong = []
            for uid, reply in replies.items():
                landed = gpu_of(after_load[uid]) == "GPU-b"
                if reply.get("succeeded") is True and not landed:
                    wrong.append(f"{reply} but the pod is still on GPU-a")
                elif (
                    "code" in reply
                    and reply.get("succeeded") is False
                    and reply["code"] not in MAYBE_LANDED
                    and landed
                ):
                    wrong.append(f"{reply} but the pod moved")

            # Refits succeed again: retry every pod that has not moved, each until it has.
            async def moved_eventually(target: dict[str, Any]) -> None:
                async def done() -> bool:
                    return (await refit(h, target)).get("succeeded") is True

                await wait_for(done, within=20)

            left = [p for p in pods if gpu_of(after_load[p["metadata"]["uid"]]) != "GPU-b"]
            retry_failed = ""
            try:
                await asyncio.gather(*(moved_eventually(p) for p in left))
            except TimeoutError:
                retry_failed = "refits did not succeed again within 20 s of the restart"
            final = await list_pods(h.kube)
            annotated = allocated_by_uid(final, "node-1")

            async def ledger_caught_up() -> bool:
                return await ledger_allocated(h.client, "node-1") == annotated

            await wait_for(ledger_caught_up, within=10)
    finally:
        broker.stop()

    outcomes = tally(r.get("code", f"lost:{r.get('lost')}") for r in replies.values())
    print(f"\nbroker restart under load: {outcomes} in {load_seconds:.2f}s; retried {len(left)}")
    assert not wrong, wrong
    assert not retry_failed, f"{retry_failed}; outcomes {outcomes}"
    assert all(gpu_of(p) == "GPU-b" for p in final if p["metadata"]["name"].startswith("load"))
