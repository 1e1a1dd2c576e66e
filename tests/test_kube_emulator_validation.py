"""What the API server's validation refuses with 422 Invalid, as kube-apiserver words it:
annotations over 256 KiB in total (apimachinery ValidateAnnotations), negative resource
quantities, and requests that break their limits (core ValidateResourceRequirements: extended
resources such as nvidia.com/gpu cannot be overcommitted, so a request must equal its limit
and needs one)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest

from shared.testing.kube_emulator import KubeEmulator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from shared.testing.kube_emulator.objects import JSONDict

PODS = "/api/v1/namespaces/default/pods"
LIMIT = 262144
"""apimachinery's TotalAnnotationSizeLimitB: 256 KiB, keys and values together."""


class Raw:
    def __init__(self, emulator: KubeEmulator, session: aiohttp.ClientSession) -> None:
        self.emulator = emulator
        self.session = session

    async def call(
        self, method: str, path: str, body: Any, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        async with self.session.request(
            method,
            self.emulator.url + path,
            # A stream: large bodies too, without blocking the loop.
            data=None if body is None else io.BytesIO(orjson.dumps(body)),
            headers={"Content-Type": content_type},
        ) as response:
            return response.status, orjson.loads(await response.read())


@pytest.fixture
async def raw() -> AsyncIterator[Raw]:
    async with KubeEmulator() as emulator, aiohttp.ClientSession() as session:
        yield Raw(emulator, session)


def pod_body(
    name: str = "p",
    *,
    annotations: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
) -> JSONDict:
    main: JSONDict = {"name": "main", "image": "busybox"}
    if resources is not None:
        main["resources"] = resources
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": [main]},
    }


def invalid(name: str, causes: list[tuple[str, str, str]]) -> JSONDict:
    """The Status of a 422, each cause as (reason, message, field)."""
    listed = [f"{where}: {message}" for _, message, where in causes]
    text = listed[0] if len(listed) == 1 else "[" + ", ".join(listed) + "]"
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'Pod "{name}" is invalid: {text}',
        "reason": "Invalid",
        "details": {
            "name": name,
            "kind": "Pod",
            "causes": [
                {"reason": reason, "message": message, "field": where}
                for reason, message, where in causes
            ],
        },
        "code": 422,
    }


TOO_LONG = [
    ("FieldValueTooLong", "Too long: must have at most 262144 bytes", "metadata.annotations")
]


async def test_annotations_over_256_kib_in_total_are_refused(raw: Raw) -> None:
    # Keys count too: "a" and "b" with 131071 bytes each make exactly 262144 bytes; a key one
    # byte longer is over the limit, though no single value is near it.
    at_limit = {"a": "x" * 131071, "b": "x" * 131071}
    over = {"a": "x" * 131071, "bb": "x" * 131071}

    refused, status = await raw.call("POST", PODS, pod_body("over", annotations=over))
    created, _ = await raw.call("POST", PODS, pod_body("at-limit", annotations=at_limit))

    assert (refused, status) == (422, invalid("over", TOO_LONG))
    assert created == 201


async def test_an_update_over_the_annotation_limit_is_refused_and_changes_nothing(
    raw: Raw,
) -> None:
    created, body = await raw.call("POST", PODS, pod_body("p", annotations={"a": "1"}))
    assert created == 201

    patch = {"metadata": {"annotations": {"big": "x" * (1 << 20)}}}
    refused, status = await raw.call("PATCH", f"{PODS}/p", patch, "application/merge-patch+json")
    _, after = await raw.call("GET", f"{PODS}/p", None)

    assert (refused, status) == (422, invalid("p", TOO_LONG))
    assert after["metadata"]["annotations"] == {"a": "1"}
    assert after["metadata"]["resourceVersion"] == body["metadata"]["resourceVersion"]


async def test_negative_quantities_are_refused(raw: Raw) -> None:
    negative_request = pod_body("cpu", resources={"requests": {"cpu": "-1"}})
    # The request defaults to the limit before validation, so both are negative.
    negative_limit = pod_body("gpu", resources={"limits": {"nvidia.com/gpu": "-1"}})

    cpu = await raw.call("POST", PODS, negative_request)
    gpu = await raw.call("POST", PODS, negative_limit)

    negative = 'Invalid value: "-1": must be greater than or equal to 0'
    assert cpu == (
        422,
        invalid(
            "cpu",
            [("FieldValueInvalid", negative, "spec.containers[0].resources.requests[cpu]")],
        ),
    )
    assert gpu == (
        422,
        invalid(
            "gpu",
            [
                (
                    "FieldValueInvalid",
                    negative,
                    "spec.containers[0].resources.limits[nvidia.com/gpu]",
                ),
                (
                    "FieldValueInvalid",
                    negative,
                    "spec.containers[0].resources.requests[nvidia.com/gpu]",
                ),
            ],
        ),
    )


@pytest.mark.parametrize(
    ("resources", "cause"),
    [
        (
            {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "1"}},
            (
                "FieldValueInvalid",
                'Invalid value: "2": must be equal to nvidia.com/gpu limit of 1',
                "spec.containers[0].resources.requests",
            ),
        ),
        (
            {"requests": {"nvidia.com/gpumem": "100"}, "limits": {"nvidia.com/gpumem": "200"}},
            (
                "FieldValueInvalid",
                'Invalid value: "100": must be equal to nvidia.com/gpumem limit of 200',
                "spec.containers[0].resources.requests",
            ),
        ),
        (
            {"requests": {"nvidia.com/gpu": "1"}},
            (
                "FieldValueRequired",
                "Required value: Limit must be set for non overcommitable resources",
                "spec.containers[0].resources.limits",
            ),
        ),
        (
            {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
            (
                "FieldValueInvalid",
                'Invalid value: "2": must be less than or equal to cpu limit of 1',
                "spec.containers[0].resources.requests",
            ),
        ),
    ],
)
async def test_requests_must_keep_to_their_limits(
    raw: Raw, resources: dict[str, Any], cause: tuple[str, str, str]
) -> None:
    assert await raw.call("POST", PODS, pod_body("r", resources=resources)) == (
        422,
        invalid("r", [cause]),
    )


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {"nvidia.com/gpu": "1"}},  # the request defaults to the limit
        {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": "1"}},
        {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}},  # cpu may be overcommitted
        {"requests": {"cpu": "1000m", "memory": "0"}, "limits": {"cpu": "1"}},
        {"requests": {"memory": "1Gi"}},  # a native resource needs no limit
    ],
)
async def test_valid_resources_are_created(raw: Raw, resources: dict[str, Any]) -> None:
    created, body = await raw.call("POST", PODS, pod_body("ok", resources=resources))
    assert created == 201, body
