"""Out-of-range GPU resources and invalid annotations (shared/core/inputs.py): refused by the
admission webhook and by the extender's filter alike, each with a reason an operator can read
in `kubectl describe` (the webhook's denial; the filter's Error, which kube-scheduler writes
into the FailedScheduling event). Where HAMi clamps or ignores a value, numafit refuses it."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest

from shared.core import keys
from shared.core import webhook_rules as rules
from shared.core.config import CoreConfig
from shared.core.webhook_rules import review_pod_creation
from tests.builders import container
from tests.scheduler.stack import pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path

NAME = "numafit-scheduler"
MIB = 1 << 20


def gpu_pod(
    *, limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    resources = limits or {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": resources}}]},
    }


def review(pod: dict[str, Any]) -> rules.WebhookDecision:
    return review_pod_creation(
        pod, namespace="ml", config=CoreConfig(), scheduler_names=(NAME,), quota=None
    )


# --- the webhook's decision (pure core) -----------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "fragments"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "101"}, ["nvidia.com/gpucores", "'101'"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}, ["percentage", "'0'"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}, ["percentage", "'150'"]),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}, ["nvidia.com/gpumem", "'0'"]),
        ({"nvidia.com/gpu": "-1", "nvidia.com/gpumem": "1000"}, ["nvidia.com/gpu", "'-1'"]),
    ],
)
def test_out_of_range_resources_are_refused_not_clamped(
    resources: dict[str, str], fragments: list[str]
) -> None:
    decision = review(gpu_pod(limits=resources))
    assert (decision.allowed, decision.reason, decision.code) == (False, "invalid_request", 400)
    for fragment in fragments:
        assert fragment in decision.message
    assert decision.patch == ()


@pytest.mark.parametrize(
    ("annotations", "reason", "fragment"),
    [
        ({keys.GPU_POLICY: "bogus"}, "invalid_annotation", "'bogus'"),
        ({keys.GPU_POLICY: "x" * MIB}, "invalid_annotation", "1048576 bytes"),
        ({keys.NODE_POLICY: "fill"}, "invalid_annotation", "'fill'"),
        ({keys.NUMA_BIND: "yes"}, "invalid_annotation", "'yes'"),
        ({keys.USE_UUID: "GPU-a," * 10000}, "invalid_annotation", "60000 bytes"),
        ({keys.NUMA_ALIGNMENT: "x" * MIB}, "invalid_numa_alignment", "1048576 bytes"),
        ({keys.SCORING_WEIGHTS: "x" * MIB}, "invalid_scoring_weights", "1048576 bytes"),
        ({keys.VGPU_NODE: "x" * MIB}, "scheduler_owned_annotation", "1048576 bytes"),
    ],
)
def test_invalid_annotations_are_refused_in_a_short_message(
    annotations: dict[str, str], reason: str, fragment: str
) -> None:
    decision = review(gpu_pod(annotations=annotations))
    assert (decision.allowed, decision.reason) == (False, reason)
    assert next(iter(annotations)) in decision.message
    assert fragment in decision.message
    assert len(decision.message) < 400


def test_valid_values_at_the_bounds_are_admitted() -> None:
    annotations = {
        keys.GPU_POLICY: "binpack,numa",
        keys.NODE_POLICY: "Spread",
        keys.NUMA_BIND: "true",
        keys.USE_UUID: "",
    }
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "100",
        "nvidia.com/gpucores": "100",
    }
    assert review(gpu_pod(limits=limits, annotations=annotations)).allowed
    assert review(gpu_pod(limits={**limits, "nvidia.com/gpumem-percentage": "1"})).allowed


# --- over the wire: the webhook and the filter agree ---------------------------------------


def admission_review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "namespace": "ml",
            "operation": "CREATE",
            "object": pod,
        },
    }


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    # (name, pod changes, the reason both must give)
    ("cores", {"cores": 101}, "nvidia.com/gpucores '101' is out of range: give 0 to 100"),
    (
        "percent",
        {"containers": [container("main", 1, pct=0)]},
        "nvidia.com/gpumem-percentage '0' is out of range: give 1 to 100",
    ),
    (
        "policy",
        {"annotations": {keys.GPU_POLICY: "bogus"}},
        "hami.io/gpu-scheduler-policy 'bogus' is not a GPU policy",
    ),
    (
        "huge",
        {"annotations": {keys.GPU_POLICY: "x" * 100_000}},
        "hami.io/gpu-scheduler-policy is 100000 bytes long: numafit reads at most 32768 bytes",
    ),
    (
        "nodepolicy",
        {"annotations": {keys.NODE_POLICY: "fill"}},
        "hami.io/node-scheduler-policy 'fill' is not a node policy: use binpack or spread",
    ),
    (
        "alignment",
        {"annotations": {keys.NUMA_ALIGNMENT: "maybe"}},
        "hami.io/numa-alignment value 'maybe' is invalid",
    ),
]


async def test_webhook_and_filter_refuse_the_same_values_with_the_same_reason(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        for name, changes, reason in REFUSED:
            body = pending_pod(name, **changes)
            for path in ("/webhook", "/validate"):
                status, reply = await s.post(path, admission_review(body))
                assert status == 200, reply
                response = reply["response"]
                assert response["allowed"] is False, name
                assert response["status"]["code"] == 400
                assert reason in response["status"]["message"], response
            # Created anyway (as with the webhook down or bypassed): the filter refuses it.
            created = await s.h.create("pod", body)
            result = await s.filter(created, ["node-1", "node-2"])
            assert result["NodeNames"] == [], name
            assert reason in result["Error"], result
        assert keys.VGPU_NODE not in await s.reservation("ml", "cores")
