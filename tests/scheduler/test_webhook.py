"""The admission webhook over real HTTP (AdmissionReview v1), and the same decision plugged into
the Kubernetes API emulator so a pod created through the real client is admitted as a cluster
with the webhook installed would admit it."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from shared.core import keys
from shared.testing.kube_emulator.scheduler_webhook import (
    EXCLUDED_NAMESPACES,
    WEBHOOK_NAME,
    emulator_admission_hook,
)
from svc_scheduler.extender_wire import BadInput
from svc_scheduler.webhook import PodWebhook, parse_review
from tests.builders import container, quota
from tests.raw_kube import raw
from tests.scheduler.stack import Stack, pending_pod, stack, two_nodes

REPO = Path(__file__).resolve().parents[2]


def review(pod: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "object": pod,
        },
    }


async def answer(s: Stack, body: dict[str, Any], path: str = "/webhook") -> dict[str, Any]:
    status, reply = await s.post(path, body)
    assert status == 200, reply
    assert reply["apiVersion"] == "admission.k8s.io/v1"
    assert reply["kind"] == "AdmissionReview"
    assert reply["response"]["uid"] == body["request"]["uid"]
    response: dict[str, Any] = reply["response"]
    return response


async def test_gpu_pod_is_allowed_with_a_json_patch(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        pod = pending_pod("train", containers=[container("main", None, 20000)], scheduler=None)
        response = await answer(s, review(pod))
        assert response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        ops = orjson.loads(base64.b64decode(response["patch"]))
        assert ops == [
            {
                "op": "add",
                "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu",
                "value": "1",
            },
            {"op": "add", "path": "/spec/schedulerName", "value": "numafit-scheduler"},
        ]
        # As a validating webhook: the same decision, never a patch.
        validated = await answer(s, review(pod), "/validate")
        assert validated == {"uid": validated["uid"], "allowed": True}
        # Pods without GPUs and other operations pass untouched.
        plain = pending_pod("web", containers=[{"name": "web", "image": "x"}])
        assert (await answer(s, review(plain)))["allowed"] is True
        assert "patch" not in await answer(s, review(plain))
        assert "patch" not in await answer(s, review(pod, "UPDATE"))
        registry = s.scheduler.metrics.registry
        assert registry.get_sample_value(
            "numafit_scheduler_webhook_total", {"result": "mutated", "reason": "allowed"}
        )


@pytest.mark.parametrize(
    ("annotations", "fragments", "code"),
    [
        ({keys.NUMA_ALIGNMENT: "maybe"}, [keys.NUMA_ALIGNMENT, "'maybe'"], 400),
        ({keys.SCORING_WEIGHTS: "slot=2,core=x,memory=1"}, [keys.SCORING_WEIGHTS, "core"], 400),
        ({keys.VGPU_NODE: "node-1"}, [keys.VGPU_NODE, "'node-1'"], 403),
    ],
)
async def test_refusals_name_annotation_and_value(
    nats_url: str, tmp_path: Path, annotations: dict[str, str], fragments: list[str], code: int
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        pod = pending_pod("train", annotations=annotations)
        for path in ("/webhook", "/validate"):
            response = await answer(s, review(pod), path)
            assert response["allowed"] is False
            assert "patch" not in response
            assert response["status"]["code"] == code
            for fragment in fragments:
                assert fragment in response["status"]["message"]


async def test_quota_refusal_reads_the_namespace_quota(nats_url: str, tmp_path: Path) -> None:
    objects = [*two_nodes(), ("quota", quota("ml", {"limits.nvidia.com/gpumem": "25000"}))]
    async with stack(nats_url, tmp_path, objects) as s:
        # init 30 GB then app 20 GB: a 30 GB peak can never fit a 25 GB quota.
        over = pending_pod(
            "over",
            init=[container("prep", 1, 30000, 60)],
            containers=[container("main", 1, 20000, 30)],
        )
        response = await answer(s, review(over))
        assert response["allowed"] is False
        assert response["status"]["code"] == 403
        assert "30000 MiB of nvidia.com/gpumem" in response["status"]["message"]
        assert "allows 25000" in response["status"]["message"]
        # init 20 GB then app 20 GB: a 20 GB peak fits (the phases never overlap).
        fits = pending_pod(
            "fits",
            init=[container("prep", 1, 20000, 60)],
            containers=[container("main", 1, 20000, 30)],
        )
        assert (await answer(s, review(fits)))["allowed"] is True


async def test_emulator_hook_admits_and_refuses_pods_created_through_the_api(
    nats_url: str, tmp_path: Path
) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        s.h.emulator.admission = emulator_admission_hook(s.scheduler.admission)
        assert s.h.kube is not None
        core = s.h.kube.core

        refused = pending_pod("maybe", annotations={keys.NUMA_ALIGNMENT: "maybe"})
        response = await raw(
            core.create_namespaced_pod(
                "ml",
                refused,  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
                _preload_content=False,
            )
        )
        status = orjson.loads(await response.read())
        assert response.status == 400
        assert status["kind"] == "Status"
        assert f'admission webhook "{WEBHOOK_NAME}" denied the request' in status["message"]
        assert "'maybe'" in status["message"]

        owned = pending_pod("owned", annotations={keys.BIND_PHASE: "allocating"})
        response = await raw(
            core.create_namespaced_pod(
                "ml",
                owned,  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
                _preload_content=False,
            )
        )
        assert response.status == 403
        assert keys.BIND_PHASE in orjson.loads(await response.read())["message"]

        created = await s.h.create("pod", pending_pod("ok", containers=[container("main", 2)]))
        assert created["spec"]["schedulerName"] == "numafit-scheduler"
        assert created["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/gpu": "2",
            "nvidia.com/gpucores": "100",
        }
        # Annotation writes by accounting (UPDATE) are not judged: the pod can be bound.
        result = await s.filter(created, ["node-1", "node-2"])
        assert result["NodeNames"] == [], result  # 2 GPUs: each node has one
        assert result["FailedNodes"] == {
            "node-1": "1/1 NodeInsufficientDevice",
            "node-2": "1/1 NodeInsufficientDevice",
        }
        one = await s.h.create("pod", pending_pod("one", containers=[container("main", 1)]))
        assert (await s.filter(one, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        await s.bind(one, "node-1")  # accounting's UPDATE writes the reservation
        assert (await s.annotations("ml", "one"))[keys.ALLOCATED] == "GPU-a,NVIDIA,40000,100:;"


async def test_hook_without_quota_source_still_refuses_invalid_values() -> None:
    from shared.testing.kube_emulator import AdmissionDenied, AdmissionRequest

    hook = emulator_admission_hook(PodWebhook())
    pod = pending_pod("w", annotations={keys.SCORING_WEIGHTS: "slot=1,slot=1,memory=1"})
    with pytest.raises(AdmissionDenied) as denied:
        await hook(AdmissionRequest("CREATE", "Pod", "ml", "w", pod))
    assert "'slot' given twice" in denied.value.message
    assert await hook(AdmissionRequest("UPDATE", "Pod", "ml", "w", pod)) is None


async def test_the_hook_leaves_the_charts_excluded_namespaces_alone() -> None:
    """As the chart's namespaceSelector does on a cluster: a pod in kube-system is never sent
    to the webhook, so an invalid value there is not refused and nothing is patched."""
    from shared.testing.kube_emulator import AdmissionDenied, AdmissionRequest

    hook = emulator_admission_hook(PodWebhook())
    bad = pending_pod("w", annotations={keys.SCORING_WEIGHTS: "slot=1,slot=1,memory=1"})
    assert await hook(AdmissionRequest("CREATE", "Pod", "kube-system", "w", bad)) is None
    with pytest.raises(AdmissionDenied):
        await hook(AdmissionRequest("CREATE", "Pod", "ml", "w", bad))
    gpu_pod = pending_pod("g", containers=[container("main", 1)])
    assert await hook(AdmissionRequest("CREATE", "Pod", "kube-system", "g", gpu_pod)) is None
    assert await hook(AdmissionRequest("CREATE", "Pod", "ml", "g", gpu_pod)) is not None


def test_the_emulators_excluded_namespaces_are_the_charts_default() -> None:
    values = yaml.safe_load((REPO / "helm/svc-scheduler/values.yaml").read_text())
    assert frozenset(values["webhooks"]["excludeNamespaces"]) == EXCLUDED_NAMESPACES


def test_parse_review_reads_what_the_webhook_needs() -> None:
    pod = pending_pod("train")
    body = review(pod)
    parsed = parse_review(orjson.dumps(body))
    assert (parsed.uid, parsed.operation, parsed.namespace) == (
        body["request"]["uid"],
        "CREATE",
        "ml",
    )
    assert parsed.object == pod and parsed.api_version == "admission.k8s.io/v1"
    # No namespace in the request: the Pod's, else `default`; no apiVersion: v1.
    del body["request"]["namespace"], body["apiVersion"]
    pod["metadata"]["namespace"] = "team"
    assert parse_review(orjson.dumps(body)).namespace == "team"
    assert parse_review(orjson.dumps(body)).api_version == "admission.k8s.io/v1"
    body["request"]["object"] = None
    assert parse_review(orjson.dumps(body)).namespace == "default"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{", "AdmissionReview is not valid JSON"),
        (b"[]", "AdmissionReview must be a JSON object"),
        (b"{}", "`request`"),
        (b'{"request": 1}', "$.request"),
        (b'{"request": {"operation": "CREATE"}}', "`uid`"),
        (b'{"request": {"uid": "", "operation": "CREATE"}}', "$.request.uid"),
        (b'{"request": {"uid": "u", "operation": 5}}', "$.request.operation"),
    ],
)
def test_parse_review_refuses_other_shapes_naming_the_field(raw: bytes, fragment: str) -> None:
    with pytest.raises(BadInput) as raised:
        parse_review(raw)
    assert fragment in str(raised.value)
