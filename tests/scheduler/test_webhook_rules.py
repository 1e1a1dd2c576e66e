"""Admission rules of the pure core: e.5 quota need, refusals, and the JSON Patch mutation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shared.core import keys
from shared.core import webhook_rules as rules
from shared.core.config import CoreConfig
from shared.core.model import ContainerKind, Usage
from shared.core.quota import QuotaLimit
from shared.core.requests import ContainerRequest
from shared.core.webhook_rules import pod_quota_need, review_pod_creation
from shared.testing.kube_emulator.patching import json_patch
from tests.builders import container

A, I, S = ContainerKind.APP, ContainerKind.INIT, ContainerKind.SIDECAR  # noqa: E741
NAME = "numafit-scheduler"


def req(nums: int, mem: int, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(nums, memreq=mem, coresreq=cores)


@pytest.mark.parametrize(
    ("kinds", "requests", "expected"),
    [
        # apps add up, Memreq x Nums
        ([A, A], [req(2, 10000, 20), req(1, 5000, 10)], Usage(25000, 50)),
        # a regular init never runs beside the apps: max(init, apps)
        ([I, A], [req(1, 30000, 60), req(1, 20000, 30)], Usage(30000, 60)),
        ([I, A], [req(1, 10000, 10), req(1, 20000, 30)], Usage(20000, 30)),
        # a sidecar runs beside the apps: sum
        ([S, A], [req(1, 30000, 60), req(1, 20000, 30)], Usage(50000, 90)),
        # a regular init after a sidecar runs beside it: peak = sidecar + init
        ([S, I, A], [req(1, 10000, 10), req(1, 30000, 50), req(1, 5000, 5)], Usage(40000, 60)),
        # a regular init before the sidecar is not charged with it
        ([I, S, A], [req(1, 30000, 50), req(1, 10000, 10), req(1, 5000, 5)], Usage(30000, 50)),
        # empty positions count nothing; cores are capped at 100 per GPU as the fit records them
        ([I, A, A], [None, req(2, 1000, 150), None], Usage(2000, 200)),
        # percentage-only memory counts 0 MiB (its size depends on the card)
        ([A], [ContainerRequest(1, mem_percentage=50, coresreq=10)], Usage(0, 10)),
    ],
)
def test_admission_quota_need_is_phase_aware(
    kinds: list[ContainerKind], requests: list[ContainerRequest | None], expected: Usage
) -> None:
    assert pod_quota_need(kinds, requests) == expected


def gpu_pod(
    *,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers or [container("main", 1, 20000, 30)]}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations or {}},
        "spec": spec,
    }


def review(pod: Any, quota: QuotaLimit | None = None, **config: Any) -> rules.WebhookDecision:
    return review_pod_creation(
        pod, namespace="ml", config=CoreConfig(**config), scheduler_names=(NAME,), quota=quota
    )


def patched(pod: dict[str, Any], decision: rules.WebhookDecision) -> dict[str, Any]:
    result: dict[str, Any] = json_patch(copy.deepcopy(pod), list(decision.patch))
    return result


@pytest.mark.parametrize(
    ("annotations", "reason", "fragment"),
    [
        ({keys.NUMA_ALIGNMENT: "maybe"}, rules.INVALID_NUMA_ALIGNMENT, "'maybe'"),
        ({keys.NUMA_ALIGNMENT: ""}, rules.INVALID_NUMA_ALIGNMENT, keys.NUMA_ALIGNMENT),
        ({keys.NUMA_ALIGNMENT: "true"}, rules.INVALID_NUMA_ALIGNMENT, "'true'"),
        ({keys.SCORING_WEIGHTS: "slot=1,core=1"}, rules.INVALID_SCORING_WEIGHTS, "slot=1,core=1"),
        (
            {keys.SCORING_WEIGHTS: "slot=0,core=0,memory=0"},
            rules.INVALID_SCORING_WEIGHTS,
            keys.SCORING_WEIGHTS,
        ),
        ({keys.VGPU_NODE: "node-1"}, rules.OWNED_ANNOTATION, keys.VGPU_NODE),
        ({keys.ALLOCATED: "GPU-a,NVIDIA,1,1:;"}, rules.OWNED_ANNOTATION, keys.ALLOCATED),
        ({keys.BIND_PHASE: "allocating"}, rules.OWNED_ANNOTATION, keys.BIND_PHASE),
    ],
)
def test_refusals_name_the_annotation_and_value(
    annotations: dict[str, str], reason: str, fragment: str
) -> None:
    decision = review(gpu_pod(annotations=annotations))
    assert not decision.allowed
    assert decision.reason == reason
    assert fragment in decision.message
    assert decision.patch == ()


@pytest.mark.parametrize("value", ["best-effort", "strict", " STRICT ", "Best-Effort\n"])
def test_valid_alignment_values_are_admitted(value: str) -> None:
    assert review(gpu_pod(annotations={keys.NUMA_ALIGNMENT: value})).allowed


def test_owned_annotations_are_refused_on_any_pod() -> None:
    pod = gpu_pod(containers=[{"name": "web", "image": "x"}], annotations={keys.TO_ALLOCATE: ";"})
    decision = review(pod)
    assert (decision.allowed, decision.reason, decision.code) == (
        False,
        rules.OWNED_ANNOTATION,
        403,
    )


def test_pods_without_gpus_pass_untouched() -> None:
    pod = gpu_pod(
        containers=[{"name": "web", "image": "x", "resources": {"limits": {"cpu": "1"}}}],
        annotations={keys.NUMA_ALIGNMENT: "maybe"},
    )
    assert review(pod) == rules.WebhookDecision(True)


def test_pods_of_another_scheduler_pass_untouched() -> None:
    pod = gpu_pod(scheduler="volcano", annotations={keys.NUMA_ALIGNMENT: "maybe"})
    assert review(pod) == rules.WebhookDecision(True)


def test_gpu_pod_gets_the_scheduler_name() -> None:
    pod = gpu_pod(scheduler="default-scheduler")
    decision = review(pod)
    assert decision.allowed
    assert decision.patch == ({"op": "add", "path": "/spec/schedulerName", "value": NAME},)
    assert patched(pod, decision)["spec"]["schedulerName"] == NAME
    # Already ours: nothing to patch.
    assert review(gpu_pod(scheduler=NAME)).patch == ()


def test_count_injected_and_whole_card_made_exclusive() -> None:
    pod = gpu_pod(
        containers=[
            container("mem-only", None, 20000),  # count injected, cores untouched
            container("pct-100", None, pct=100),  # count injected, whole card -> cores 100
            container("bare", 2),  # whole card (no memory named) -> cores 100
            container("sized", 1, 10000),  # memory named: not a whole card
            container("half", 1, pct=50),  # half a card
            container("cores", 1, cores=30),  # cores named: kept
        ],
        init=[container("prep", None, cores=20, requests=True)],  # limits section created
    )
    decision = review(pod)
    assert decision.allowed
    after = patched(pod, decision)
    limits = [c["resources"]["limits"] for c in after["spec"]["containers"]]
    assert limits[0] == {"nvidia.com/gpumem": "20000", "nvidia.com/gpu": "1"}
    assert limits[1] == {
        "nvidia.com/gpumem-percentage": "100",
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "100",
    }
    assert limits[2] == {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}
    assert limits[3] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}
    assert limits[4] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}
    assert limits[5] == {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}
    assert after["spec"]["initContainers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    paths = [op["path"] for op in decision.patch]
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu" in paths


def test_no_count_injection_when_default_gpu_num_is_zero() -> None:
    pod = gpu_pod(containers=[container("mem-only", None, 20000)])
    decision = review(pod, default_gpu_num=0)
    assert decision.allowed
    after = patched(pod, decision)
    assert after["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpumem": "20000"}


def test_default_memory_means_no_whole_card() -> None:
    pod = gpu_pod(containers=[container("bare", 1)])
    decision = review(pod, default_memory=8000)
    assert patched(pod, decision)["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "1"
    }


def test_privileged_containers_are_skipped() -> None:
    privileged = container("tool", 1)
    privileged["securityContext"] = {"privileged": True}
    pod = gpu_pod(containers=[privileged], annotations={keys.NUMA_ALIGNMENT: "maybe"})
    assert review(pod) == rules.WebhookDecision(True)


def test_unschedulable_request_is_refused() -> None:
    decision = review(gpu_pod(containers=[container("main", 1, None, None, pct=None)]))
    assert decision.allowed
    bad = gpu_pod(containers=[{"name": "m", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}])
    decision = review(bad)
    assert (decision.allowed, decision.reason) == (False, rules.INVALID_REQUEST)
    assert "1.5" in decision.message


@pytest.mark.parametrize(
    ("limit", "allowed"),
    [
        (QuotaLimit(mem=30000), True),  # max(init 30000, app 20000) = 30000 fits exactly
        (QuotaLimit(mem=29999), False),
        (QuotaLimit(cores=60), True),
        (QuotaLimit(cores=59), False),
        (QuotaLimit(), True),
        (None, True),
    ],
)
def test_quota_refuses_pods_that_can_never_fit(limit: QuotaLimit | None, allowed: bool) -> None:
    pod = gpu_pod(
        init=[container("prep", 1, 30000, 60)], containers=[container("main", 1, 20000, 30)]
    )
    decision = review(pod, quota=limit)
    assert decision.allowed is allowed
    if not allowed:
        assert decision.reason == rules.QUOTA_EXCEEDED
        assert decision.code == 403
        assert "namespace ml" in decision.message


def test_quota_counts_the_sidecar_beside_the_apps() -> None:
    pod = gpu_pod(
        init=[container("proxy", 1, 30000, 60, sidecar=True)],
        containers=[container("main", 1, 20000, 30)],
    )
    decision = review(pod, quota=QuotaLimit(mem=40000))
    assert not decision.allowed
    assert "50000 MiB of nvidia.com/gpumem" in decision.message


def test_not_a_pod() -> None:
    decision = review(["not", "a", "pod"])
    assert (decision.allowed, decision.reason) == (False, rules.INVALID_POD)
