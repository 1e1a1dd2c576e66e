"""A filter writes nothing; the bind writes the reservation once, then the Binding.

kube-scheduler puts a pod that was updated while it was being scheduled straight back into its
active queue; a reserve that rewrote the pod on every filter therefore defeated its backoff (seen
on a real kube-scheduler: hundreds of "already present in the active queue"). Accounting holds a
filter's reservation in its ledger instead, publishes it to every reader, and writes it to the
pod at bind in one resourceVersion-guarded patch. One that is never bound expires.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from shared.core import keys
from shared.messages import SnapshotReply, SnapshotRequest
from tests.builders import gpu, node
from tests.integration.harness import wait_for
from tests.metrics import sample
from tests.scheduler.stack import Stack, pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path

RESERVATION = (
    keys.VGPU_NODE,
    keys.VGPU_TIME,
    keys.TO_ALLOCATE,
    keys.ALLOCATED,
    keys.BIND_PHASE,
    keys.BIND_TIME,
)


async def pod_usage(s: Stack, node_name: str) -> int:
    """Memory the scheduler's read model counts on the node (MiB)."""
    view = s.scheduler.read_model.view(node_name)
    assert view is not None and view.snapshot is not None
    return sum(d.usedmem for d in view.snapshot.devices)


async def test_a_filter_holds_the_reservation_without_writing_the_pod(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        version = created["metadata"]["resourceVersion"]
        first = await s.filter(created, ["node-1", "node-2"])
        assert first["NodeNames"] == ["node-1"]
        # Not written...
        after = await s.h.pod("ml", "train")
        assert after["metadata"]["resourceVersion"] == version
        assert not set(RESERVATION) & set(after["metadata"].get("annotations") or {})
        # ...but held, and counted by every reader at once.
        held = await s.reservation("ml", "train")
        assert held[keys.VGPU_NODE] == "node-1"
        assert held[keys.ALLOCATED] == "GPU-a,NVIDIA,20000,30:;"
        assert await pod_usage(s, "node-1") == 20000
        assert s.h.accounting is not None
        registry = s.h.accounting.metrics.registry
        assert sample(registry, "numafit_accounting_held_reservations") == 1

        # kube-scheduler retries the pod: the same decision publishes nothing new.
        revision = await s.revision("node-1")
        again = await s.filter(after, ["node-1", "node-2"])
        assert again["NodeNames"] == ["node-1"]
        assert await s.revision("node-1") == revision
        assert (await s.h.pod("ml", "train"))["metadata"]["resourceVersion"] == version


async def test_a_different_decision_moves_the_held_reservation(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes(small_mem=40000)) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
        # Only node-2 is a candidate now: the reservation moves; still nothing is written.
        assert (await s.filter(created, ["node-2"]))["NodeNames"] == ["node-2"]
        after = await s.h.pod("ml", "train")
        assert after["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        assert (await s.reservation("ml", "train"))[keys.VGPU_NODE] == "node-2"
        await wait_for(lambda: _usage_is(s, "node-1", 0), within=5)
        assert await pod_usage(s, "node-2") == 20000


def _usage_is(s: Stack, node_name: str, mib: int) -> bool:
    view = s.scheduler.read_model.view(node_name)
    return (
        view is not None
        and view.snapshot is not None
        and (sum(d.usedmem for d in view.snapshot.devices) == mib)
    )


async def test_the_bind_writes_the_whole_reservation_with_the_binding(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        before = int(created["metadata"]["resourceVersion"])
        await s.bind(created, "node-1")
        bound = await s.h.pod("ml", "train")
        annotations = bound["metadata"]["annotations"]
        # What the device plugin (ours or HAMi's) reads, exactly as a written reservation.
        assert annotations[keys.VGPU_NODE] == "node-1"
        assert annotations[keys.TO_ALLOCATE] == "GPU-a,NVIDIA,20000,30:;"
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,20000,30:;"
        assert annotations[keys.BIND_PHASE] == keys.PHASE_ALLOCATING
        assert annotations[keys.VGPU_TIME].isdigit() and annotations[keys.BIND_TIME].isdigit()
        assert bound["spec"]["nodeName"] == "node-1"
        # One write since the filter: the Binding, carrying the reservation, guarded by the
        # pod's resourceVersion (the emulator's resourceVersions count writes cluster-wide;
        # nothing else wrote meanwhile).
        assert int(bound["metadata"]["resourceVersion"]) - before == 1
        assert s.h.accounting is not None
        registry = s.h.accounting.metrics.registry
        assert sample(registry, "numafit_accounting_held_reservations") == 0
        # The steps of it, timed: one Binding and no patch, one bind-phase that waited for its
        # node once.
        writes = "numafit_accounting_api_write_duration_seconds_count"
        assert sample(registry, writes, kind="binding") == 1
        assert sample(registry, writes, kind="patch") == 0
        waits = "numafit_accounting_node_wait_duration_seconds_count"
        assert sample(registry, waits, op="bind-phase") == 1
        answered = "numafit_accounting_operation_duration_seconds_count"
        assert sample(registry, answered, op="bind-phase") == 1
        assert sample(registry, answered, op="reserve") >= 1


async def test_an_unbound_reservation_expires_and_its_bind_fails_cleanly(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [("node", node("node-1", [gpu("GPU-a", 0)]))]
    async with stack(nats_url, tmp_path, objects) as s:
        assert s.h.accounting is not None
        s.h.accounting.ops.reservation_ttl = 0.3
        created = await s.h.create("pod", pending_pod("train", mem=30000))
        assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
        assert await pod_usage(s, "node-1") == 30000
        # The bind never came: the GPU is free again, for readers too.
        await wait_for(lambda: _usage_is(s, "node-1", 0), within=5)
        assert await s.reservation("ml", "train") == {}
        registry = s.h.accounting.metrics.registry
        assert sample(registry, "numafit_accounting_reservations_expired_total") == 1
        # A late bind is refused with a clear reason and changes nothing.
        status, body = await bind_answer(s, created, "node-1")
        assert status == 200 and "pod_not_tracked" in body["Error"], body
        pod = await s.h.pod("ml", "train")
        assert not pod["spec"].get("nodeName")
        assert keys.VGPU_NODE not in (pod["metadata"].get("annotations") or {})
        # kube-scheduler schedules it again: a fresh reservation.
        assert (await s.filter(pod, ["node-1"]))["NodeNames"] == ["node-1"]
        await s.bind(pod, "node-1")


async def test_a_restart_forgets_held_reservations_and_the_bind_fails_cleanly(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        assert s.h.accounting is not None
        await s.h.accounting.stop(1.0)
        await s.h.start_accounting()
        reply = await s.h.client.ask(SnapshotRequest(node="node-1"), SnapshotReply)
        assert reply.nodes is not None and reply.nodes[0].pods == ()
        status, body = await bind_answer(s, created, "node-1")
        assert status == 200 and "pod_not_tracked" in body["Error"], body
        assert not (await s.h.pod("ml", "train"))["spec"].get("nodeName")


async def bind_answer(s: Stack, created: dict[str, Any], node_name: str) -> tuple[int, Any]:
    meta = created["metadata"]
    args = {"PodName": meta["name"], "PodNamespace": "ml", "PodUID": meta["uid"]}
    return await s.post("/bind", {**args, "Node": node_name})


async def test_a_binding_whose_answer_is_late_is_fenced_and_never_lands(
    nats_url: str, tmp_path: Path
) -> None:
    """Accounting's Binding (the reservation on it) is held at the API server past the write
    budget: its outcome is unknown, so accounting fences it at the resourceVersion it was
    guarded by before anything else happens on the node. The late Binding then fails its
    precondition: the pod is not bound behind everyone's back, the node is not left locked for
    it, and the next bind goes through."""
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        late = s.h.emulator.faults.add(
            method="POST",
            path_regex=r"/namespaces/ml/pods/train/binding$",
            delay_s=4.0,
            times=1,
            outlive_client=True,
        )
        meta = created["metadata"]
        args = {"PodName": "train", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "node-1"}
        status, body = await s.post("/bind", args)
        assert status == 200 and body["Error"], body
        assert late.hits == 1
        # The held Binding is served once its delay is over: it must not land.
        await wait_for(lambda: s.h.emulator.faults.in_flight == 0, within=10)
        current = await s.h.pod("ml", "train")
        assert not current["spec"].get("nodeName")
        assert keys.WRITE_FENCE in current["metadata"]["annotations"]
        assert keys.BIND_PHASE not in current["metadata"]["annotations"]
        # Still held (kube-scheduler binds again after its backoff), and that bind lands.
        assert (await s.reservation("ml", "train"))[keys.VGPU_NODE] == "node-1"
        await s.bind(created, "node-1")
        bound = await s.h.pod("ml", "train")
        assert bound["spec"]["nodeName"] == "node-1"
        assert bound["metadata"]["annotations"][keys.BIND_PHASE] == keys.PHASE_ALLOCATING


async def test_a_bind_locks_the_node_in_the_ledger_at_once(nats_url: str, tmp_path: Path) -> None:
    """The Binding's answer carries no pod: the ledger takes the written reservation from the
    write itself, so the node's lock holds for the next bind whether or not the watch has
    delivered the bound pod yet."""
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        first = await s.h.create("pod", pending_pod("first", mem=1000))
        second = await s.h.create("pod", pending_pod("second", mem=1000))
        for created in (first, second):
            assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
        await s.bind(first, "node-1")
        body = {"podUID": second["metadata"]["uid"], "phase": "allocating", "bind": True}
        busy = await s.h.client.call("bind-phase", "node-1", body)
        assert busy["code"] == "conflict" and "still allocating pod ml/first" in busy["error"]
        assert not (await s.h.pod("ml", "second"))["spec"].get("nodeName")


async def test_the_write_after_a_binding_waits_for_its_event_instead_of_conflicting(
    nats_url: str, tmp_path: Path
) -> None:
    """The Binding's answer carries no resourceVersion, so the ledger holds the pod at the
    Binding's guard until the watch shows the written pod. Allocate's consume arriving before
    that event waits for it (briefly) and is guarded by the new version: one PATCH, not a
    PATCH refused with 409, a re-read and a second PATCH."""
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        accounting = s.h.accounting
        assert accounting is not None
        created = await s.h.create("pod", pending_pod("train"))
        uid = created["metadata"]["uid"]
        assert (await s.filter(created, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        ledger = accounting.ledger
        observe = ledger.observe
        held_back: list[Any] = []

        def slow_watch(pod: Any) -> set[str]:
            if pod.uid == uid and pod.node_name:
                held_back.append(pod)  # the watch lags behind the Binding's answer
                return set()
            return observe(pod)

        ledger.observe = slow_watch  # type: ignore[method-assign]
        # The wait under test (a quarter of the write's budget at most) outlasts a slow
        # machine's steps below.
        accounting.ops.writes.seen_wait, accounting.ops.writes.write_timeout = 30.0, 120.0
        patches: list[str] = []
        s.h.emulator.faults.on_write.append(
            lambda method, path, _: patches.append(path) if method == "PATCH" else None
        )
        await s.bind(created, "node-1")
        await wait_for(lambda: bool(held_back), within=5)  # the Binding's event, held back
        assert ledger.unseen.get(uid) is not None
        consume = asyncio.ensure_future(
            s.h.client.call("consume", "node-1", {"podUID": uid, "devices": ["GPU-a"]}, budget=60)
        )
        # The consume either waits for that event, or (were it guarded by the version before)
        # has been sent and refused.
        await wait_for(lambda: uid in accounting.ops.writes._seen or bool(patches), within=5)
        ledger.observe = observe  # type: ignore[method-assign]
        for pod in held_back:
            observe(pod)
        reply = await consume
        assert reply["ok"], reply
        assert [p for p in patches if p.endswith("/pods/train")] == [
            "/api/v1/namespaces/ml/pods/train"
        ]
        assert uid not in ledger.unseen


async def test_a_reserve_is_served_beside_another_pods_binding_on_the_node(
    nats_url: str, tmp_path: Path
) -> None:
    """A reserve writes nothing: it decides on the node's free capacity, which a bind's
    Binding does not change (the hold it writes is counted already). So the next pod's filter
    is not held up by the previous pod's Binding on the same node (kube-scheduler filters one
    pod at a time: every wait there is every pod's)."""
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        first = await s.h.create("pod", pending_pod("first", mem=1000))
        second = await s.h.create("pod", pending_pod("second", mem=1000))
        assert (await s.filter(first, ["node-1"]))["NodeNames"] == ["node-1"]
        slow = s.h.emulator.faults.add(
            method="POST", path_regex=r"/namespaces/ml/pods/first/binding$", delay_s=1.5, times=1
        )
        bind = asyncio.ensure_future(s.bind(first, "node-1"))
        await wait_for(lambda: s.h.emulator.faults.in_flight == 1, within=5)
        assert (await s.filter(second, ["node-1"]))["NodeNames"] == ["node-1"]
        assert s.h.emulator.faults.in_flight == 1  # the first pod's Binding is still under way
        assert (await s.reservation("ml", "second"))[keys.VGPU_NODE] == "node-1"
        await bind
        assert slow.hits == 1
        bound = await s.h.pod("ml", "first")
        assert bound["spec"]["nodeName"] == "node-1"
        assert await pod_usage(s, "node-1") == 2000
