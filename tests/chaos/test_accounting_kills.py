"""svc_accounting SIGKILLed at random moments of a delayed move, restarted each time.

Every pod PATCH is held 0.3 s by the API emulator and, like a real API server, committed even
when its client died meanwhile (`outlive_client`). A refit per round moves one pod from GPU-a to
GPU-b; once its PATCH reached the API server, accounting is killed after a seeded random delay
(inside the PATCH's delay or just after it) and restarted. Afterwards the ledger (snapshot
over NATS, and the per-GPU gauges on /metrics) must equal what the pods' annotations add up to,
summed here from `hami.io/vgpu-devices-allocated` rather than by the code under test; every
`moved` reply must be in the annotations; and a refit commits again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import TYPE_CHECKING, Any

import nats.errors
import orjson

from shared import subjects
from shared.core import keys
from shared.service import natsconn
from shared.testing.kube_emulator import FaultRule, KubeEmulator
from tests.builders import gpu, node
from tests.chaos.support import (
    allocated_by_uid,
    create,
    entry_devices,
    expected_usage,
    kube_for,
    ledger_allocated,
    list_pods,
    nonzero,
    refit_body,
    reserved_pod,
    service,
    stop_all,
    usage_from_metrics,
)
from tests.integration.harness import wait_for
from tests.raw_accounting import RawAccounting

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

SEED = 20261201
KILLS = 5
PATCH_DELAY_S = 0.3


async def test_ledger_equals_the_annotations_after_accounting_is_killed_during_moves(
    nats_url: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        accounting = service("accounting", nats_url, kubeconfig, tmp_path)
        refit = service("refit", nats_url, kubeconfig, tmp_path)
        connection = await natsconn.connect(nats_url, "chaos-kills")
        nc = connection.client
        try:
            await create(kube, "node", node("node-1", [gpu("GPU-a", 0), gpu("GPU-b", 1)]))
            pods = [
                await create(kube, "pod", reserved_pod(f"train-{i}", "GPU-a", 4000, 10))
                for i in range(KILLS + 1)
            ]
            patches = emulator.faults.add(
                method="PATCH",
                path_regex=r"/namespaces/ml/pods/train-",
                delay_s=PATCH_DELAY_S,
                outlive_client=True,
            )
            accounting.start()
            refit.start()
            await accounting.wait_ready()
            await refit.wait_ready()

            replies: dict[str, dict[str, Any]] = {}
            kill_delays = []
            for round_, target in enumerate(pods):
                before = patches.hits
                request = asyncio.ensure_future(refit_once(nc, target))
                if round_ < KILLS:
                    # Once the move's PATCH reached the API server (or the refit ended
                    # without one), kill at a seeded random moment in or after its delay.
                    await wait_for(patch_arrived(patches, before, request), within=10)
                    delay = rng.uniform(0.0, PATCH_DELAY_S * 1.5)
                    kill_delays.append(round(delay, 3))
                    await asyncio.sleep(delay)  # chaos timing, not a wait for a condition
                    accounting.kill()
                    accounting.start()
                    await accounting.wait_ready()
                replies[target["metadata"]["uid"]] = await request

            # Every held PATCH has been committed (or was refused) by now.
            await wait_for(lambda: emulator.faults.in_flight == 0, within=10)
            client = RawAccounting(nc)

            async def view() -> tuple[Any, ...]:
                current = await list_pods(kube)
                metrics = await accounting.metrics()
                return (
                    await ledger_allocated(client, "node-1"),
                    allocated_by_uid(current, "node-1"),
                    nonzero(usage_from_metrics(metrics, "node-1")),
                    nonzero(expected_usage(current, "node-1")),
                    current,
                )

            async def consistent() -> bool:
                ledger, annotated, gauges, summed, _ = await view()
                return bool(ledger == annotated and gauges == summed)

            with contextlib.suppress(TimeoutError):
                await wait_for(consistent, within=10)
            ledger, annotated, gauges, summed, current = await view()
        finally:
            await connection.close()
            stop_all([refit, accounting])
            await kube.api.close()

    codes = [r.get("code", r.get("error")) for r in replies.values()]
    print(f"\nkill delays after the PATCH arrived: {kill_delays}; refit replies: {codes}")
    context = f"replies {codes}, kill delays {kill_delays}\n{accounting.tail()}"
    assert ledger == annotated, f"ledger pods differ from the annotations; {context}"
    assert gauges == summed, f"gauges {gauges} != annotations {summed}; {context}"
    on_gpu = {
        p["metadata"]["uid"]: entry_devices(p["metadata"]["annotations"][keys.ALLOCATED])[0][0][0]
        for p in current
    }
    for uid, reply in replies.items():
        if reply.get("code") == "moved":
            assert on_gpu[uid] == "GPU-b", f"a moved reply that did not land; {context}"
    assert codes[-1] == "moved", f"no refit commits after the kills; {context}"


def patch_arrived(
    rule: FaultRule, hits_before: int, request: asyncio.Future[Any]
) -> Callable[[], bool]:
    return lambda: rule.hits > hits_before or request.done()


async def refit_once(nc: Any, target: dict[str, Any]) -> dict[str, Any]:
    body = refit_body(target, ["GPU-b"], timeoutMs=2000)
    try:
        msg = await natsconn.request(nc, subjects.refit("node-1"), orjson.dumps(body), 5)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        return {"error": type(exc).__name__}
    reply: dict[str, Any] = orjson.loads(msg.data)
    return reply
