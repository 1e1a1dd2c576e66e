"""svc_scheduler's extender over real HTTP, with real svc_accounting, nats-server and the API
emulator: filter in both nodeCacheCapable forms, prioritize, reserve (and its conflict path),
bind."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shared.core import keys
from shared.messages import ReserveReply, ReserveRequest, SnapshotReply, SnapshotRequest
from tests.builders import gpu, node
from tests.integration.harness import wait_for
from tests.raw_kube import raw
from tests.scheduler.stack import Stack, pending_pod, reserved_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path

    from svc_scheduler.read_model import ReadModel


def counter(s: Stack, name: str, **labels: str) -> float:
    value = s.scheduler.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_filter_cache_mode_reserves_and_explains_refused_nodes(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        result = await s.filter(created, ["node-1", "node-2"])
        assert result == {
            "Nodes": None,
            "NodeNames": ["node-1"],
            "FailedNodes": {"node-2": "1/1 CardInsufficientMemory"},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        # Accounting holds the reservation (published to every reader); the pod itself is
        # not written until bind.
        assert keys.VGPU_NODE not in await s.annotations("ml", "train")
        annotations = await s.reservation("ml", "train")
        assert annotations[keys.VGPU_NODE] == "node-1"
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,20000,30:;"
        assert annotations[keys.TO_ALLOCATE] == "GPU-a,NVIDIA,20000,30:;"
        assert annotations[keys.VGPU_TIME].isdigit()
        assert counter(s, "numafit_scheduler_filter_total", result="fit") == 1
        assert counter(s, "numafit_scheduler_filter_duration_seconds_count") == 1


async def test_filter_non_cache_mode_answers_with_node_objects(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert s.h.kube is not None
        core = s.h.kube.core
        nodes = [await raw(core.read_node(n, _preload_content=False)) for n in ("node-1", "node-2")]
        items = [await r.json() for r in nodes]
        status, result = await s.post(
            "/filter", {"Pod": created, "Nodes": {"kind": "NodeList", "items": items}}
        )
        assert status == 200
        assert result["NodeNames"] is None
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["node-1"]
        assert result["Nodes"]["items"][0] == items[0]
        assert result["FailedNodes"] == {"node-2": "1/1 CardInsufficientMemory"}
        assert result["Error"] == ""


async def test_filter_when_no_node_fits_lists_every_reason(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("huge", mem=50000))
        result = await s.filter(created, ["node-1", "node-2", "no-gpus"])
        assert result["NodeNames"] == []
        assert result["FailedNodes"] == {
            "node-1": "1/1 CardInsufficientMemory",
            "node-2": "1/1 CardInsufficientMemory",
            "no-gpus": "node unregistered",
        }
        assert result["Error"] == ""
        assert keys.VGPU_NODE not in await s.reservation("ml", "huge")
        assert counter(s, "numafit_scheduler_filter_total", result="no_fit") == 1


async def test_filter_passes_pods_without_gpus_through(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        plain = pending_pod("web", containers=[{"name": "web", "image": "x"}])
        created = await s.h.create("pod", plain)
        result = await s.filter(created, ["node-1", "node-2", "cpu-only"])
        assert result["NodeNames"] == ["node-1", "node-2", "cpu-only"]
        assert result["FailedNodes"] == {}
        items = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
        status, body = await s.post("/filter", {"Pod": created, "Nodes": {"items": items}})
        assert (status, body["Nodes"]["items"], body["NodeNames"]) == (200, items, None)
        assert counter(s, "numafit_scheduler_filter_total", result="not_gpu") == 2


async def test_bad_input_is_answered_never_crashes(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        # A Pod that cannot be read: 200 with Error, as kube-scheduler expects.
        status, body = await s.post(
            "/filter", {"Pod": {"metadata": {"name": "x"}}, "NodeNames": ["node-1"]}
        )
        assert status == 200
        assert "metadata.uid" in body["Error"]
        assert body["NodeNames"] == []
        # Not JSON, not an object, wrong shapes: 400 with a JSON error.
        for raw in (b"{nope", b"[1, 2]", b'{"Pod": {}, "NodeNames": "node-1"}', b'{"Pod": {}}'):
            status, body = await s.post("/filter", None, raw=raw)
            assert status == 400, raw
            assert body["Error"]
        status, body = await s.post("/bind", {"PodName": "x"})
        assert status == 400
        assert "PodNamespace" in body["Error"]
        status, body = await s.post("/prioritize", None, raw=b"null")
        assert status == 400
        status, body = await s.post("/webhook", {"request": {}})
        assert status == 400
        # Still serving.
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
        assert counter(s, "numafit_scheduler_filter_total", result="error") >= 5


async def test_invalid_scoring_weights_fail_the_filter_with_the_reason(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create(
            "pod", pending_pod("w", annotations={keys.SCORING_WEIGHTS: "slot=1"})
        )
        result = await s.filter(created, ["node-1"])
        assert keys.SCORING_WEIGHTS in result["Error"]
        assert result["NodeNames"] == []


def loaded_and_idle() -> list[tuple[str, dict[str, Any]]]:
    """node-1 already carries a 20 GB pod on GPU-a; node-2 is idle; both have 40 GB GPUs."""
    return [
        ("node", node("node-1", [gpu("GPU-a", 0)])),
        ("node", node("node-2", [gpu("GPU-b", 0)])),
        ("pod", reserved_pod("existing", "node-1", "GPU-a,NVIDIA,20000,30:;")),
    ]


async def test_prioritize_orders_nodes_by_node_policy(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, loaded_and_idle()) as s:
        binpack = await s.h.create("pod", pending_pod("packed", mem=10000, cores=10))
        status, scores = await s.post(
            "/prioritize", {"Pod": binpack, "NodeNames": ["node-1", "node-2"]}
        )
        assert status == 200
        by_host = {entry["Host"]: entry["Score"] for entry in scores}
        assert set(scores[0]) == {"Host", "Score"}
        assert by_host["node-1"] > by_host["node-2"]
        assert all(0 <= v <= 10 for v in by_host.values())

        spread = await s.h.create(
            "pod",
            pending_pod("spread", mem=10000, cores=10, annotations={keys.NODE_POLICY: "spread"}),
        )
        status, scores = await s.post(
            "/prioritize", {"Pod": spread, "NodeNames": ["node-1", "node-2"]}
        )
        by_host = {entry["Host"]: entry["Score"] for entry in scores}
        assert by_host["node-2"] > by_host["node-1"]

        # The filter picks the same way, and afterwards prioritize favours the reserved node.
        assert (await s.filter(spread, ["node-1", "node-2"]))["NodeNames"] == ["node-2"]
        assert (await s.filter(binpack, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        status, scores = await s.post(
            "/prioritize", {"Pod": spread, "NodeNames": ["node-1", "node-2"]}
        )
        assert {e["Host"]: e["Score"] for e in scores} == {"node-1": 0, "node-2": 10}


async def test_filter_excludes_the_pods_own_earlier_reservation(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [("node", node("node-1", [gpu("GPU-a", 0)]))]
    async with stack(nats_url, tmp_path, objects) as s:
        created = await s.h.create("pod", pending_pod("train", mem=30000))
        assert (await s.filter(created, ["node-1"]))["NodeNames"] == ["node-1"]
        # Scheduled again (e.g. its bind failed): 30 GB already counted for it must not stop it
        # from fitting the 40 GB GPU again.
        again = await s.h.pod("ml", "train")
        result = await s.filter(again, ["node-1"])
        assert result["NodeNames"] == ["node-1"], result
        annotations = await s.reservation("ml", "train")
        assert annotations[keys.ALLOCATED] == "GPU-a,NVIDIA,30000,30:;"
        reply = await s.h.client.ask(SnapshotRequest(node="node-1"), SnapshotReply)
        assert reply.nodes is not None
        assert len(reply.nodes[0].pods) == 1


class RaceOnFirstReserve:
    """Wraps the scheduler's accounting client: just before its first reserve is sent, another
    pod is reserved on the same node directly through accounting (the node's revision moves)."""

    def __init__(self, s: Stack, intruder: dict[str, Any], allocated: str) -> None:
        self.s = s
        self.real = s.scheduler.extender.accounting
        self.intruder = intruder
        self.allocated = allocated
        self.raced = False

    async def ask(self, request: Any, reply_type: Any, budget: float | None = None) -> Any:
        if isinstance(request, ReserveRequest) and not self.raced:
            self.raced = True
            meta = self.intruder["metadata"]
            intrusion = ReserveRequest(
                pod_uid=meta["uid"],
                pod_namespace=meta["namespace"],
                pod_name=meta["name"],
                revision=await self.s.revision(request.node),
                allocated=self.allocated,
                node=request.node,
            )
            reply = await self.s.h.client.ask(intrusion, ReserveReply)
            assert reply.ok, reply
        return await self.real.ask(request, reply_type, budget)


async def test_reserve_conflict_recomputes_on_fresh_state(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, loaded_and_idle()) as s:
        created = await s.h.create("pod", pending_pod("train", mem=15000))
        intruder = await s.h.create("pod", pending_pod("intruder", mem=15000))
        # Binpack picks node-1 (already loaded); meanwhile the intruder takes 15 GB there too,
        # leaving 5 GB: the scheduler's reserve loses the revision race, and the recomputed
        # decision moves to node-2.
        race = RaceOnFirstReserve(s, intruder, "GPU-a,NVIDIA,15000,30:;")
        s.scheduler.extender.accounting = race  # type: ignore[assignment]
        result = await s.filter(created, ["node-1", "node-2"])
        assert race.raced
        assert result["NodeNames"] == ["node-2"], result
        assert result["FailedNodes"] == {"node-1": "1/1 CardInsufficientMemory"}
        assert (await s.reservation("ml", "train"))[keys.VGPU_NODE] == "node-2"
        assert counter(s, "numafit_scheduler_reserve_attempts_total", result="conflict") == 1
        assert counter(s, "numafit_scheduler_reserve_attempts_total", result="ok") == 1


async def test_read_model_follows_usage_updates_without_snapshots(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        model: ReadModel = s.scheduler.read_model
        await model.views(["node-1"], 2.0)
        before = model.view("node-1")
        assert before is not None and before.snapshot is not None
        snapshots = counter(s, "numafit_scheduler_read_model_snapshots_total", scope="node")
        other = await s.h.create("pod", pending_pod("other"))
        meta = other["metadata"]
        request = ReserveRequest(
            pod_uid=meta["uid"],
            pod_namespace="ml",
            pod_name="other",
            revision=before.revision,
            allocated="GPU-a,NVIDIA,20000,30:;",
            node="node-1",
        )
        reply = await s.h.client.ask(request, ReserveReply)
        assert reply.ok, reply

        def updated() -> bool:
            view = model.view("node-1")
            return view is not None and view.revision == reply.revision

        await wait_for(updated)
        view = model.view("node-1")
        assert view is not None and view.snapshot is not None
        assert view.snapshot.usage_table() == {
            "GPU-a": {"used": 1, "usedmem": 20000, "usedcores": 30}
        }
        assert model.is_fresh("node-1")
        assert counter(s, "numafit_scheduler_read_model_snapshots_total", scope="node") == snapshots


async def test_bind_sets_allocating_then_binds(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        meta = created["metadata"]
        status, body = await s.post(
            "/bind",
            {"PodName": "train", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "node-1"},
        )
        assert (status, body) == (200, {"Error": ""})
        bound = await s.h.pod("ml", "train")
        assert bound["spec"]["nodeName"] == "node-1"
        annotations = bound["metadata"]["annotations"]
        assert annotations[keys.BIND_PHASE] == keys.PHASE_ALLOCATING
        assert annotations[keys.BIND_TIME].isdigit()
        assert counter(s, "numafit_scheduler_bind_total", result="ok") == 1


async def test_bind_without_a_reservation_is_refused(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        meta = created["metadata"]
        status, body = await s.post(
            "/bind",
            {"PodName": "train", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "node-1"},
        )
        assert status == 200
        assert "pod_not_tracked" in body["Error"]
        assert not (await s.h.pod("ml", "train"))["spec"].get("nodeName")
