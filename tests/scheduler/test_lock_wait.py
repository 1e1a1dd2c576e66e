"""Transient refusals go through the bind, where kube-scheduler backs the pod off.

kube-scheduler v1.28 parks a pod its extender's filter refused (FailedNodes,
FailedAndUnresolvableNodes or Error) until an unrelated cluster event or its five-minute flush,
and backs off (1 s to 10 s) a pod whose bind failed (tests/real/test_backoff.py shows both on
the real kube-scheduler). So the extender never refuses at filter time for what clears by
itself: a node locked for another pod's allocation is kept and the bind waits for the lock; a
namespace quota that may be raised is answered by keeping a node and failing the bind.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from shared.core import keys
from tests.builders import gpu, node, quota
from tests.integration.harness import wait_for
from tests.raw_kube import raw
from tests.scheduler.stack import pending_pod, stack

if TYPE_CHECKING:
    from pathlib import Path

    from tests.scheduler.stack import Stack


def one_node() -> list[tuple[str, dict[str, Any]]]:
    return [("node", node("node-1", [gpu("GPU-a", 0)]))]


async def bind(s: Stack, created: dict[str, Any], node_name: str = "node-1") -> dict[str, Any]:
    meta = created["metadata"]
    status, body = await s.post(
        "/bind",
        {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node_name,
        },
    )
    assert status == 200, body
    answer: dict[str, Any] = body
    return answer


async def admitted(s: Stack, pod_obj: dict[str, Any], node_name: str = "node-1") -> None:
    """What the device plugin's consume does to the node lock: the pod is no longer
    allocating (bind-phase success), and the scheduler's read model learns it by the update
    accounting publishes (nothing tells the extender directly)."""
    reply = await s.h.client.call(
        "bind-phase", node_name, {"podUID": pod_obj["metadata"]["uid"], "phase": "success"}
    )
    assert reply["ok"], reply


async def scheduled(s: Stack, name: str) -> dict[str, Any]:
    """Pod `name` created, filtered onto node-1 and bound there (the node is free)."""
    created = await s.h.create("pod", pending_pod(name, mem=5000, cores=10))
    assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
    assert await bind(s, created) == {"Error": ""}
    return created


async def waiting_on(s: Stack, count: int) -> None:
    """Until `count` binds wait for node-1's lock inside the extender."""
    gates = s.scheduler.extender.gates
    await wait_for(lambda: gates.waiting("node-1") == count)


async def test_a_bind_waits_for_the_lock_and_lands_once_it_is_released(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, one_node()) as s:
        a = await scheduled(s, "a")
        b = await s.h.create("pod", pending_pod("b", mem=5000, cores=10))
        # Only the locked node fits: kept, nothing refused, the GPUs reserved for b.
        result = await s.filter(b, ["node-1"])
        assert (result["NodeNames"], result["FailedNodes"]) == (["node-1"], {})
        assert (await s.reservation("ml", "b"))[keys.VGPU_NODE] == "node-1"

        binding = asyncio.create_task(bind(s, b))
        await waiting_on(s, 1)
        assert not binding.done()
        assert keys.BIND_PHASE not in await s.annotations("ml", "b")  # nothing written yet

        await admitted(s, a)
        assert await asyncio.wait_for(binding, 5.0) == {"Error": ""}
        current = await s.h.pod("ml", "b")
        assert current["spec"]["nodeName"] == "node-1"
        assert current["metadata"]["annotations"][keys.BIND_PHASE] == keys.PHASE_ALLOCATING
        assert s.scheduler.extender.gates.waiting("node-1") == 0


async def test_waiting_binds_take_turns_in_the_order_they_came(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, one_node()) as s:
        a = await scheduled(s, "a")
        waiting = []
        for name in ("b", "c"):
            created = await s.h.create("pod", pending_pod(name, mem=5000, cores=10))
            assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
            waiting.append((created, asyncio.create_task(bind(s, created))))
            await waiting_on(s, len(waiting))
        (b, b_bind), (_c, c_bind) = waiting

        await admitted(s, a)
        assert await asyncio.wait_for(b_bind, 5.0) == {"Error": ""}
        # b holds the lock now: c still waits, its reservation unwritten.
        await waiting_on(s, 1)
        assert not c_bind.done()
        assert keys.BIND_PHASE not in await s.annotations("ml", "c")

        await admitted(s, b)
        assert await asyncio.wait_for(c_bind, 5.0) == {"Error": ""}
        assert (await s.annotations("ml", "c"))[keys.BIND_PHASE] == keys.PHASE_ALLOCATING


