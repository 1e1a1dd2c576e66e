"""Refits at the device plugin's budget under contention.

200 pods on one node each hold a reservation on GPU-a, which kubelet does not allow; all 200 ask
at once (2 s budget each) for GPU-b, which has room for three. Before the fix every refit took a
snapshot of the whole node and every commit made the others' revision stale, so the work grew
with the square of the pending pods: one or two `moved` replies while two or three commits
landed, ~198 `deadline_exceeded`/`api_error` instead of `no_fit`, and a commit that landed
while its caller was told `deadline_exceeded`.

The outcome is checked against the API server (the durable record), not against the service.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core import keys
from shared.service import natsconn
from tests.builders import container, gpu, node, pod, refit_request
from tests.integration.harness import harness
from tests.metrics import refit_counter

if TYPE_CHECKING:
    from pathlib import Path

PODS = 200
ROOM = 3
MEM = 1000
BUDGET_MS = 2000


def contended_objects() -> list[tuple[str, dict[str, Any]]]:
    gpus = [
        gpu("GPU-a", 1, mem=PODS * MEM * 2, count=PODS + 10),
        gpu("GPU-b", 0, mem=ROOM * MEM),
    ]
    objects: list[tuple[str, dict[str, Any]]] = [("node", node("node-1", gpus))]
    for i in range(PODS):
        body = pod(
            f"p{i:03d}",
            containers=[container("app", 1, MEM)],
            namespace="ml",
            allocated=f"GPU-a,NVIDIA,{MEM},0:;",
            annotations={keys.BIND_PHASE: "allocating", keys.NUMA_ALIGNMENT: "best-effort"},
        )
        del body["metadata"]["uid"], body["metadata"]["resourceVersion"]
        objects.append(("pod", body))
    return objects


async def test_200_refits_for_room_for_3_get_3_moved_and_197_no_fit(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, contended_objects()) as h:
        assert h.kube is not None and h.client_nc is not None
        items, _ = await h.kube.list_pods()
        assert len(items) == PODS
        nc = h.client_nc

        async def ask(target: dict[str, Any]) -> tuple[dict[str, Any], float]:
            body = refit_request(target, 0, ["GPU-b"], timeoutMs=BUDGET_MS)
            started = time.perf_counter()
            try:
                msg = await natsconn.request(nc, subjects.refit("node-1"), orjson.dumps(body), 3.0)
            except TimeoutError:
                return {"code": "no_reply"}, time.perf_counter() - started
            return orjson.loads(msg.data), time.perf_counter() - started

        started = time.perf_counter()
        results = await asyncio.gather(*(ask(item) for item in items))
        wall = time.perf_counter() - started

        codes = Counter(reply["code"] for reply, _ in results)
        slowest = max(elapsed for _, elapsed in results)
        print(f"\ncontention: {dict(codes)}, wall {wall:.3f}s, slowest reply {slowest:.3f}s")

        # What landed, from the pods' annotations on the API server.
        after, _ = await h.kube.list_pods()
        landed = {
            p["metadata"]["name"]
            for p in after
            if (p["metadata"].get("annotations") or {})
            .get(keys.TO_ALLOCATE, "")
            .startswith("GPU-b,")
        }
        moved = {
            target["metadata"]["name"]
            for target, (reply, _) in zip(items, results, strict=True)
            if reply["code"] == "moved"
        }
        assert moved == landed  # every commit that landed was told so, and no other
        assert len(landed) == ROOM
        assert codes == {"moved": ROOM, "no_fit": PODS - ROOM}, codes
        for reply, _ in results:
            if reply["code"] == "no_fit":
                assert reply["succeeded"] is False
                assert reply["fitReasons"] == {"CardInsufficientMemory": 1}, reply
            else:
                assert reply["containerDevices"] == f"GPU-b,NVIDIA,{MEM},0:"
        assert slowest < BUDGET_MS / 1000
        # The read model served the burst: a handful of snapshots, not one per attempt.
        attempts = {
            r: refit_counter(h.refit, "commit_attempts", result=r)
            for r in ("ok", "conflict", "no_fit")
        }
        snapshots = refit_counter(h.refit, "snapshots")
        print(f"snapshots {snapshots}, moves {attempts}")
        assert snapshots <= 10
