"""svc_refit and svc_accounting over a real nats-server and the Kubernetes API emulator."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from shared import subjects
from shared.core import keys
from shared.testing.kube_emulator import KubeEmulator
from tests.builders import container, gpu, node, pod, refit_request
from tests.integration.harness import Harness, harness, wait_for
from tests.metrics import refit_counter, reserved
from tests.raw_kube import raw

WORKED = Path(__file__).resolve().parents[2] / "shared" / "data" / "plan-worked-example.json"
"""HAMi's worked example: init `prep` (30000 MiB, 60 %) on GPU-b, app `main` (20000 MiB, 30 %)
on GPU-a; kubelet allows `main` only GPU-b."""
MOVED_PENDING = ";GPU-b,NVIDIA,20000,30:;"
"""`main`'s entry moved to GPU-b; `prep`'s empty entry (nothing pending) kept."""
MOVED_ALLOCATED = "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;"
"""`prep`'s entry byte for byte, `main`'s on GPU-b."""
MOVED_USAGE = {
    "GPU-a": {"used": 0, "usedmem": 0, "usedcores": 0},
    # prep runs to completion before main starts: one slot, the peak of the two phases.
    "GPU-b": {"used": 1, "usedmem": 30000, "usedcores": 60},
}


def for_create(obj: dict[str, Any]) -> dict[str, Any]:
    """What a client sends on create: no uid, no resourceVersion."""
    body = copy.deepcopy(obj)
    body["metadata"].pop("uid", None)
    body["metadata"].pop("resourceVersion", None)
    return body


def worked_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    example = json.loads(WORKED.read_text())
    return example["node"], example["pods"][0]


def request_for(
    created: dict[str, Any], index: int, allowed: list[str], **extra: Any
) -> dict[str, Any]:
    body = refit_request(created, index, allowed)
    body.update(extra)
    return body


async def pod_annotations(h: Harness, namespace: str, name: str) -> dict[str, str]:
    current = await h.pod(namespace, name)
    result: dict[str, str] = current["metadata"].get("annotations") or {}
    return result


async def test_refit_moves_the_reservation_byte_for_byte(nats_url: str, tmp_path: Path) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        created = await h.pod("ml", "train")
        usage_updates: list[dict[str, Any]] = []
        assert h.client_nc is not None
        got_update = asyncio.Event()

        async def on_usage(msg: Any) -> None:
            usage_updates.append(orjson.loads(msg.data))
            got_update.set()

        await h.client_nc.subscribe(subjects.usage("node-1"), cb=on_usage)
        await h.client_nc.flush()

        reply = await h.refit_request(request_for(created, 1, ["GPU-b"]))

        assert reply == {
            "succeeded": True,
            "code": "moved",
            "containerDevices": "GPU-b,NVIDIA,20000,30:",
        }
        after = await pod_annotations(h, "ml", "train")
        assert after[keys.TO_ALLOCATE] == MOVED_PENDING
        assert after[keys.ALLOCATED] == MOVED_ALLOCATED
        # Ledger, published usage and the core agree.
        snapshot = await h.client.snapshot("node-1")
        state = snapshot["nodes"][0]
        await asyncio.wait_for(got_update.wait(), 5)
        last = usage_updates[-1]
        assert last["revision"] == state["revision"]
        assert last["devices"] == MOVED_USAGE
        assert reserved(h.accounting, "node-1", MOVED_USAGE) == MOVED_USAGE
        # The event landed on the pod.
        assert h.kube is not None
        core = h.kube.core

        async def event_recorded() -> bool:
            response = await raw(core.list_namespaced_event("ml", _preload_content=False))
            items = orjson.loads(await response.read())["items"]
            return any(e["reason"] == "NumaRefitSucceed" for e in items)

        await wait_for(event_recorded)


async def test_already_aligned_changes_nothing(nats_url: str, tmp_path: Path) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        created = await h.pod("ml", "train")
        reply = await h.refit_request(request_for(created, 1, ["GPU-a", "GPU-b"]))
        assert reply["code"] == "already_aligned"
        assert await pod_annotations(h, "ml", "train") == created["metadata"]["annotations"]


def competing_objects() -> list[tuple[str, dict[str, Any]]]:
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0, mem=30000)])
    pods = [
        pod(
            name,
            containers=[container("app", 1, 20000)],
            namespace="ml",
            allocated="GPU-a,NVIDIA,20000,0:;",
            annotations={keys.BIND_PHASE: "allocating", keys.NUMA_ALIGNMENT: "strict"},
        )
        for name in ("first", "second")
    ]
    return [("node", nodes)] + [("pod", for_create(p)) for p in pods]


async def test_two_refits_compete_for_the_last_capacity(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, competing_objects()) as h:
        first, second = await h.pod("ml", "first"), await h.pod("ml", "second")
        replies = await asyncio.gather(
            h.refit_request(request_for(first, 0, ["GPU-b"])),
            h.refit_request(request_for(second, 0, ["GPU-b"])),
        )
        codes = sorted(r["code"] for r in replies)
        assert codes == ["moved", "no_fit"]
        loser = next(r for r in replies if r["code"] == "no_fit")
        assert loser["fitReasons"] == {"CardInsufficientMemory": 1}
        # GPU-b (30000 MiB) took one pod's 20000 MiB; the other stays on GPU-a.
        assert reserved(h.accounting, "node-1", ["GPU-a", "GPU-b"]) == {
            "GPU-a": {"used": 1, "usedmem": 20000, "usedcores": 0},
            "GPU-b": {"used": 1, "usedmem": 20000, "usedcores": 0},
        }


async def test_refit_racing_a_status_write_hits_409_and_loses_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        created = await h.pod("ml", "train")
        # Hold the move's PATCH long enough for kubelet-like status write to land first.
        h.emulator.faults.add(method="PATCH", path_regex=r"/pods/train$", delay_s=0.3, times=1)
        assert h.kube is not None
        refit = asyncio.create_task(h.refit_request(request_for(created, 1, ["GPU-b"])))
        await wait_for(lambda: not h.emulator.faults.rules())  # the delayed PATCH is in flight
        status = {"status": {"phase": "Pending", "message": "kubelet was here"}}
        await h.kube.core.patch_namespaced_pod_status(  # type: ignore[call-arg]
            "train",
            "ml",
            status,
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
        reply = await refit
        # First attempt: 409 -> accounting re-read the pod -> conflict -> refit recomputed.
        assert reply["code"] == "moved"
        assert h.refit is not None
        assert refit_counter(h.refit, "commit_attempts", result="conflict") == 1
        final = await h.pod("ml", "train")
        assert final["status"]["message"] == "kubelet was here"  # nothing lost
        assert final["metadata"]["annotations"][keys.TO_ALLOCATE] == ";GPU-b,NVIDIA,20000,30:;"
        # ... and Allocate can consume the refitted entry right after.
        consumed = await h.client.call(
            "consume", "node-1", {"podUID": created["metadata"]["uid"], "devices": ["GPU-b"]}
        )
        assert consumed["ok"] and not consumed["drifted"]
        assert (await pod_annotations(h, "ml", "train"))[keys.TO_ALLOCATE] == ";;"


async def test_accounting_restart_rebuilds_the_same_ledger(nats_url: str, tmp_path: Path) -> None:
    node_obj, pod_obj = worked_objects()
    objects = [("node", node_obj), ("pod", for_create(pod_obj)), *competing_objects()[1:]]
    async with harness(nats_url, tmp_path, objects) as h:
        created = await h.pod("ml", "train")
        assert (await h.refit_request(request_for(created, 1, ["GPU-b"])))["code"] == "moved"
        before = await h.client.snapshot(subjects.ALL_NODES)
        assert h.accounting is not None
        # train moved to GPU-b (prep's 30000 MiB, 60 % peak); first and second on GPU-a.
        usage = {
            "GPU-a": {"used": 2, "usedmem": 40000, "usedcores": 0},
            "GPU-b": {"used": 1, "usedmem": 30000, "usedcores": 60},
        }
        assert reserved(h.accounting, "node-1", usage) == usage
        await h.accounting.stop(1.0)
        restarted = await h.start_accounting()
        after = await h.client.snapshot(subjects.ALL_NODES)
        assert after["epoch"] == restarted.ledger.epoch != before["epoch"]

        def ledger(snapshot: dict[str, Any]) -> list[Any]:
            return [
                (
                    n["node"],
                    n["devices"],
                    sorted(
                        (
                            p["pod"]["metadata"]["uid"],
                            p["pod"]["metadata"]["annotations"].get(keys.ALLOCATED),
                            p["released"],
                        )
                        for p in n["pods"]
                    ),
                )
                for n in snapshot["nodes"]
            ]

        assert ledger(after) == ledger(before)
        assert reserved(restarted, "node-1", usage) == usage


@pytest.mark.parametrize(
    ("raw", "code", "fragment"),
    [
        (b"{not json", "invalid_request", "not valid JSON"),
        (b"[1, 2]", "invalid_request", "must be a JSON object"),
        (
            orjson.dumps({"podUID": 5}),
            "invalid_request",
            "Expected `str`, got `int` - at `$.podUID`",
        ),
        (
            orjson.dumps({"containerIndex": "1"}),
            "invalid_request",
            "Expected `int`, got `str` - at `$.containerIndex`",
        ),
        (orjson.dumps({"timeoutMs": -1}), "invalid_request", "timeoutMs"),
    ],
)
async def test_malformed_requests_get_invalid_request(
    nats_url: str, tmp_path: Path, raw: bytes, code: str, fragment: str
) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        reply = await h.refit_request(None, raw=raw)
        assert (
            reply["succeeded"] is False
            and reply["code"] == code
            and fragment in reply["failureReason"]
        )


async def test_bad_input_never_changes_state_and_the_service_keeps_serving(
    nats_url: str, tmp_path: Path
) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        created = await h.pod("ml", "train")
        before = await pod_annotations(h, "ml", "train")
        cases = [
            (request_for(created, -1, ["GPU-b"], containerName=""), "container_out_of_range"),
            (request_for(created, 2**62, ["GPU-b"], containerName=""), "container_out_of_range"),
            (request_for(created, 1, [f"GPU-{i}" for i in range(10_000)]), "invalid_request"),
            (request_for(created, 1, ["GPU-b"], podUID="no-such-pod"), "pod_not_tracked"),
            (request_for(created, 1, ["GPU-b"], podName="other"), "pod_mismatch"),
            (request_for(created, 1, ["GPU-b"], deviceType="MLU"), "unsupported_device_type"),
        ]
        for body, code in cases:
            reply = await h.refit_request(body)
            assert (reply["succeeded"], reply["code"]) == (False, code), body
        assert await pod_annotations(h, "ml", "train") == before
        # A request for another node's subject is refused before anything is looked up.
        assert (await h.refit_request(request_for(created, 1, ["GPU-b"]), node="node-2"))[
            "code"
        ] == "unauthorized"
        # ... and the service still serves.
        assert (await h.refit_request(request_for(created, 1, ["GPU-b"])))["code"] == "moved"
        assert h.refit is not None
        assert refit_counter(h.refit, "requests", code="invalid_request", mode="best-effort") >= 1


async def test_accounting_refuses_stale_revisions_and_bad_operations(
    nats_url: str, tmp_path: Path
) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        created = await h.pod("ml", "train")
        uid = created["metadata"]["uid"]
        snapshot = await h.client.snapshot("node-1")
        revision = snapshot["nodes"][0]["revision"]
        move = {
            "podUID": uid,
            "revision": revision - 1,
            "containerIndex": 1,
            "toAllocate": ";GPU-b,NVIDIA,20000,30:;",
            "allocated": "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;",
        }
        assert (await h.client.call("move", "node-1", move))["code"] == "conflict"
        # A move may only touch its own container's entry.
        sneaky = dict(
            move, revision=revision, allocated="GPU-a,NVIDIA,1,1:;GPU-b,NVIDIA,20000,30:;"
        )
        assert (await h.client.call("move", "node-1", sneaky))["code"] == "invalid_request"
        assert (await h.client.call("move", "node-1", {"podUID": uid}))["code"] == "invalid_request"
        # No budget left on arrival (deadlineMs 0): refused with an answer, nothing is written.
        # The caller waits long enough to hear it: only the request's own budget is spent.
        late = dict(move, revision=revision)
        assert (await h.client.call("move", "node-1", late, budget=2.0, margin=2.0))[
            "code"
        ] == "deadline_exceeded"
        assert await pod_annotations(h, "ml", "train") == created["metadata"]["annotations"]
        # A 500 from the API server is reported, the ledger unchanged.
        h.emulator.faults.add(method="PATCH", path_regex=r"/pods/train$", status=500, times=1)
        assert (await h.client.call("move", "node-1", dict(move, revision=revision)))[
            "code"
        ] == "api_error"
        again = await h.client.snapshot("node-1")
        assert again["nodes"][0]["revision"] == revision
        assert h.client_nc is not None
        reply = await h.client_nc.request(subjects.accounting("move", "node-1"), b"nope", timeout=2)
        assert orjson.loads(reply.data)["code"] == "invalid_request"


async def test_pending_and_consume_follow_what_kubelet_runs(nats_url: str, tmp_path: Path) -> None:
    objects = competing_objects()
    async with harness(nats_url, tmp_path, objects) as h:
        pending = await h.client.call("pending", "node-1", {})
        assert pending["pod"]["name"] in ("first", "second")
        assert pending["pod"]["entries"] == [
            {"index": 0, "containerName": "app", "devices": "GPU-a,NVIDIA,20000,0:"}
        ]
        assert pending["pod"]["numaAlignment"] == "strict"
        uid = pending["pod"]["uid"]
        # kubelet gave GPU-b instead (a fallback): the ledger follows what runs.
        consumed = await h.client.call("consume", "node-1", {"podUID": uid, "devices": ["GPU-b"]})
        assert consumed["ok"] and consumed["drifted"] and consumed["bindPhase"] == "success"
        name = pending["pod"]["name"]
        after = await pod_annotations(h, "ml", name)
        assert after[keys.ALLOCATED] == "GPU-b,NVIDIA,20000,0:;"
        assert after[keys.TO_ALLOCATE] == ";" and after[keys.BIND_PHASE] == "success"
        wrong_size = await h.client.call("consume", "node-1", {"devices": ["GPU-a", "GPU-b"]})
        assert wrong_size["code"] == "invalid_request"


async def test_register_writes_the_hami_annotation(nats_url: str, tmp_path: Path) -> None:
    bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu.node-7"}}
    async with harness(nats_url, tmp_path, [("node", bare)]) as h:
        devices = [gpu("GPU-x", 1, index=0)]
        reply = await h.client.call("register", "gpu.node-7", {"devices": devices})
        assert reply["ok"]
        assert h.kube is not None
        response = await raw(h.kube.core.read_node("gpu.node-7", _preload_content=False))
        stored = orjson.loads(await response.read())["metadata"]["annotations"][keys.NODE_REGISTER]
        assert json.loads(stored)[0]["id"] == "GPU-x"
        assert (await h.client.call("register", "gpu.node-7", {"devices": [{"id": 1}]}))[
            "code"
        ] == "invalid_request"


async def test_services_survive_a_nats_restart(tmp_path: Path) -> None:
    from shared.testing.nats_server import NatsServer

    server = NatsServer()
    url = server.start()
    try:
        node_obj, pod_obj = worked_objects()
        async with harness(url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
            created = await h.pod("ml", "train")
            client_nc, accounting, refit = h.client_nc, h.accounting, h.refit
            assert client_nc is not None and accounting is not None and refit is not None
            server.stop()
            await wait_for(lambda: not client_nc.is_connected)
            restarted = NatsServer(port=int(url.rsplit(":", 1)[1]))
            restarted.start()
            server = restarted
            await wait_for(lambda: client_nc.is_connected, within=15)
            await wait_for(lambda: accounting.nc.is_connected and refit.nc.is_connected, within=15)
            # Accounting republished every node for readers that missed updates meanwhile.
            await asyncio.wait_for(h.accounting_reconnected.wait(), 15)

            async def refit_works() -> bool:
                try:
                    reply = await h.refit_request(request_for(created, 1, ["GPU-b"]))
                except Exception:
                    return False
                return bool(reply["code"] == "moved")

            await wait_for(refit_works, within=15)
    finally:
        server.stop()


async def test_emulator_kubeconfig_works_for_cli_services(tmp_path: Path) -> None:
    # The services' own kubeconfig loading path (not only the test harness's).
    from shared.service.kube import api_client

    async with KubeEmulator() as emulator:
        path = emulator.write_kubeconfig(tmp_path / "kc")
        api = await api_client(str(path))
        try:
            from shared.service.kube_io import Kube

            items, rv = await Kube(api, "t").list_pods()
            assert items == [] and rv
        finally:
            await api.close()


async def test_refit_racing_a_consume_loses_cleanly(nats_url: str, tmp_path: Path) -> None:
    node_obj, pod_obj = worked_objects()
    async with harness(nats_url, tmp_path, [("node", node_obj), ("pod", for_create(pod_obj))]) as h:
        created = await h.pod("ml", "train")
        uid = created["metadata"]["uid"]
        # Allocate (kubelet kept GPU-a) is mid-write when the refit arrives.
        h.emulator.faults.add(method="PATCH", path_regex=r"/pods/train$", delay_s=0.3, times=1)
        consume = asyncio.create_task(
            h.client.call("consume", "node-1", {"podUID": uid, "devices": ["GPU-a"]})
        )
        await wait_for(lambda: not h.emulator.faults.rules())
        reply = await h.refit_request(request_for(created, 1, ["GPU-b"]))
        consumed = await consume
        assert consumed["ok"] and consumed["containerDevices"] == "GPU-a,NVIDIA,20000,30:"
        # The refit decided on the state before the consume, lost the revision race, recomputed
        # and found nothing left to move: no write of its own, nothing of the consume lost.
        assert reply["code"] == "nothing_pending"
        assert h.refit is not None
        assert refit_counter(h.refit, "commit_attempts", result="conflict") == 1
        final = await pod_annotations(h, "ml", "train")
        assert final[keys.TO_ALLOCATE] == ";;"
        assert final[keys.ALLOCATED] == created["metadata"]["annotations"][keys.ALLOCATED]


async def test_one_pod_allocates_per_node_at_a_time(nats_url: str, tmp_path: Path) -> None:
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0)])
    pods = [
        pod(
            n,
            containers=[container("app", 1, 1000)],
            namespace="ml",
            allocated="GPU-a,NVIDIA,1000,0:;",
        )
        for n in ("one", "two")
    ]
    async with harness(
        nats_url, tmp_path, [("node", nodes)] + [("pod", for_create(p)) for p in pods]
    ) as h:
        one, two = (
            (await h.pod("ml", "one"))["metadata"]["uid"],
            (await h.pod("ml", "two"))["metadata"]["uid"],
        )
        assert (
            await h.client.call("bind-phase", "node-1", {"podUID": one, "phase": "allocating"})
        )["ok"]
        busy = await h.client.call("bind-phase", "node-1", {"podUID": two, "phase": "allocating"})
        assert busy["code"] == "conflict" and "still allocating pod ml/one" in busy["error"]
        assert (await h.client.call("consume", "node-1", {"podUID": one, "devices": ["GPU-a"]}))[
            "ok"
        ]
        assert (
            await h.client.call("bind-phase", "node-1", {"podUID": two, "phase": "allocating"})
        )["ok"]


async def test_a_slow_write_on_one_node_does_not_hold_up_another(
    nats_url: str, tmp_path: Path
) -> None:
    objects: list[tuple[str, dict[str, Any]]] = []
    for name, uuid in (("node-1", "GPU-a"), ("node-2", "GPU-b")):
        objects.append(("node", node(name, [gpu(uuid, 0)])))
        objects.append(
            (
                "pod",
                for_create(
                    pod(
                        f"on-{name}",
                        containers=[container("app", 1, 1000)],
                        namespace="ml",
                        node_name=name,
                        allocated=f"{uuid},NVIDIA,1000,0:;",
                    )
                ),
            )
        )
    async with harness(nats_url, tmp_path, objects) as h:
        slow = (await h.pod("ml", "on-node-1"))["metadata"]["uid"]
        fast = (await h.pod("ml", "on-node-2"))["metadata"]["uid"]
        h.emulator.faults.add(method="PATCH", path_regex=r"/pods/on-node-1$", delay_s=1.0, times=1)
        first = asyncio.create_task(
            h.client.call("consume", "node-1", {"podUID": slow, "devices": ["GPU-a"]}, budget=5)
        )
        await wait_for(lambda: not h.emulator.faults.rules())  # the slow PATCH is in flight
        second = asyncio.create_task(
            h.client.call("consume", "node-2", {"podUID": fast, "devices": ["GPU-b"]}, budget=5)
        )
        done, _ = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {second}  # node-2's write did not wait behind node-1's
        assert (await second)["ok"] and (await first)["ok"]
