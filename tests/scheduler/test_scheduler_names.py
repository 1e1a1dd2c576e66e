"""The extender schedules only pods of numafit's own scheduler names, and a bind acts only on
the pod its name and UID both designate (issue 20, defect 3).

Over real HTTP with real svc_accounting, nats-server and the API emulator: a pod of another
scheduler (`default-scheduler`, what the API server gives a pod naming none) gets a refusal
from /filter and /bind and changes nothing (no hold, no write, no Binding); a /bind naming one
pod by name and another by UID leaves the UID owner's reservation as it was."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from shared.core import keys
from shared.core.config import CoreConfig
from shared.core.webhook_rules import WebhookDecision, review_pod_creation
from shared.messages import ReserveReply, ReserveRequest
from svc_scheduler.__main__ import build_parser, main, scheduler_names_from
from svc_scheduler.webhook import parse_scheduler_names
from tests.builders import gpu, node
from tests.scheduler.stack import NUMAFIT, Stack, pending_pod, reserved_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path

    from shared.service.kube_io import Kube

WHOLE_CARD = "GPU-a,NVIDIA,40000,30:;"


def counter(s: Stack, name: str, **labels: str) -> float:
    value = s.scheduler.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def bind_args(name: str, uid: str, node_name: str = "node-1") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "ml", "PodUID": uid, "Node": node_name}


async def hold(
    s: Stack, created: dict[str, Any], allocated: str, node_name: str = "node-1"
) -> None:
    """A reservation held straight through accounting, which knows no scheduler names (one a
    filter made before this check existed, say)."""
    meta = created["metadata"]
    request = ReserveRequest(
        pod_uid=meta["uid"],
        pod_namespace=meta["namespace"],
        pod_name=meta["name"],
        revision=await s.revision(node_name),
        allocated=allocated,
        node=node_name,
    )
    reply = await s.h.client.ask(request, ReserveReply)
    assert reply.ok, reply


async def test_filter_refuses_pods_of_other_schedulers_and_holds_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        before = await s.revision("node-1")
        theirs = [
            await s.h.create("pod", pending_pod(name, mem=40000, scheduler=scheduler))
            for name, scheduler in (("default", "default-scheduler"), ("volcano", "volcano"))
        ]
        # A pod naming no scheduler is the default scheduler's (the API server's default).
        created = await s.h.create("pod", pending_pod("unnamed", mem=40000, scheduler=None))
        assert created["spec"]["schedulerName"] == "default-scheduler"
        for obj in [*theirs, created]:
            scheduler = obj["spec"]["schedulerName"]
            for _ in range(2):  # filtering again renews nothing either
                result = await s.filter(obj, ["node-1", "node-2"])
                assert result["NodeNames"] == [], result
                assert f"has schedulerName {scheduler!r}" in result["Error"], result
                assert f"not one of numafit's ({NUMAFIT})" in result["Error"], result
        for name in ("default", "volcano", "unnamed"):
            assert await s.reservation("ml", name) == {}
        assert await s.revision("node-1") == before  # nothing was held there
        assert counter(s, "numafit_scheduler_filter_total", result="other_scheduler") == 6

        # The whole card is still free for numafit's own pod.
        ours = await s.h.create("pod", pending_pod("ours", mem=40000))
        result = await s.filter(ours, ["node-1", "node-2"])
        assert result["NodeNames"] == ["node-1"], result
        assert (await s.reservation("ml", "ours"))[keys.ALLOCATED] == WHOLE_CARD


async def test_filter_passes_pods_without_gpus_of_any_scheduler_through(
    nats_url: str, tmp_path: Path
) -> None:
    """An extender is called for every profile of its kube-scheduler: a plain pod of the
    default scheduler must still get every node (numafit holds nothing for it)."""
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        plain = pending_pod(
            "web", containers=[{"name": "web", "image": "x"}], scheduler="default-scheduler"
        )
        created = await s.h.create("pod", plain)
        result = await s.filter(created, ["node-1", "node-2"])
        assert (result["NodeNames"], result["Error"]) == (["node-1", "node-2"], "")


async def test_prioritize_scores_nothing_for_pods_of_other_schedulers(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [
        ("node", node("node-1", [gpu("GPU-a", 0)])),
        ("node", node("node-2", [gpu("GPU-b", 0)])),
        ("pod", reserved_pod("existing", "node-1", "GPU-a,NVIDIA,20000,30:;")),
    ]
    async with stack(nats_url, tmp_path, objects) as s:
        names = ["node-1", "node-2"]
        ours = await s.h.create("pod", pending_pod("ours", mem=10000, cores=10))
        status, scores = await s.post("/prioritize", {"Pod": ours, "NodeNames": names})
        assert status == 200
        assert max(e["Score"] for e in scores) > 0  # the same shape is scored when ours
        theirs = await s.h.create(
            "pod", pending_pod("theirs", mem=10000, cores=10, scheduler="default-scheduler")
        )
        status, scores = await s.post("/prioritize", {"Pod": theirs, "NodeNames": names})
        assert status == 200
        assert scores == [{"Host": "node-1", "Score": 0}, {"Host": "node-2", "Score": 0}]


async def test_bind_refuses_pods_of_other_schedulers_and_changes_nothing(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create(
            "pod", pending_pod("theirs", mem=40000, scheduler="default-scheduler")
        )
        await hold(s, created, WHOLE_CARD)
        held = await s.reservation("ml", "theirs")
        before = await s.revision("node-1")
        status, body = await s.post("/bind", bind_args("theirs", created["metadata"]["uid"]))
        assert status == 200
        assert "has schedulerName 'default-scheduler'" in body["Error"], body
        current = await s.h.pod("ml", "theirs")
        assert not current["spec"].get("nodeName")
        assert not set(keys.SCHEDULER_OWNED) & set(current["metadata"].get("annotations") or {})
        assert await s.reservation("ml", "theirs") == held  # neither written nor released
        assert await s.revision("node-1") == before
        assert counter(s, "numafit_scheduler_bind_total", result="other_scheduler") == 1


async def test_bind_naming_one_pod_by_name_and_another_by_uid_touches_neither(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        owner = await s.h.create("pod", pending_pod("owner"))
        other = await s.h.create("pod", pending_pod("other", mem=1000))
        assert (await s.filter(owner, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        held = await s.reservation("ml", "owner")
        before = await s.revision("node-1")
        uid = owner["metadata"]["uid"]
        status, body = await s.post("/bind", bind_args("other", uid))
        assert status == 200
        for name in ("owner", "other"):
            current = await s.h.pod("ml", name)
            assert not current["spec"].get("nodeName")
            annotations = current["metadata"].get("annotations") or {}
            assert not set(keys.SCHEDULER_OWNED) & set(annotations), (name, annotations)
        assert await s.reservation("ml", "owner") == held  # still held, not written, not failed
        assert await s.revision("node-1") == before
        assert "pod_mismatch" in body["Error"], body
        assert other["metadata"]["uid"] in body["Error"] and uid in body["Error"], body
        assert counter(s, "numafit_scheduler_bind_total", result="pod_mismatch") == 1

        # The owner's own bind still finds its reservation.
        await s.bind(owner, "node-1")
        bound = await s.h.pod("ml", "owner")
        assert bound["spec"]["nodeName"] == "node-1"
        assert bound["metadata"]["annotations"][keys.BIND_PHASE] == keys.PHASE_ALLOCATING


class RecreatedDuringBinding:
    """Wraps accounting's Kubernetes client (accounting sends the Binding, the reservation on
    it): just before the Binding is sent, the pod is deleted and another one created under its
    name, already bound to the node."""

    def __init__(self, s: Stack, real: Kube) -> None:
        self.s = s
        self.real = real
        self.replaced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def create_binding(
        self, namespace: str, name: str, uid: str, node_name: str, **guards: Any
    ) -> None:
        if not self.replaced:
            self.replaced = True
            await self.real.delete_pod(namespace, name)
            twin = pending_pod(name, mem=1000)
            twin["spec"]["nodeName"] = node_name
            await self.s.h.create("pod", twin)
        await self.real.create_binding(namespace, name, uid, node_name, **guards)


async def test_bind_is_not_reported_done_for_a_pod_recreated_under_the_same_name(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        created = await s.h.create("pod", pending_pod("train"))
        assert (await s.filter(created, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        assert s.h.accounting is not None
        ops = s.h.accounting.ops
        wrapped = RecreatedDuringBinding(s, ops.writes.kube)
        ops.writes.kube = wrapped  # type: ignore[assignment]
        status, body = await s.post("/bind", bind_args("train", created["metadata"]["uid"]))
        assert wrapped.replaced
        assert status == 200
        # The twin is bound to node-1 by someone else: that is no Binding of this pod (the
        # Binding's uid precondition fails), and nothing of the reservation is on the twin.
        assert body["Error"], body
        assert counter(s, "numafit_scheduler_bind_total", result="ok") == 0
        twin = await s.h.pod("ml", "train")
        assert twin["metadata"]["uid"] != created["metadata"]["uid"]
        assert not set(keys.SCHEDULER_OWNED) & set(twin["metadata"].get("annotations") or {})


async def test_every_configured_scheduler_name_is_scheduled(nats_url: str, tmp_path: Path) -> None:
    names = (NUMAFIT, "gpu-batch")
    async with stack(nats_url, tmp_path, two_nodes(), scheduler_names=names) as s:
        batch = await s.h.create("pod", pending_pod("batch", scheduler="gpu-batch"))
        assert (await s.filter(batch, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        await s.bind(batch, "node-1")
        assert (await s.h.pod("ml", "batch"))["spec"]["nodeName"] == "node-1"
        theirs = await s.h.create("pod", pending_pod("theirs", scheduler="default-scheduler"))
        result = await s.filter(theirs, ["node-1", "node-2"])
        assert f"not one of numafit's ({NUMAFIT}, gpu-batch)" in result["Error"], result


def admission_review(pod_obj: dict[str, Any], names: tuple[str, ...]) -> WebhookDecision:
    return review_pod_creation(pod_obj, namespace="ml", config=CoreConfig(), scheduler_names=names)


def test_webhook_keeps_any_of_numafits_names_and_routes_the_default_to_the_first() -> None:
    names = ("gpu-batch", NUMAFIT)
    gpu_pod = pending_pod("train", scheduler=None)
    for already in names:
        gpu_pod["spec"]["schedulerName"] = already
        assert admission_review(gpu_pod, names) == WebhookDecision(True)
    for routed in (None, "default-scheduler"):
        if routed is None:
            gpu_pod["spec"].pop("schedulerName")
        else:
            gpu_pod["spec"]["schedulerName"] = routed
        decision = admission_review(gpu_pod, names)
        assert decision.patch == (
            {"op": "add", "path": "/spec/schedulerName", "value": "gpu-batch"},
        )
    # Another scheduler's pod is left to it, even with values numafit would refuse.
    gpu_pod["spec"]["schedulerName"] = "volcano"
    gpu_pod["metadata"]["annotations"] = {keys.NUMA_ALIGNMENT: "maybe"}
    assert admission_review(gpu_pod, names) == WebhookDecision(True)


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (None, {}, (NUMAFIT,)),
        (None, {"NUMAFIT_SCHEDULER_NAME": ""}, (NUMAFIT,)),
        (None, {"NUMAFIT_SCHEDULER_NAME": "a, b,,a"}, ("a", "b")),
        (["x"], {"NUMAFIT_SCHEDULER_NAME": "a,b"}, ("x",)),  # flags replace the environment
        (["x,y", "z", "y"], {}, ("x", "y", "z")),
    ],
)
def test_scheduler_names_come_from_repeated_flags_comma_lists_or_the_environment(
    flags: list[str] | None, env: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert scheduler_names_from(flags, env) == expected
    if flags is not None:
        argv = [f"--scheduler-name={flag}" for flag in flags]
        assert build_parser().parse_args(argv).scheduler_name == flags


@pytest.mark.parametrize(
    ("flag", "fragment"), [(" , ", "at least one"), ("Numafit", "'Numafit' is not a DNS-1123")]
)
def test_unusable_scheduler_names_exit_2(
    capsys: pytest.CaptureFixture[str], flag: str, fragment: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--scheduler-name", flag])
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least one"):
        parse_scheduler_names(())
