"""Server-side field validation: unknown fields dropped, warned about or refused, as asked.

fieldValidation=Strict refuses a body with an unknown field (400), Warn (the default) stores it
without the field and says so in a Warning header, Ignore drops it silently. Every part of a
built-in kind (statuses, probes, affinity) is typed as the API server types it, from
Kubernetes' own definitions. Values of the wrong JSON type fail decoding, and a custom
resource's schema is its validation (422).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from shared.testing.kube_emulator import KubeEmulator
from tests.test_kube_emulator_dry_run import Raw, pod_body

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

PODS = "/api/v1/namespaces/default/pods"
TOPOLOGIES = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def raw(emulator: KubeEmulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(emulator, session)


def typo_pod(name: str = "p") -> dict[str, Any]:
    body = pod_body(name)
    body["spec"]["containers"][0]["resourcs"] = {"limits": {"cpu": "1"}}
    body["metadata"]["labelz"] = {"a": "b"}
    return body


async def test_strict_refuses_unknown_fields_and_stores_nothing(raw: Raw) -> None:
    status, answer, _ = await raw.call(
        "POST", PODS, typo_pod(), params={"fieldValidation": "Strict"}
    )

    assert status == 400
    assert answer["reason"] == "BadRequest"
    assert answer["message"] == (
        'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
        'unknown field "metadata.labelz", unknown field "spec.containers[0].resourcs"'
    )
    assert (await raw.call("GET", f"{PODS}/p"))[0] == 404


async def test_warn_is_the_default_and_drops_the_fields(raw: Raw) -> None:
    status, created, headers = await raw.call("POST", PODS, typo_pod())

    assert status == 201
    assert headers.getall("Warning") == [
        '299 - "unknown field \\"metadata.labelz\\""',
        '299 - "unknown field \\"spec.containers[0].resourcs\\""',
    ]
    stored = await raw.ok("GET", f"{PODS}/p")
    for obj in (created, stored):
        assert "labelz" not in obj["metadata"]
        assert obj["spec"]["containers"][0] == {"name": "main", "image": "busybox"}


async def test_ignore_drops_the_fields_silently(raw: Raw) -> None:
    status, created, headers = await raw.call(
        "POST", PODS, typo_pod(), params={"fieldValidation": "Ignore"}
    )

    assert status == 201
    assert "Warning" not in headers
    assert "resourcs" not in created["spec"]["containers"][0]


async def test_a_patch_adding_an_unknown_field_is_refused_when_strict(raw: Raw) -> None:
    created = await raw.ok("POST", PODS, pod_body())

    status, answer, _ = await raw.call(
        "PATCH",
        f"{PODS}/p",
        {"spec": {"containers": [{"name": "main", "imagePullPolicyy": "Always"}]}},
        content_type="application/strategic-merge-patch+json",
        params={"fieldValidation": "Strict"},
    )

    assert status == 400
    assert 'unknown field "spec.containers[0].imagePullPolicyy"' in answer["message"]
    assert await raw.ok("GET", f"{PODS}/p") == created


async def test_the_deep_parts_of_a_pod_are_typed_as_the_api_server_types_them(raw: Raw) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
            }
        }
    }
    probe = {"exec": {"command": ["true"]}, "periodSeconds": 5}
    body = pod_body(affinity=affinity)
    body["spec"]["containers"][0]["livenessProbe"] = probe
    created = await raw.ok("POST", PODS, body, params={"fieldValidation": "Strict"})
    updated = await raw.ok(
        "PUT",
        f"{PODS}/p/status",
        {
            **created,
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        },
        params={"fieldValidation": "Strict"},
    )

    assert created["spec"]["affinity"] == affinity
    assert created["spec"]["containers"][0]["livenessProbe"] == probe
    assert updated["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    # Where the hand-written schema once kept anything (affinity, statuses), a typo is now an
    # unknown field like any other.
    typo = pod_body("typo", affinity={"nodeAffinity": {"anything": {"goes": ["here"]}}})
    status, answer, _ = await raw.call("POST", PODS, typo, params={"fieldValidation": "Strict"})
    assert status == 400
    assert 'unknown field "spec.affinity.nodeAffinity.anything"' in answer["message"]
    future = {**updated, "status": {"phase": "Running", "futureField": {"x": 1}}}
    status, answer, _ = await raw.call(
        "PUT", f"{PODS}/p/status", future, params={"fieldValidation": "Strict"}
    )
    assert status == 400
    assert 'unknown field "status.futureField"' in answer["message"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"containers": "busybox"},
            "json: cannot unmarshal string into Go struct field PodSpec.spec.containers "
            "of type []v1.Container",
        ),
        (
            {"terminationGracePeriodSeconds": "30"},
            "json: cannot unmarshal string into Go struct field "
            "PodSpec.spec.terminationGracePeriodSeconds of type int64",
        ),
        (
            {"hostNetwork": "true"},
            "json: cannot unmarshal string into Go struct field PodSpec.spec.hostNetwork "
            "of type bool",
        ),
        (
            {"nodeSelector": ["a"]},
            "json: cannot unmarshal array into Go struct field PodSpec.spec.nodeSelector "
            "of type map[string]string",
        ),
        # Deep in the pod spec too (Kubernetes' own definitions, not a hand-written subset).
        (
            {"securityContext": {"runAsUser": "root"}},
            "json: cannot unmarshal string into Go struct field "
            "PodSecurityContext.spec.securityContext.runAsUser of type int64",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}
                    }
                }
            },
            "json: cannot unmarshal string into Go struct field NodeSelector.spec.affinity."
            "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms "
            "of type []v1.NodeSelectorTerm",
        ),
    ],
)
async def test_values_of_the_wrong_type_do_not_decode(
    raw: Raw, change: dict[str, Any], message: str
) -> None:
    body = pod_body()
    body["spec"].update(change)

    status, answer, _ = await raw.call("POST", PODS, body)

    assert status == 400
    assert answer["message"] == f'Pod in version "v1" cannot be handled as a Pod: {message}'


async def test_metadata_that_is_not_an_object_is_refused(raw: Raw) -> None:
    status, answer, _ = await raw.call("POST", PODS, {"metadata": "p", "spec": {}})

    assert status == 400
    assert "of type v1.ObjectMeta" in answer["message"]


async def test_binary_config_data_must_be_base64(raw: Raw) -> None:
    good = {"metadata": {"name": "c"}, "binaryData": {"blob": "aGVsbG8="}}
    bad = {"metadata": {"name": "d"}, "binaryData": {"blob": "not base64!"}}

    created = await raw.ok("POST", "/api/v1/namespaces/default/configmaps", good)
    status, answer, _ = await raw.call("POST", "/api/v1/namespaces/default/configmaps", bad)

    assert created["binaryData"] == {"blob": "aGVsbG8="}
    assert status == 400
    assert "illegal base64 data" in answer["message"]


async def test_an_unknown_field_validation_directive_is_422(raw: Raw) -> None:
    status, answer, _ = await raw.call("POST", PODS, pod_body(), params={"fieldValidation": "Loud"})

    assert status == 422
    assert answer["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loud": '
        'supported values: "", "Ignore", "Strict", "Warn"'
    )


def topology(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "node-1"},
        "zones": [
            {
                "name": "node-0",
                "type": "Node",
                "costs": [{"name": "node-0", "value": 10}],
                "resources": [
                    {"name": "cpu", "capacity": "8", "allocatable": "7", "available": "5"}
                ],
            }
        ],
    }
    body.update(changes)
    return body


async def test_a_custom_resource_is_validated_by_its_schema(raw: Raw) -> None:
    wrong_type = topology()
    wrong_type["zones"][0]["costs"][0]["value"] = "ten"
    missing = topology()
    del missing["zones"][0]["resources"][0]["available"]

    no_zones, no_zones_answer, _ = await raw.call("POST", TOPOLOGIES, topology(zones=None))
    typed, typed_answer, _ = await raw.call("POST", TOPOLOGIES, wrong_type)
    required, required_answer, _ = await raw.call("POST", TOPOLOGIES, missing)

    assert (no_zones, typed, required) == (422, 422, 422)
    assert no_zones_answer["message"] == (
        'NodeResourceTopology.topology.node.k8s.io "node-1" is invalid: zones: Required value'
    )
    assert typed_answer["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "string": zones[0].costs[0].value in body must be of '
            'type integer: "string"',
            "field": "zones[0].costs[0].value",
        }
    ]
    assert required_answer["details"]["causes"][0]["field"] == "zones[0].resources[0].available"
    assert (await raw.ok("GET", TOPOLOGIES))["items"] == []
