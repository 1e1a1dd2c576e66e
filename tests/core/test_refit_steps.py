"""The refit decision's named steps, one by one, and `decide_refit` as their composition."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core import keys
from shared.core.config import CoreConfig
from shared.core.nodes import without_pod
from shared.core.refit import (
    Code,
    RefitDecision,
    Reservation,
    RestrictedFit,
    already_aligned,
    check_positional_quota,
    check_refittable,
    check_request,
    decide_refit,
    find_container_entry,
    find_pod,
    find_reservation,
    restricted_fit,
    rewrite,
)
from shared.tools.plan import Case, load_case, run_plan
from tests.builders import case, container, gpu, node, pod, refit_request


def worked(allowed: list[str] | None = None, **request_extra: Any) -> Case:
    target = pod(
        "train",
        init=[container("prep", 1, 30000, 60)],
        containers=[container("main", 1, 20000, 30)],
        allocated="GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;",
        to_allocate=";GPU-a,NVIDIA,20000,30:;",
        namespace="ml",
    )
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0)])
    request = refit_request(target, 1, ["GPU-b"] if allowed is None else allowed, **request_extra)
    return load_case(case(nodes, [target], request))


def refusal_code(value: object) -> Code:
    assert isinstance(value, RefitDecision) and not value.succeeded
    return value.code


# --- rows 1-5: the request alone ------------------------------------------------------------


def test_a_complete_request_passes_the_request_checks() -> None:
    assert check_request(worked().request) is None


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"podUID": ""}, Code.INVALID_REQUEST),
        ({"nodeName": ""}, Code.INVALID_REQUEST),
        ({"allowedDeviceUUIDs": []}, Code.INVALID_REQUEST),
        ({"allowedDeviceUUIDs": [f"GPU-{i}" for i in range(513)]}, Code.INVALID_REQUEST),
        ({"deviceType": "Quantum"}, Code.UNKNOWN_DEVICE_TYPE),
        ({"deviceType": "Ascend"}, Code.UNSUPPORTED_DEVICE_TYPE),
    ],
)
def test_request_checks_refuse_without_an_event_and_match_decide_refit(
    extra: dict[str, Any], code: Code
) -> None:
    request = worked(**extra).request
    early = check_request(request)
    assert early is not None and early.code is code and early.event is None
    # What a caller without pods or node got before (svc_refit's early check) is the same.
    assert decide_refit(request, pods={}, node=None) == early
    full = worked(**extra)
    assert decide_refit(full.request, pods=full.pods, node=full.node, quota=full.quota) == early


# --- rows 6-13: locating the reservation ----------------------------------------------------


def test_the_reservation_is_the_pending_entry_and_the_recorded_rows() -> None:
    c = worked()
    found = find_reservation(c.request, c.pods)
    assert isinstance(found, Reservation)
    assert found.index == 1 and found.pod.name == "train"
    assert [d.uuid for d in found.current] == ["GPU-a"]
    assert [[d.uuid for d in row] for row in found.rows] == [["GPU-b"], ["GPU-a"], []]


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"podUID": "someone-else"}, Code.POD_NOT_TRACKED),
        ({"podName": "other"}, Code.POD_MISMATCH),
        ({"nodeName": "node-2"}, Code.NODE_MISMATCH),
    ],
)
def test_find_pod_refuses_in_order(extra: dict[str, Any], code: Code) -> None:
    c = worked(**extra)
    assert refusal_code(find_pod(c.request, c.pods)) is code


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"containerIndex": 2}, Code.CONTAINER_OUT_OF_RANGE),
        ({"containerName": "prep"}, Code.CONTAINER_NAME_MISMATCH),
        ({"containerIndex": 0, "containerName": ""}, Code.NOTHING_PENDING),
    ],
)
def test_find_container_entry_refuses_in_order(extra: dict[str, Any], code: Code) -> None:
    c = worked(**extra)
    tracked = c.pods[c.request.pod_uid]
    assert refusal_code(find_container_entry(c.request, tracked)) is code


# --- row 14 and rows 15-17 ------------------------------------------------------------------


def test_already_aligned_only_when_every_device_is_allowed() -> None:
    c = worked(["GPU-a", "GPU-b"])
    found = find_reservation(c.request, c.pods)
    assert isinstance(found, Reservation)
    aligned = already_aligned(c.request, found)
    assert aligned is not None and aligned.code is Code.ALREADY_ALIGNED
    assert aligned.container_devices == found.current and aligned.annotations is None
    moving = worked()
    found = find_reservation(moving.request, moving.pods)
    assert isinstance(found, Reservation)
    assert already_aligned(moving.request, found) is None


def test_check_refittable_passes_the_node_on_and_refuses_a_missing_one() -> None:
    c = worked()
    found = find_reservation(c.request, c.pods)
    assert isinstance(found, Reservation)
    assert check_refittable(c.request, found, c.node) is c.node
    assert refusal_code(check_refittable(c.request, found, None)) is Code.NODE_UNAVAILABLE


# --- rows 18-22 -----------------------------------------------------------------------------


def test_the_last_steps_compose_to_decide_refit() -> None:
    c = worked()
    found = find_reservation(c.request, c.pods)
    assert isinstance(found, Reservation) and c.node is not None
    fitted = restricted_fit(c.request, found, c.node, c.quota, CoreConfig())
    assert isinstance(fitted, RestrictedFit)
    assert [d.uuid for d in fitted.moved] == ["GPU-b"]
    usage = check_positional_quota(found, fitted, c.quota)
    assert not isinstance(usage, RefitDecision)
    decision = rewrite(found, fitted, usage)
    assert decision == decide_refit(c.request, pods=c.pods, node=c.node, quota=c.quota)
    assert decision.annotations == {
        keys.TO_ALLOCATE: ";GPU-b,NVIDIA,20000,30:;",
        keys.ALLOCATED: "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;",
    }


def test_plan_replaces_the_pods_stored_usage_with_the_core_rule() -> None:
    c = worked()
    result = run_plan(c)
    assert c.node is not None and result.decision.stored_usage is not None
    expected = without_pod(c.node, c.pods[c.request.pod_uid].usage)
    expected.add_pod_usage(result.decision.stored_usage)
    assert result.node_after == expected
    assert result.node_after is not c.node  # the case's snapshot is left as it was
