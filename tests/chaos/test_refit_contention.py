"""200 refits racing for 3 slots, each with a 2 s budget.

200 pods on one node are reserved on GPU-a, outside the set kubelet allows (GPU-b); GPU-b has
memory for exactly three of them. All 200 refits are sent at once to svc_refit and
svc_accounting running as processes. Exactly as many `moved` replies as commits landed (counted
from the pods' annotations on the API server), three of them, and every other reply is
`no_fit`: none ran out of time (`deadline_exceeded`) or failed (`api_error`). The figures are
printed (run with -s to see them).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import nats.errors
import orjson

from shared import subjects
from shared.core import keys
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from tests.builders import gpu, node
from tests.chaos.support import (
    Stopwatch,
    create,
    entry_devices,
    kube_for,
    list_pods,
    refit_body,
    reserved_pod,
    service,
    stop_all,
    tally,
)

if TYPE_CHECKING:
    from pathlib import Path

PODS = 200
ROOM = 3
POD_MEM = 10000


async def test_200_refits_for_room_for_3(nats_url: str, tmp_path: Path) -> None:
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        accounting = service("accounting", nats_url, kubeconfig, tmp_path)
        refit = service("refit", nats_url, kubeconfig, tmp_path)
        connection = await natsconn.connect(nats_url, "chaos-contention")
        nc = connection.client
        try:
            gpus = [
                gpu("GPU-a", 0, mem=POD_MEM * PODS, count=PODS),
                gpu("GPU-b", 1, mem=POD_MEM * ROOM, count=10),
            ]
            await create(kube, "node", node("node-1", gpus))
            pods = await asyncio.gather(
                *(
                    create(kube, "pod", reserved_pod(f"race-{i}", "GPU-a", POD_MEM, 0))
                    for i in range(PODS)
                )
            )
            accounting.start()
            refit.start()
            await accounting.wait_ready()
            await refit.wait_ready()

            async def one(target: dict[str, Any]) -> str:
                body = orjson.dumps(refit_body(target, ["GPU-b"], timeoutMs=2000))
                try:
                    msg = await natsconn.request(nc, subjects.refit("node-1"), body, 5)
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                    return f"unanswered:{type(exc).__name__}"
                return str(orjson.loads(msg.data).get("code"))

            clock = Stopwatch()
            codes = await asyncio.gather(*(one(p) for p in pods))
            seconds = clock.seconds
            landed = sum(
                entry_devices(p["metadata"]["annotations"][keys.ALLOCATED])[0][0][0] == "GPU-b"
                for p in await list_pods(kube)
            )
        finally:
            await connection.close()
            stop_all([refit, accounting])
            await kube.api.close()

    outcomes = tally(codes)
    moved = outcomes.get("moved", 0)
    print(
        f"\n{PODS} refits for room for {ROOM}: {outcomes}; {landed} commits landed; "
        f"{seconds:.2f}s wall, {PODS / seconds:.0f} refits/s"
    )
    figures = f"{outcomes}, {landed} landed, {seconds:.2f}s"
    assert moved == landed, f"moved replies and landed commits differ: {figures}"
    assert landed == ROOM, f"the room was not used exactly: {figures}"
    assert outcomes.get("no_fit", 0) == PODS - ROOM, f"the others must be no_fit: {figures}"
