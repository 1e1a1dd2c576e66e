"""The refit decision, row by row of reference (f), plus e.7, #2828 and its invariants."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import keys
from shared.core.accounting import effective, track_pod
from shared.core.fit import FitOptions, fit_container, restrict
from shared.core.model import (
    ContainerDevice,
    DeviceInfo,
    DeviceUsage,
    NodeSnapshot,
    Usage,
    snapshot_of,
)
from shared.core.pods import pod_from_object
from shared.core.policy import parse_policy
from shared.core.refit import preload
from shared.core.requests import ContainerRequest
from shared.tools.plan import load_case, run_plan
from tests.builders import case, container, gpu, node, pod, quota, refit_request

HANDOUT = Path(__file__).resolve().parents[3] / "shared" / "examples"
BUNDLED = Path(__file__).resolve().parents[2] / "shared" / "data" / "plan-worked-example.json"


def decide(case_obj: dict[str, Any]) -> dict[str, Any]:
    return run_plan(load_case(case_obj)).to_json()


def two_gpu_node(**kw: Any) -> dict[str, Any]:
    return node("node-1", [gpu("GPU-a", 1, **kw), gpu("GPU-b", 0, **kw)])


def worked_pod(**kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "init": [container("prep", 1, 30000, 60)],
        "containers": [container("main", 1, 20000, 30)],
        "allocated": "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;",
        "to_allocate": ";GPU-a,NVIDIA,20000,30:;",
        "namespace": "ml",
    }
    spec.update(kw)
    return pod("train", **spec)


def worked_case(**request_extra: Any) -> dict[str, Any]:
    target = worked_pod()
    return case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"], **request_extra))


# --- the worked example ---------------------------------------------------------------------


def test_worked_example_matches_the_expected_answer_byte_for_byte() -> None:
    example = json.loads(BUNDLED.read_text())
    answer = decide(example)
    expected_path = HANDOUT / "plan-worked-example.expected.json"
    if expected_path.exists():  # the handout beside the repo, when present
        expected = json.loads(expected_path.read_text())
    else:
        expected = {
            "succeeded": True,
            "code": "moved",
            "containerDevices": "GPU-b,NVIDIA,20000,30:",
            "annotations": {
                keys.TO_ALLOCATE: ";GPU-b,NVIDIA,20000,30:;",
                keys.ALLOCATED: "GPU-b,NVIDIA,30000,60:;GPU-b,NVIDIA,20000,30:;",
            },
        }
    for key, value in expected.items():
        assert answer[key] == value


def test_worked_example_built_from_builders_moves_and_records_an_event() -> None:
    answer = decide(worked_case())
    assert answer["code"] == "moved"
    assert answer["event"] == {
        "type": "Normal",
        "reason": "NumaRefitSucceed",
        "message": "NUMA refit moved container 1 from [GPU-a] to [GPU-b]",
    }
    assert answer["nodeUsage"]["GPU-b"] == {"used": 1, "usedmem": 30000, "usedcores": 60}


# --- every refusal row, in order ------------------------------------------------------------


def refusal(case_obj: dict[str, Any]) -> dict[str, Any]:
    answer = decide(case_obj)
    assert answer["succeeded"] is False
    assert "annotations" not in answer  # nothing would be patched
    return answer


@pytest.mark.parametrize("field", ["podUID", "podNamespace", "podName", "nodeName"])
def test_row1_incomplete_request(field: str) -> None:
    answer = refusal(worked_case(**{field: ""}))
    assert answer["code"] == "invalid_request"
    assert "incomplete refit request" in answer["failureReason"]
    assert "event" not in answer


def test_row2_empty_allowed_set() -> None:
    target = worked_pod()
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, [])))
    assert (answer["code"], answer["failureReason"]) == (
        "invalid_request",
        "empty allowed device set",
    )


def test_row3_more_than_512_allowed() -> None:
    target = worked_pod()
    allowed = [f"GPU-{i}" for i in range(513)]
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, allowed)))
    assert answer["code"] == "invalid_request"
    assert "allowed devices, limit is 512" in answer["failureReason"]


def test_row3_boundary_512_is_accepted() -> None:
    target = worked_pod()
    allowed = ["GPU-b"] + [f"GPU-{i}" for i in range(511)]
    assert (
        decide(case(two_gpu_node(), [target], refit_request(target, 1, allowed)))["code"] == "moved"
    )


def test_row4_unknown_device_type() -> None:
    answer = refusal(worked_case(deviceType="Quantum"))
    assert (
        answer["code"] == "unknown_device_type" and "unknown device type" in answer["failureReason"]
    )


def test_row5_registered_but_unsupported_device_type() -> None:
    answer = refusal(worked_case(deviceType="Ascend"))
    assert answer["code"] == "unsupported_device_type"
    assert "not supported by the NUMA refit yet" in answer["failureReason"]


def test_row6_pod_not_tracked() -> None:
    answer = refusal(worked_case(podUID="someone-else"))
    assert (
        answer["code"] == "pod_not_tracked"
        and "not tracked by the scheduler" in answer["failureReason"]
    )
    assert "event" not in answer


def test_row6_a_pod_without_a_reservation_is_not_tracked() -> None:
    bare = pod("bare", containers=[container("c")], namespace="ml")
    answer = refusal(case(two_gpu_node(), [bare], refit_request(bare, 0, ["GPU-b"])))
    assert answer["code"] == "pod_not_tracked"


@pytest.mark.parametrize("field", ["podNamespace", "podName"])
def test_row7_identity_mismatch(field: str) -> None:
    answer = refusal(worked_case(**{field: "other"}))
    assert answer["code"] == "pod_mismatch" and "does not match" in answer["failureReason"]


def test_row8_tracked_on_another_node() -> None:
    answer = refusal(worked_case(nodeName="node-2"))
    assert (
        answer["code"] == "node_mismatch" and "is tracked on node node-1" in answer["failureReason"]
    )
    assert answer["event"]["type"] == "Warning" and answer["event"]["reason"] == "NumaRefitFailed"


@pytest.mark.parametrize("index", [-1, 2, 3, 2**40])
def test_row9_container_index_outside_the_spec(index: int) -> None:
    # Index 2 would address the decoder's trailing entry: the spec check comes first.
    answer = refusal(worked_case(containerIndex=index, containerName=""))
    assert answer["code"] == "container_out_of_range"
    assert "outside the pod's containers" in answer["failureReason"]


def test_row10_container_name_mismatch() -> None:
    answer = refusal(worked_case(containerName="other"))
    assert answer["code"] == "container_name_mismatch"
    assert 'is "main", not "other"' in answer["failureReason"]


def test_row10_absent_name_is_not_checked() -> None:
    assert decide(worked_case(containerName=""))["code"] == "moved"


@pytest.mark.parametrize(
    ("allocated", "to_allocate", "fragment"),
    [
        (
            "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,x,30:;",
            ";GPU-a,NVIDIA,20000,30:;",
            "cannot decode allocated annotation",
        ),
        (
            "GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;",
            ";GPU-a,NVIDIA:;",
            "cannot decode pending allocation annotation",
        ),
    ],
)
def test_row11_undecodable_annotations(allocated: str, to_allocate: str, fragment: str) -> None:
    target = worked_pod(allocated=allocated, to_allocate=to_allocate)
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "annotation_invalid" and fragment in answer["failureReason"]
    assert answer["event"]["reason"] == "NumaRefitFailed"


def test_row12_entry_already_consumed_by_allocate() -> None:
    target = worked_pod(to_allocate=";;")
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "nothing_pending"
    assert "has no pending NVIDIA allocation to refit" in answer["failureReason"]


def test_row13_no_recorded_allocation() -> None:
    target = worked_pod(allocated="GPU-b,NVIDIA,30000,60:;;")
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "nothing_recorded"
    assert "has no recorded NVIDIA allocation" in answer["failureReason"]


def test_row14_already_aligned_is_a_no_op_success() -> None:
    target = worked_pod()
    before = decide(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-x"])))[
        "nodeUsage"
    ]
    answer = decide(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-a", "GPU-b"])))
    assert answer["succeeded"] is True and answer["code"] == "already_aligned"
    assert answer["containerDevices"] == "GPU-a,NVIDIA,20000,30:"
    assert "annotations" not in answer
    assert answer["nodeUsage"] == before


def test_row15_heterogeneous_reservation() -> None:
    target = pod(
        "multi",
        containers=[container("c", 2, 1000)],
        namespace="ml",
        allocated="GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,2000,10:;",
    )
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0), gpu("GPU-c", 0)])
    answer = refusal(case(nodes, [target], refit_request(target, 0, ["GPU-c"])))
    assert (
        answer["code"] == "heterogeneous_reservation" and "heterogeneous" in answer["failureReason"]
    )


def test_row16_node_unregistered() -> None:
    target = worked_pod()
    bare_node = {"metadata": {"name": "node-1"}}
    answer = refusal(case(bare_node, [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "node_unavailable"
    assert answer["failureReason"] == "node node-1 unavailable: node unregistered"
    assert answer["nodeUsage"] == {}


def test_row17_mig_device_in_allowed_set() -> None:
    target = worked_pod()
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0, mode="mig")])
    answer = refusal(case(nodes, [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "mig_unsupported"
    assert "is in MIG mode; the NUMA refit does not support MIG" in answer["failureReason"]


def test_row18_invalid_scoring_weights() -> None:
    target = worked_pod(annotations={keys.SCORING_WEIGHTS: "slot=1"})
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "invalid_scoring_weights"
    assert "invalid device scoring weights" in answer["failureReason"]


def test_row18_another_invalid_annotation_is_named_as_such() -> None:
    # A pod admitted before numafit refused such values: the fit cannot read its settings.
    target = worked_pod(annotations={keys.GPU_POLICY: "bogus"})
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["code"] == "annotation_invalid"
    assert "invalid pod annotation: hami.io/gpu-scheduler-policy 'bogus'" in answer["failureReason"]


def test_row19_no_allowed_device_fits_with_fit_reasons() -> None:
    target = worked_pod()
    other = pod(
        "other",
        containers=[container("c", 1, 15000)],
        namespace="ml",
        allocated="GPU-b,NVIDIA,15000,0:;",
    )
    answer = refusal(case(two_gpu_node(), [target, other], refit_request(target, 1, ["GPU-b"])))
    # GPU-b: 15000 (other) + max(30000, 20000) = 45000 > 40000.
    assert answer["code"] == "no_fit"
    assert answer["failureReason"] == "no allowed device fits: 1/1 CardInsufficientMemory"
    assert answer["fitReasons"] == {"CardInsufficientMemory": 1}


def test_row19_replica_ids_instead_of_uuids_are_told_apart() -> None:
    # HAMi's contract wants physical UUIDs: replica IDs are refused with the distinct reason
    # (not mapped), and the reason names the GPU each one belongs to.
    answer = refusal(worked_case(allowedDeviceUUIDs=["GPU-b-0", "GPU-b::1"]))
    assert answer["code"] == "no_fit"
    assert answer["fitReasons"] == {"AllowedDeviceSetUnmatched": 1}
    assert answer["failureReason"] == (
        "no allowed device fits: AllowedDeviceSetUnmatched: no allowed ID names a GPU of node "
        "node-1: allowedDeviceUUIDs takes physical GPU UUIDs, not replica IDs (GPU-b-0 is a "
        "replica of GPU-b, GPU-b::1 is a replica of GPU-b)"
    )


def test_row19_unknown_ids_are_listed_beside_the_nodes_gpus() -> None:
    answer = refusal(worked_case(allowedDeviceUUIDs=["GPU-x", "GPU-y", "GPU-z", "GPU-w"]))
    assert answer["fitReasons"] == {"AllowedDeviceSetUnmatched": 1}
    assert answer["failureReason"] == (
        "no allowed device fits: AllowedDeviceSetUnmatched: no allowed ID names a GPU of node "
        "node-1 (allowed: GPU-x, GPU-y, GPU-z, ...; the node's GPUs: GPU-a, GPU-b)"
    )


def test_row19_pinned_pod_is_never_moved_off_its_pins() -> None:
    target = worked_pod(annotations={keys.USE_UUID: "GPU-a"})
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["fitReasons"] == {"CardUuidMismatch": 1}


def test_row19_mutex_policy_refuses_a_used_device() -> None:
    target = worked_pod(annotations={keys.GPU_POLICY: "mutex"})
    other = pod(
        "other",
        containers=[container("c", 1, 100)],
        namespace="ml",
        allocated="GPU-b,NVIDIA,100,0:;",
    )
    answer = refusal(case(two_gpu_node(), [target, other], refit_request(target, 1, ["GPU-b"])))
    assert answer["fitReasons"] == {"ExclusiveDeviceAllocateConflict": 1}


def test_cordoned_allowed_device_is_refused() -> None:
    target = worked_pod()
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0)], cordon="GPU-b")
    answer = refusal(case(nodes, [target], refit_request(target, 1, ["GPU-b"])))
    assert answer["fitReasons"] == {"CardCordoned": 1}


# --- phase-aware capacity (e.7, #2856) ------------------------------------------------------


def test_e7_moving_a_regular_init_next_to_its_app_uses_the_peak() -> None:
    target = pod(
        "p",
        init=[container("init", 1, 30000)],
        containers=[container("app", 1, 20000)],
        allocated="GPU-a,NVIDIA,30000,0:;GPU-b,NVIDIA,20000,0:;",
    )
    answer = decide(case(two_gpu_node(), [target], refit_request(target, 0, ["GPU-b"])))
    assert answer["code"] == "moved"
    assert answer["annotations"][keys.ALLOCATED] == "GPU-b,NVIDIA,30000,0:;GPU-b,NVIDIA,20000,0:;"
    assert answer["nodeUsage"]["GPU-b"] == {"used": 1, "usedmem": 30000, "usedcores": 0}
    assert answer["nodeUsage"]["GPU-a"]["usedmem"] == 0


def test_e7_moving_a_sidecar_next_to_the_app_is_refused() -> None:
    target = pod(
        "p",
        init=[container("side", 1, 30000, sidecar=True)],
        containers=[container("app", 1, 20000)],
        allocated="GPU-a,NVIDIA,30000,0:;GPU-b,NVIDIA,20000,0:;",
    )
    answer = refusal(case(two_gpu_node(), [target], refit_request(target, 0, ["GPU-b"])))
    assert answer["fitReasons"] == {"CardInsufficientMemory": 1}


def test_released_pod_is_refitted_on_its_steady_state() -> None:
    # The init exited 0 (released): its 35000 on GPU-b no longer counts, so the app fits there.
    target = pod(
        "p",
        init=[container("init", 1, 35000)],
        containers=[container("app", 1, 20000), container("app2", 1, 1000)],
        allocated="GPU-b,NVIDIA,35000,0:;GPU-b,NVIDIA,20000,0:;GPU-a,NVIDIA,1000,0:;",
        to_allocate=";;GPU-a,NVIDIA,1000,0:;",
        init_exit={"init": 0},
    )
    answer = decide(case(two_gpu_node(), [target], refit_request(target, 2, ["GPU-b"])))
    assert answer["code"] == "moved"
    assert answer["nodeUsage"]["GPU-b"] == {"used": 2, "usedmem": 21000, "usedcores": 0}


# --- quota (e.6, #2828) ---------------------------------------------------------------------


def test_2828_quota_counts_original_positions() -> None:
    target = pod(
        "q",
        init=[container("init", 1, 5000)],
        containers=[container("a1", 1, 5000), container("a2", 1, 5000)],
        namespace="team",
        allocated="GPU-a,NVIDIA,5000,0:;GPU-a,NVIDIA,5000,0:;GPU-a,NVIDIA,5000,0:;",
    )
    limit = [quota("team", {"limits.nvidia.com/gpumem": "12000"})]
    answer = refusal(
        case(two_gpu_node(), [target], refit_request(target, 0, ["GPU-b"]), quotas=limit)
    )
    # GPU-a keeps the apps' 10000, GPU-b gains the init's 5000: 15000 > 12000.
    assert answer["code"] == "quota_exceeded"
    assert answer["fitReasons"] == {"ResourceQuotaNotFit": 1}
    roomy = [quota("team", {"limits.nvidia.com/gpumem": "15000"})]
    assert (
        decide(case(two_gpu_node(), [target], refit_request(target, 0, ["GPU-b"]), quotas=roomy))[
            "code"
        ]
        == "moved"
    )


def test_quota_does_not_count_the_pod_against_itself() -> None:
    target = worked_pod()
    limit = [
        quota("ml", {"requests.nvidia.com/gpumem": "30000", "requests.nvidia.com/gpucores": "60"})
    ]
    answer = decide(
        case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"]), quotas=limit)
    )
    assert answer["code"] == "moved"  # 30000 before (peak) and 30000 after


def test_quota_in_other_namespaces_is_ignored_and_memory_factor_applies() -> None:
    target = worked_pod()
    other_ns = [quota("elsewhere", {"limits.nvidia.com/gpumem": "1"})]
    assert (
        decide(
            case(two_gpu_node(), [target], refit_request(target, 1, ["GPU-b"]), quotas=other_ns)
        )["code"]
        == "moved"
    )
    tight = [quota("ml", {"limits.nvidia.com/gpumem": "20000"})]
    scaled = case(
        two_gpu_node(),
        [target],
        refit_request(target, 1, ["GPU-b"]),
        quotas=tight,
        config={"memoryFactor": 2},
    )
    assert decide(scaled)["code"] == "moved"  # 20000 x 2 = 40000 >= 30000


# --- invariants -----------------------------------------------------------------------------

GPUS = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]
_placement = st.tuples(
    st.sampled_from(["init", "side", "app"]),
    st.sampled_from(GPUS),
    st.integers(1, 9000),
    st.integers(0, 20),
)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    items = draw(st.lists(_placement, min_size=1, max_size=5))
    items.sort(key=lambda i: i[0] == "app")
    init = [
        container(f"c{i}", 1, m, c, sidecar=k == "side")
        for i, (k, _, m, c) in enumerate(items)
        if k != "app"
    ]
    apps = [container(f"c{i}", 1, m, c) for i, (k, _, m, c) in enumerate(items) if k == "app"]
    allocated = "".join(f"{u},NVIDIA,{m},{c}:;" for _, u, m, c in items)
    return pod("p", init=init, containers=apps, allocated=allocated), draw(
        st.integers(0, len(items) - 1)
    )


def four_gpu_node() -> dict[str, Any]:
    return node("node-1", [gpu(u, i % 2, mem=80000) for i, u in enumerate(GPUS)])


@settings(max_examples=60, deadline=None)
@given(scenario(), st.lists(st.sampled_from(GPUS), max_size=3))
def test_allowed_set_holding_the_current_devices_changes_nothing(
    built: tuple[dict[str, Any], int], extra: list[str]
) -> None:
    target, index = built
    current = target["metadata"]["annotations"][keys.ALLOCATED].split(";")[index].split(",")[0]
    before = decide(case(four_gpu_node(), [target], refit_request(target, index, ["GPU-none"])))
    answer = decide(
        case(
            four_gpu_node(),
            [copy.deepcopy(target)],
            refit_request(target, index, [current, *extra]),
        )
    )
    assert answer["code"] == "already_aligned"
    assert "annotations" not in answer
    assert answer["nodeUsage"] == before["nodeUsage"]


_device = st.builds(
    lambda numa, used, mem, cores, healthy: (numa, used, mem, cores, healthy),
    st.integers(0, 1),
    st.integers(0, 10),
    st.integers(0, 40000),
    st.integers(0, 100),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_device, min_size=1, max_size=8),
    st.sampled_from(["spread", "binpack", "mutex", "numa,binpack", "spread,numa"]),
    st.booleans(),
    st.integers(1, 3),
    st.integers(0, 40000),
    st.integers(0, 100),
    st.data(),
)
def test_restricted_fit_equals_the_fit_on_a_node_of_only_the_allowed_devices(
    specs: list[tuple[int, int, int, int, bool]],
    policy: str,
    numa_bind: bool,
    nums: int,
    mem: int,
    cores: int,
    data: st.DataObject,
) -> None:
    devices = [
        DeviceUsage(
            DeviceInfo(f"G{i}", i, 10, 40000, 100, "NVIDIA A100", numa, health=ok), used, um, uc
        )
        for i, (numa, used, um, uc, ok) in enumerate(specs)
    ]
    full = NodeSnapshot("n", devices)
    options = FitOptions(parse_policy(policy), numa_bind=numa_bind)
    request = ContainerRequest(nums, memreq=mem, coresreq=cores)
    everything = frozenset(d.info.id for d in devices)
    assert fit_container(
        restrict(full, everything, keys.NVIDIA), request, options, 0, {}
    ) == fit_container(full, request, options, 0, {})
    allowed = frozenset(data.draw(st.sets(st.sampled_from(sorted(everything)), min_size=1)))
    only = NodeSnapshot("n", [d.copy() for d in devices if d.info.id in allowed])
    assert fit_container(
        restrict(full, allowed, keys.NVIDIA), request, options, 0, {}
    ) == fit_container(only, request, options, 0, {})
    assert full.devices == devices  # the original snapshot is never touched


def test_decide_refit_does_not_mutate_its_inputs() -> None:
    loaded = load_case(worked_case())
    before = copy.deepcopy(loaded.node)
    run_plan(loaded)
    assert loaded.node == before


def test_config_policy_reaches_the_refit() -> None:
    target = worked_pod()
    busy = pod(
        "busy",
        containers=[container("c", 1, 1000)],
        namespace="ml",
        allocated="GPU-c,NVIDIA,1000,0:;",
    )
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0), gpu("GPU-c", 0)])
    spread = decide(case(nodes, [target, busy], refit_request(target, 1, ["GPU-b", "GPU-c"])))
    binpack = decide(
        case(
            nodes,
            [target, busy],
            refit_request(target, 1, ["GPU-b", "GPU-c"]),
            config={"gpuSchedulerPolicy": "binpack"},
        )
    )
    # With prep's peak preloaded, GPU-b scores 14.5 and GPU-c 10.25 for main's 20000 MiB/30%:
    # spread takes the emptier GPU-c, binpack the fuller GPU-b.
    assert spread["containerDevices"] == "GPU-c,NVIDIA,20000,30:"
    assert binpack["containerDevices"] == "GPU-b,NVIDIA,20000,30:"


@settings(max_examples=200, deadline=None)
@given(scenario(), st.sampled_from(GPUS), st.booleans())
def test_preload_plus_the_moved_container_is_the_pods_usage_after_the_move(
    built: tuple[dict[str, Any], int], target_gpu: str, single: bool
) -> None:
    """e.8 on every shape (one GPU container, or several in every phase): the preloaded
    snapshot plus the moved container's (mem, cores, 1 slot) on its new GPU is the node with
    the pod counted at its effective usage after the move."""
    target, index = built
    if single:  # the pod's only GPU container: every other entry empty
        rows = target["metadata"]["annotations"][keys.ALLOCATED].split(";")
        kept = ";".join(r if p == index else "" for p, r in enumerate(rows))
        target["metadata"]["annotations"][keys.ALLOCATED] = kept
        target["metadata"]["annotations"][keys.TO_ALLOCATE] = kept
    tracked = track_pod(pod_from_object(target))
    assert tracked is not None and tracked.rows is not None
    infos = [DeviceInfo(u, i, 10, 80000, 100, "NVIDIA A100", i % 2) for i, u in enumerate(GPUS)]
    other = {"GPU-a": Usage(1000, 5, 1), "GPU-c": Usage(3000, 10, 1)}
    base = snapshot_of("node-1", infos)
    base.add_pod_usage(other)
    counted = NodeSnapshot("node-1", [d.copy() for d in base.devices])
    counted.add_pod_usage(tracked.usage)

    preloaded = preload(counted, tracked, index, frozenset({target_gpu}), keys.NVIDIA)

    moved = tracked.rows[index][0]
    after = list(tracked.rows)
    after[index] = (ContainerDevice(target_gpu, keys.NVIDIA, moved.usedmem, moved.usedcores),)
    expected = NodeSnapshot("node-1", [d.copy() for d in base.devices])
    expected.add_pod_usage(effective(tracked.pod.kinds, after, tracked.released))
    landed = preloaded.by_uuid()
    landed[target_gpu].add(Usage(moved.usedmem, moved.usedcores, 1))
    assert preloaded.usage_table() == expected.usage_table()
    assert counted.usage_table() != base.usage_table()  # the input is left as it was