async def test_a_lock_that_outlasts_the_bind_fails_it_and_keeps_the_reservation(
    nats_url: str, tmp_path: Path
) -> None:
    # A 1.5 s budget leaves 0.5 s for the wait (LOCK_WAIT_RESERVE keeps 1 s for the rest).
    async with stack(nats_url, tmp_path, one_node(), request_timeout=1.5) as s:
        a = await scheduled(s, "a")
        b = await s.h.create("pod", pending_pod("b", mem=5000, cores=10))
        assert (await s.filter(b, ["node-1"]))["NodeNames"] == ["node-1"]
        answer = await bind(s, b)
        assert "still allocating pod ml/a" in answer["Error"]
        assert "retried after kube-scheduler's backoff" in answer["Error"]
        assert await s.h.pod("ml", "b") and not (await s.h.pod("ml", "b"))["spec"].get("nodeName")
        assert (await s.reservation("ml", "b"))[keys.VGPU_NODE] == "node-1"  # still held

        # kube-scheduler's next attempt, after the lock's release: filter renews, bind lands.
        await admitted(s, a)
        again = await s.h.pod("ml", "b")
        assert (await s.filter(again, ["node-1"]))["NodeNames"] == ["node-1"]
        assert await bind(s, again) == {"Error": ""}


async def test_a_quota_refusal_is_answered_through_the_bind_and_clears_when_raised(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [*one_node(), ("quota", quota("ml", {"limits.nvidia.com/gpumem": "8000"}))]
    async with stack(nats_url, tmp_path, objects) as s:
        a = await scheduled(s, "a")  # 5000 of the 8000 MiB
        b = await s.h.create("pod", pending_pod("b", mem=5000, cores=10))
        result = await s.filter(b, ["node-1"])
        # Not refused at filter time (kube-scheduler would park it): a node is kept, nothing
        # is reserved, and the bind says why.
        assert (result["NodeNames"], result["FailedNodes"], result["Error"]) == (
            ["node-1"],
            {},
            "",
        )
        assert await s.reservation("ml", "b") == {}
        answer = await bind(s, b)
        assert answer["Error"].startswith("ResourceQuotaNotFit: pod ml/b does not fit")
        assert "retried with backoff" in answer["Error"]
        current = await s.h.pod("ml", "b")
        assert not current["spec"].get("nodeName")
        assert keys.BIND_PHASE not in (current["metadata"].get("annotations") or {})

        # The quota raised: the next attempt reserves and binds.
        assert s.h.kube is not None
        patch = {"spec": {"hard": {"limits.nvidia.com/gpumem": "20000"}}}
        response = await raw(
            s.h.kube.core.patch_namespaced_resource_quota(
                "gpu",
                "ml",
                patch,
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
                _preload_content=False,
            )
        )
        assert response.status == 200, orjson.loads(await response.read())

        async def placed() -> bool:
            again = await s.h.pod("ml", "b")
            return bool((await s.filter(again, ["node-1"]))["NodeNames"]) and bool(
                await s.reservation("ml", "b")
            )

        await wait_for(placed)  # accounting's quota watch sees the new limit
        await admitted(s, a)
        assert await bind(s, await s.h.pod("ml", "b")) == {"Error": ""}


async def test_a_pod_no_gpu_can_hold_is_still_refused_at_filter_time(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, one_node()) as s:
        big = await s.h.create("pod", pending_pod("big", mem=90000, cores=10))
        result = await s.filter(big, ["node-1"])
        assert result["NodeNames"] == []
        assert "CardInsufficientMemory" in result["FailedNodes"]["node-1"]


async def test_accounting_not_answering_is_answered_through_the_bind(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, one_node(), request_timeout=1.5) as s:
        pod_obj = await s.h.create("pod", pending_pod("p", mem=5000, cores=10))
        assert s.h.accounting is not None
        await s.h.wiring.stop(s.h.accounting)
        result = await s.filter(pod_obj, ["node-1"])
        assert (result["NodeNames"], result["Error"]) == (["node-1"], "")
        answer = await bind(s, pod_obj)
        assert "accounting unavailable" in answer["Error"] or "unanswered" in answer["Error"]
        assert not (await s.h.pod("ml", "p"))["spec"].get("nodeName")
