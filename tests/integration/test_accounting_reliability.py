"""svc_accounting as the single writer under pressure: it re-checks every commit's fit, accepts
stale-revision moves whose pod is unchanged, survives 409s on consume and bind-phase, keeps its
watches alive through 410s and failing relists, never creates state for made-up nodes, drops
deleted nodes everywhere, watches ResourceQuotas, and keeps its replies and logs bounded.

Everything runs against the Kubernetes API emulator and a real nats-server; faults are injected
with the emulator's fault rules."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from prometheus_client import generate_latest

from shared import subjects
from shared.core import keys
from shared.core.partitions import SLOTS, slot_of
from tests.builders import container, gpu, node, pod, quota
from tests.integration.harness import Harness, harness, wait_for
from tests.integration.test_refit_over_nats import for_create
from tests.raw_kube import raw

if TYPE_CHECKING:
    from pathlib import Path

RESULTS = (
    "ok",
    "invalid_request",
    "unauthorized",
    "node_unavailable",
    "pod_not_tracked",
    "pod_mismatch",
    "node_mismatch",
    "container_out_of_range",
    "annotation_invalid",
    "nothing_pending",
    "no_fit",
    "quota_exceeded",
    "conflict",
    "deadline_exceeded",
    "api_error",
)
"""Every result an accounting operation can answer with (the reply codes accounting uses)."""


def objects(*pods: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    gpus = [gpu("GPU-a", 1), gpu("GPU-b", 0)]  # 40000 MiB, 100 cores, 10 slots each
    return [("node", node("node-1", gpus))] + [("pod", for_create(p)) for p in pods]


def placed(name: str, allocated: str, **kw: Any) -> dict[str, Any]:
    mem = int(allocated.split(",")[2])
    return pod(
        name,
        containers=[container("app", 1, mem)],
        namespace="ml",
        allocated=allocated,
        **kw,
    )


async def uid_rv(h: Harness, name: str) -> tuple[str, str]:
    meta = (await h.pod("ml", name))["metadata"]
    return meta["uid"], meta["resourceVersion"]


async def revision(h: Harness, node_name: str = "node-1") -> int:
    state = (await h.client.snapshot(node_name))["nodes"][0]
    value: int = state["revision"]
    return value


async def pod_annotations(h: Harness, namespace: str, name: str) -> dict[str, str]:
    result: dict[str, str] = (await h.pod(namespace, name))["metadata"].get("annotations") or {}
    return result


def metrics_text(h: Harness) -> str:
    assert h.accounting is not None
    return generate_latest(h.accounting.metrics.registry).decode()


# --- 1. the fit is re-checked on every move and reserve ---------------------------------------


async def test_a_direct_move_that_over_commits_is_refused_with_no_fit(
    nats_url: str, tmp_path: Path
) -> None:
    holder = placed("holder", "GPU-b,NVIDIA,20000,0:;")
    big = placed("big", "GPU-a,NVIDIA,22000,0:;")
    exact = placed("exact", "GPU-a,NVIDIA,20000,0:;")
    async with harness(nats_url, tmp_path, objects(holder, big, exact), with_refit=False) as h:
        big_uid, _ = await uid_rv(h, "big")
        before = await pod_annotations(h, "ml", "big")
        entry = "GPU-b,NVIDIA,22000,0:;"
        move = {
            "podUID": big_uid,
            "revision": await revision(h),
            "containerIndex": 0,
            "toAllocate": entry,
            "allocated": entry,
        }
        # At the current revision, from whoever: GPU-b would hold 42000 of 40000 MiB.
        reply = await h.client.call("move", "node-1", move)
        assert reply["code"] == "no_fit" and not reply["ok"]
        assert reply["fitReasons"] == {"CardInsufficientMemory": 1}
        assert "CardInsufficientMemory" in reply["error"]
        assert await pod_annotations(h, "ml", "big") == before

        # A move that fits exactly (40000 of 40000) is fine, and names the pod's new version.
        exact_uid, _ = await uid_rv(h, "exact")
        fits = "GPU-b,NVIDIA,20000,0:;"
        reply = await h.client.call(
            "move",
            "node-1",
            dict(
                move, podUID=exact_uid, revision=await revision(h), toAllocate=fits, allocated=fits
            ),
        )
        assert reply["ok"], reply
        assert reply["podResourceVersion"] == (await uid_rv(h, "exact"))[1]
        assert (await pod_annotations(h, "ml", "exact"))[keys.ALLOCATED] == fits


async def test_a_direct_reserve_that_over_commits_is_refused_with_no_fit(
    nats_url: str, tmp_path: Path
) -> None:
    holder = placed("holder", "GPU-b,NVIDIA,20000,60:;")
    fresh = pod("fresh", containers=[container("app", 1, 20000)], namespace="ml", node_name="")
    async with harness(nats_url, tmp_path, objects(holder, fresh), with_refit=False) as h:
        uid, _ = await uid_rv(h, "fresh")
        body = {"podUID": uid, "podNamespace": "ml", "podName": "fresh"}
        over = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,50:;"),
        )
        assert over["code"] == "no_fit"
        assert over["fitReasons"] == {"CardInsufficientCore": 1}
        assert keys.ALLOCATED not in await pod_annotations(h, "ml", "fresh")
        ok = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,40:;"),
        )
        assert ok["ok"], ok
        assert ok["podResourceVersion"] == (await uid_rv(h, "fresh"))[1]


# --- 2. a stale revision is fine when the pod itself did not change ---------------------------


async def test_stale_revision_moves_of_an_unchanged_pod_are_judged_on_the_current_ledger(
    nats_url: str, tmp_path: Path
) -> None:
    target = placed("target", "GPU-a,NVIDIA,20000,0:;")
    bystander = placed("bystander", "GPU-a,NVIDIA,1000,0:;")
    async with harness(nats_url, tmp_path, objects(target, bystander), with_refit=False) as h:
        target_uid, target_rv = await uid_rv(h, "target")
        bystander_uid, _ = await uid_rv(h, "bystander")
        seen = await revision(h)
        # Another pod's change moves the node on: the decision below was made before it.
        consumed = await h.client.call(
            "consume", "node-1", {"podUID": bystander_uid, "devices": ["GPU-a"]}
        )
        assert consumed["ok"]
        assert await revision(h) > seen

        entry = "GPU-b,NVIDIA,20000,0:;"
        move = {
            "podUID": target_uid,
            "revision": seen,
            "containerIndex": 0,
            "toAllocate": entry,
            "allocated": entry,
        }
        # Without the pod's version, a stale revision is a conflict, as before; with a version
        # the pod no longer has, too.
        assert (await h.client.call("move", "node-1", move))["code"] == "conflict"
        wrong = await h.client.call("move", "node-1", dict(move, podResourceVersion="1"))
        assert wrong["code"] == "conflict"
        # The pod itself has not changed since the decision: the fit on the current ledger
        # decides, and the move lands.
        reply = await h.client.call("move", "node-1", dict(move, podResourceVersion=target_rv))
        assert reply["ok"], reply
        _, now = await uid_rv(h, "target")
        assert reply["podResourceVersion"] == now != target_rv
        assert (await pod_annotations(h, "ml", "target"))[keys.TO_ALLOCATE] == entry
        # The same decision again: the pod changed since (its own move), so: conflict.
        again = await h.client.call("move", "node-1", dict(move, podResourceVersion=target_rv))
        assert again["code"] == "conflict"


async def test_a_stale_move_that_no_longer_fits_is_no_fit(nats_url: str, tmp_path: Path) -> None:
    one = placed("one", "GPU-a,NVIDIA,25000,0:;")
    two = placed("two", "GPU-a,NVIDIA,25000,0:;")
    async with harness(nats_url, tmp_path, objects(one, two), with_refit=False) as h:
        seen = await revision(h)
        entry = "GPU-b,NVIDIA,25000,0:;"
        replies = []
        for name in ("one", "two"):
            uid, rv = await uid_rv(h, name)
            move = {
                "podUID": uid,
                "revision": seen,
                "podResourceVersion": rv,
                "containerIndex": 0,
                "toAllocate": entry,
                "allocated": entry,
            }
            replies.append(await h.client.call("move", "node-1", move))
        assert replies[0]["ok"], replies[0]
        assert replies[1]["code"] == "no_fit"
        assert replies[1]["fitReasons"] == {"CardInsufficientMemory": 1}


async def test_a_move_whose_deadline_cannot_cover_the_write_writes_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    target = placed("target", "GPU-a,NVIDIA,20000,0:;")
    async with harness(nats_url, tmp_path, objects(target), with_refit=False) as h:
        uid, rv = await uid_rv(h, "target")
        entry = "GPU-b,NVIDIA,20000,0:;"
        move = {
            "podUID": uid,
            "revision": await revision(h),
            "podResourceVersion": rv,
            "containerIndex": 0,
            "toAllocate": entry,
            "allocated": entry,
            "node": "node-1",
            "deadlineMs": 5,
        }
        assert h.client_nc is not None
        msg = await h.client_nc.request(
            subjects.accounting("move", "node-1"), orjson.dumps(move), timeout=2
        )
        assert orjson.loads(msg.data)["code"] == "deadline_exceeded"
        assert (await uid_rv(h, "target"))[1] == rv


# --- 3. consume and bind-phase survive a stale resourceVersion --------------------------------


async def test_consume_re_applies_after_a_409_when_its_entry_is_unchanged(
    nats_url: str, tmp_path: Path
) -> None:
    job = placed("job", "GPU-a,NVIDIA,1000,0:;", annotations={keys.BIND_PHASE: "allocating"})
    async with harness(nats_url, tmp_path, objects(job), with_refit=False) as h:
        uid, _ = await uid_rv(h, "job")
        rule = h.emulator.faults.add(method="PATCH", path_regex=r"/pods/job$", status=409, times=1)
        reply = await h.client.call("consume", "node-1", {"podUID": uid, "devices": ["GPU-a"]})
        assert reply["ok"], reply
        assert rule.hits == 1  # the first PATCH did get the 409
        after = await pod_annotations(h, "ml", "job")
        assert after[keys.TO_ALLOCATE] == ";" and after[keys.BIND_PHASE] == "success"


async def test_consume_refuses_when_the_entry_changed_under_it(
    nats_url: str, tmp_path: Path
) -> None:
    job = placed("job", "GPU-a,NVIDIA,1000,0:;", annotations={keys.BIND_PHASE: "allocating"})
    async with harness(nats_url, tmp_path, objects(job), with_refit=False) as h:
        uid, _ = await uid_rv(h, "job")
        h.emulator.faults.add(
            method="PATCH", path_regex=r"/pods/job$", delay_s=0.3, status=409, times=1
        )
        consume = asyncio.create_task(
            h.client.call("consume", "node-1", {"podUID": uid, "devices": ["GPU-a"]})
        )
        await wait_for(lambda: not h.emulator.faults.rules())  # the faulted PATCH is in flight
        assert h.kube is not None
        # Meanwhile the entry moved to GPU-b (as a refit would have done).
        moved = "GPU-b,NVIDIA,1000,0:;"
        await h.kube.patch_pod_annotations(
            "ml", "job", {keys.TO_ALLOCATE: moved, keys.ALLOCATED: moved}, ""
        )
        reply = await consume
        assert reply["code"] == "conflict"
        assert (await pod_annotations(h, "ml", "job"))[keys.TO_ALLOCATE] == moved


async def test_bind_phase_re_applies_after_a_409(nats_url: str, tmp_path: Path) -> None:
    job = placed("job", "GPU-a,NVIDIA,1000,0:;")
    async with harness(nats_url, tmp_path, objects(job), with_refit=False) as h:
        uid, _ = await uid_rv(h, "job")
        rule = h.emulator.faults.add(method="PATCH", path_regex=r"/pods/job$", status=409, times=1)
        reply = await h.client.call("bind-phase", "node-1", {"podUID": uid, "phase": "allocating"})
        assert reply["ok"], reply
        assert rule.hits == 1
        assert reply["podResourceVersion"] == (await uid_rv(h, "job"))[1]
        assert (await pod_annotations(h, "ml", "job"))[keys.BIND_PHASE] == "allocating"


# --- 4. the watches never die silently --------------------------------------------------------


@pytest.mark.parametrize("kind", ["pods", "nodes"])
async def test_a_410_then_a_failing_relist_does_not_freeze_the_ledger(
    nats_url: str, tmp_path: Path, kind: str
) -> None:
    job = placed("job", "GPU-a,NVIDIA,1000,0:;")
    async with harness(nats_url, tmp_path, objects(job), with_refit=False) as h:
        assert h.accounting is not None and h.kube is not None
        accounting = h.accounting
        failing = h.emulator.faults.add(
            method="GET", path_regex=rf"^/api/v1/{kind}", watch=False, status=500, times=1
        )
        # The live watch (once it is registered) ends with 410 Gone.
        await wait_for(lambda: h.emulator.expire_watches(kind) >= 1)
        await wait_for(lambda: failing.hits == 1)  # ... and the relist got a 500
        if kind == "pods":
            await h.create("pod", for_create(placed("later", "GPU-b,NVIDIA,3000,0:;")))

            def reached() -> bool:
                usage = accounting.ledger.node("node-1").usage_table()
                return usage.get("GPU-b", {}).get("usedmem") == 3000

        else:
            await h.kube.patch_node_annotations("node-1", {keys.DEVICE_CORDON: "GPU-b"})

            def reached() -> bool:
                return accounting.ledger.node("node-1").cordoned == frozenset({"GPU-b"})

        await wait_for(reached)
        assert accounting.readiness.ready


async def test_an_ended_watch_fails_readiness_for_good(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, objects(), with_refit=False) as h:
        assert h.accounting is not None
        (watch,) = [t for t in asyncio.all_tasks() if t.get_name() == "watch-pods"]
        assert h.accounting.readiness.ready
        watch.cancel()
        await wait_for(lambda: h.accounting.readiness.failure is not None)  # type: ignore[union-attr]
        assert not h.accounting.readiness.ready
        assert h.accounting.readiness.failed.is_set()
        assert "watch-pods" in (h.accounting.readiness.failure or "")


# --- 5. unknown and deleted nodes -------------------------------------------------------------


async def test_requests_for_unknown_nodes_create_nothing(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, objects(), with_refit=False) as h:
        assert h.accounting is not None
        ledger, ops = h.accounting.ledger, h.accounting.ops
        nodes_before = set(ledger.nodes)
        for i in range(50):
            reply = await h.client.call("pending", f"made-up-{i}", {})
            assert reply["ok"] and reply["pod"] is None
        snapshot = await h.client.snapshot("made-up-x")
        assert snapshot["ok"] and snapshot["nodes"] == []
        writes: dict[str, dict[str, Any]] = {
            "bind-phase": {"podUID": "u", "phase": "allocating"},
            "move": {"podUID": "u", "revision": 0, "containerIndex": 0},
            "consume": {"devices": ["GPU-a"]},
            "reserve": {"podUID": "u", "podNamespace": "ml", "podName": "p", "revision": 0},
        }
        for op, body in writes.items():
            reply = await h.client.call(op, "made-up-x", body)
            assert reply["code"] == "node_unavailable", (op, reply)
        assert set(ledger.nodes) == nodes_before == {"node-1"}
        assert not [n for n in ops.locks if n.startswith("made-up")]
        assert "made-up" not in metrics_text(h)


async def test_bad_names_and_tokens_are_invalid_requests(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, objects(), with_refit=False) as h:
        assert h.client_nc is not None and h.accounting is not None

        async def raw(subject: str, body: Any) -> dict[str, Any]:
            msg = await h.client_nc.request(subject, orjson.dumps(body), timeout=2)  # type: ignore[union-attr]
            reply: dict[str, Any] = orjson.loads(msg.data)
            return reply

        at = subjects.accounting_token
        cases = [
            (at("pending", "bad"), {"node": "Bad Node!"}, "node"),
            (at("pending", "BAD"), {"node": "bad"}, "subject token"),
            (at("consume", "x"), {"node": 5}, "node must be a string"),
            # The typed decode names the first field it cannot read, and the type it expected.
            (at("move", "node-1"), {"node": "node-1", "revision": "3"}, "`int`, got `str`"),
            (at("move", "node-1"), {"node": "node-1", "revision": 3}, "field `podUID`"),
            (at("reserve", "_all"), {}, "one node"),
            # A slot that is not the node's (built by hand) reaches no owner of the node.
            (
                f"{subjects.ACCOUNTING_PREFIX}.pending.{(slot_of('node-1') + 1) % SLOTS}.node-1",
                {"node": "node-1"},
                "not the node's",
            ),
            (
                at("move", "node-1"),
                {"node": "node-1", "podUID": "u", "revision": 0, "podResourceVersion": 5},
                "`str | null`, got `int` - at `$.podResourceVersion`",
            ),
        ]
        for subject, body, fragment in cases:
            reply = await raw(subject, body)
            assert reply["code"] == "invalid_request", (subject, reply)
            assert fragment in reply["error"], (subject, reply)
        assert set(h.accounting.ledger.nodes) == {"node-1"}
        assert not [n for n in h.accounting.ops.locks if n != "node-1"]


async def test_a_deleted_node_is_dropped_everywhere(nats_url: str, tmp_path: Path) -> None:
    objs = objects(placed("kept", "GPU-a,NVIDIA,1000,0:;"))
    objs.append(("node", node("node-2", [gpu("GPU-z", 0)])))
    objs.append(("pod", for_create(placed("gone", "GPU-z,NVIDIA,2000,0:;", node_name="node-2"))))
    async with harness(nats_url, tmp_path, objs, with_refit=False) as h:
        assert h.accounting is not None and h.client_nc is not None and h.kube is not None
        accounting = h.accounting
        assert 'node="node-2"' in metrics_text(h)
        updates: list[dict[str, Any]] = []
        sub = await h.client_nc.subscribe(subjects.usage("node-2"))
        await h.client_nc.flush()
        gone_uid, _ = await uid_rv(h, "gone")
        bound = await h.client.call("bind-phase", "node-2", {"podUID": gone_uid, "phase": "failed"})
        assert bound["ok"], bound  # a write on node-2 went through its lock

        response = await raw(h.kube.core.delete_node("node-2", _preload_content=False))
        response.release()
        async with asyncio.timeout(5):
            while not updates or not updates[-1].get("deleted"):
                updates.append(orjson.loads((await sub.next_msg(timeout=5)).data))
        last = updates[-1]
        assert last["deleted"] is True and last["devices"] == {}
        assert last["node"] == "node-2" and last["epoch"] == accounting.ledger.epoch_of("node-2")

        assert "node-2" not in accounting.ledger.nodes
        assert "node-2" not in accounting.ops.locks
        text = metrics_text(h)
        assert 'node="node-2"' not in text and 'uuid="GPU-z"' not in text
        assert 'numafit_accounting_ledger_revision{node="node-1"}' in text
        everything = await h.client.snapshot(subjects.ALL_NODES)
        assert [n["node"] for n in everything["nodes"]] == ["node-1"]
        assert (await h.client.call("pending", "node-2", {}))["pod"] is None
        # The quota usage of the pod that ran there is released with it.
        assert accounting.ledger.quota.used["ml"].mem == 1000


# --- 6. resource quotas are watched -----------------------------------------------------------


async def test_a_new_quota_holds_the_next_reservation_at_once(
    nats_url: str, tmp_path: Path
) -> None:
    fresh = pod("fresh", containers=[container("app", 1, 20000)], namespace="ml", node_name="")
    async with harness(nats_url, tmp_path, objects(fresh), with_refit=False) as h:
        assert h.accounting is not None
        accounting = h.accounting
        await h.create("quota", quota("ml", {"limits.nvidia.com/gpumem": "10000"}))
        await wait_for(lambda: "ml" in accounting.ledger.quota.limits, within=5)
        uid, _ = await uid_rv(h, "fresh")
        body = {"podUID": uid, "podNamespace": "ml", "podName": "fresh"}
        reply = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,0:;"),
        )
        assert reply["code"] == "quota_exceeded"
        assert reply["fitReasons"] == {"ResourceQuotaNotFit": 1}

        # The quota watch relists after a 410 and keeps following.
        await wait_for(lambda: h.emulator.expire_watches("resourcequotas") >= 1)
        assert h.kube is not None
        response = await raw(
            h.kube.core.delete_namespaced_resource_quota("gpu", "ml", _preload_content=False)
        )
        response.release()
        await wait_for(lambda: "ml" not in accounting.ledger.quota.limits, within=5)
        ok = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,0:;"),
        )
        assert ok["ok"], ok


# --- 7. metrics, bounded replies and logs, the drift event ------------------------------------


async def test_commit_counters_start_at_zero_for_every_op_and_result(
    nats_url: str, tmp_path: Path
) -> None:
    async with harness(nats_url, tmp_path, objects(), with_refit=False) as h:
        text = metrics_text(h)
        for op in subjects.ACCOUNTING_OPS:
            for result in RESULTS:
                line = f'numafit_accounting_commits_total{{op="{op}",result="{result}"}} 0.0'
                assert line in text, line


async def test_unbounded_input_is_never_echoed_unbounded(
    nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = placed("target", "GPU-a,NVIDIA,1000,0:;")
    async with harness(nats_url, tmp_path, objects(target), with_refit=False) as h:
        caplog.set_level(logging.INFO, logger="numafit.accounting")
        huge = "x" * 100_000
        bodies: list[tuple[str, dict[str, Any]]] = [
            ("move", {"podUID": huge, "revision": 0, "containerIndex": 0}),
            ("bind-phase", {"podUID": huge, "phase": "allocating"}),
            (
                "reserve",
                {
                    "podUID": huge,
                    "podNamespace": "ml",
                    "podName": "target",
                    "revision": await revision(h),
                    "allocated": f"GPU-{huge},NVIDIA,1,0:;",
                },
            ),
            (
                "reserve",
                {
                    "podUID": huge,
                    "podNamespace": "ml",
                    "podName": "target",
                    "revision": await revision(h),
                    "allocated": f"GPU-a,NVIDIA,{huge},0:;",
                },
            ),
        ]
        for op, body in bodies:
            reply = await h.client.call(op, "node-1", body)
            assert not reply["ok"]
            assert len(reply["error"]) <= 300, (op, len(reply["error"]))
        assert h.client_nc is not None
        long_token = "a" * 200
        msg = await h.client_nc.request(
            subjects.accounting_token("pending", long_token),
            orjson.dumps({"node": "b" * 200 + huge}),
            timeout=2,
        )
        assert len(orjson.loads(msg.data)["error"]) <= 300
        refused = [r for r in caplog.records if r.getMessage() == "accounting refused"]
        assert len(refused) == len(bodies) + 1
        for record in refused:
            assert len(str(record.__dict__)) < 3000


async def test_the_drift_event_is_bounded_and_never_outlives_shutdown(
    nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = placed("job", "GPU-a,NVIDIA,1000,0:;", annotations={keys.BIND_PHASE: "allocating"})
    async with harness(nats_url, tmp_path, objects(job), with_refit=False) as h:
        assert h.accounting is not None
        caplog.set_level(logging.WARNING, logger="numafit.accounting")
        h.emulator.faults.add(method="POST", path_regex=r"/events$", delay_s=30, times=1)
        uid, _ = await uid_rv(h, "job")
        reply = await h.client.call("consume", "node-1", {"podUID": uid, "devices": ["GPU-b"]})
        assert reply["ok"] and reply["drifted"]

        def abandoned() -> bool:
            return any(r.getMessage() == "event not recorded" for r in caplog.records)

        await wait_for(abandoned, within=4.0)  # bounded at 2 s, not 5 (nor 30)
        # A second drift's event is in flight when the service stops: it does not outlive it.
        h.emulator.faults.add(method="POST", path_regex=r"/events$", delay_s=30, times=1)
        await h.create(
            "pod",
            for_create(
                placed("job2", "GPU-a,NVIDIA,1000,0:;", annotations={keys.BIND_PHASE: "allocating"})
            ),
        )
        uid2, _ = await uid_rv(h, "job2")

        async def tracked() -> bool:
            return h.accounting is not None and h.accounting.ledger.tracked(uid2) is not None

        await wait_for(tracked)
        reply = await h.client.call("consume", "node-1", {"podUID": uid2, "devices": ["GPU-b"]})
        assert reply["ok"] and reply["drifted"]
        assert [t for t in asyncio.all_tasks() if t.get_name() == "drift-event"]
        await h.accounting.stop(0.1)
        h.accounting = None  # stopped already
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "drift-event"]
