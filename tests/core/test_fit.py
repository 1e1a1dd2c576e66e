"""The per-device checks of reference d.5, reason strings, and whole-pod fitting (d.6)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core import fit as f
from shared.core import keys
from shared.core.config import CoreConfig
from shared.core.errors import AnnotationError
from shared.core.fit import (
    FitOptions,
    apply_entry,
    fit_container,
    fit_options,
    fit_pod,
    format_reasons,
)
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot
from shared.core.policy import parse_policy
from shared.core.quota import QuotaLedger, QuotaLimit, QuotaProbe
from shared.core.requests import ContainerRequest

S, I, A = ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP  # noqa: E741


def device(
    uuid: str = "GPU-a",
    numa: int = 0,
    *,
    used: int = 0,
    usedmem: int = 0,
    usedcores: int = 0,
    index: int = 0,
    **info: Any,
) -> DeviceUsage:
    fields: dict[str, Any] = {
        "count": 10,
        "devmem": 40000,
        "devcore": 100,
        "type": "NVIDIA A100",
        "mode": "hami-core",
        "health": True,
    }
    fields.update(info)
    return DeviceUsage(DeviceInfo(uuid, index, numa=numa, **fields), used, usedmem, usedcores)


def options(policy: str = "spread", **kw: Any) -> FitOptions:
    return FitOptions(parse_policy(policy), **kw)


def one(
    dev: DeviceUsage,
    request: ContainerRequest | None = None,
    opts: FitOptions | None = None,
    cordon: frozenset[str] = frozenset(),
    quota: QuotaProbe | None = None,
) -> f.ContainerFit:
    node = NodeSnapshot("n", [dev], cordon)
    return fit_container(
        node,
        request or ContainerRequest(1, memreq=1000, coresreq=10),
        opts or options(),
        0,
        {},
        quota,
    )


def full_quota() -> QuotaProbe:
    ledger = QuotaLedger({"ns": QuotaLimit(mem=500)})
    return QuotaProbe(ledger, "ns", [A], False)


@pytest.mark.parametrize(
    ("dev", "request_", "opts", "cordon", "quota", "reason"),
    [
        (device(health=False), None, None, frozenset(), None, f.CARD_NOT_HEALTH),
        (device(), None, None, frozenset({"GPU-a"}), None, f.CARD_CORDONED),
        (device(), None, options(use_types=("h100",)), frozenset(), None, f.CARD_TYPE_MISMATCH),
        (device(), None, options(nouse_types=("a100",)), frozenset(), None, f.CARD_TYPE_MISMATCH),
        (device(), None, options(vgpu_mode="mig"), frozenset(), None, f.CARD_TYPE_MISMATCH),
        (
            device(),
            None,
            options(use_uuids=frozenset({"GPU-z"})),
            frozenset(),
            None,
            f.CARD_UUID_MISMATCH,
        ),
        (
            device(),
            None,
            options(nouse_uuids=frozenset({"GPU-a"})),
            frozenset(),
            None,
            f.CARD_UUID_MISMATCH,
        ),
        (device(used=10), None, None, frozenset(), None, f.CARD_TIME_SLICING_EXHAUSTED),
        (device(used=1), None, options("mutex"), frozenset(), None, f.EXCLUSIVE_CONFLICT),
        (device(), None, None, frozenset(), full_quota(), f.RESOURCE_QUOTA_NOT_FIT),
        (device(usedmem=39500), None, None, frozenset(), None, f.CARD_INSUFFICIENT_MEMORY),
        (device(usedcores=95), None, None, frozenset(), None, f.CARD_INSUFFICIENT_CORE),
        (
            device(used=1),
            ContainerRequest(1, memreq=1, coresreq=100),
            None,
            frozenset(),
            None,
            f.EXCLUSIVE_CONFLICT,
        ),
        (
            device(used=1, usedcores=100),
            ContainerRequest(1, memreq=1),
            None,
            frozenset(),
            None,
            f.CARD_COMPUTE_UNITS_EXHAUSTED,
        ),
        (device(mode="mig"), None, None, frozenset(), None, f.CARD_MIG_INFEASIBLE),
    ],
)
def test_each_check_refuses_with_hamis_reason(
    dev: DeviceUsage,
    request_: ContainerRequest | None,
    opts: FitOptions | None,
    cordon: frozenset[str],
    quota: QuotaProbe | None,
    reason: str,
) -> None:
    result = one(dev, request_, opts, cordon, quota)
    assert not result.ok
    assert dict(result.reasons) == {reason: 1}
    assert result.reason_text == f"1/1 {reason}"


def test_other_vendors_devices_are_type_mismatches() -> None:
    node = NodeSnapshot(
        "n", [device("npu", type="Ascend910B", index=0), device("GPU-a", used=10, index=1)]
    )
    result = fit_container(node, ContainerRequest(1, memreq=1), options(), 0, {})
    assert result.reason_text == "1/2 CardTimeSlicingExhausted, 1/2 CardTypeMismatch"


def test_first_failing_check_wins() -> None:
    # Unhealthy and cordoned and out of memory: only the first check is counted.
    result = one(device(health=False, usedmem=40000), cordon=frozenset({"GPU-a"}))
    assert dict(result.reasons) == {f.CARD_NOT_HEALTH: 1}


def test_cores_over_100_are_clamped_and_recorded_clamped() -> None:
    result = one(device(), ContainerRequest(1, memreq=5, coresreq=150))
    assert result.ok and result.devices[0].usedcores == 100


def test_percentage_request_is_taken_against_the_device_total() -> None:
    result = one(device(devmem=80000), ContainerRequest(1, mem_percentage=25))
    assert result.devices[0].usedmem == 20000


def test_reason_string_counts_over_devices_considered_sorted() -> None:
    node = NodeSnapshot(
        "n",
        [
            device("a", usedmem=40000, index=0),
            device("b", health=False, index=1),
            device("c", usedmem=40000, index=2),
        ],
    )
    result = fit_container(node, ContainerRequest(1, memreq=1000), options(), 0, {})
    assert result.reason_text == "1/3 CardNotHealth, 2/3 CardInsufficientMemory"
    assert format_reasons({"B": 1, "A": 2}, 4) == "1/4 B, 2/4 A"


def test_partial_picks_are_reported() -> None:
    node = NodeSnapshot("n", [device("a", index=0), device("b", usedmem=40000, index=1)])
    result = fit_container(node, ContainerRequest(2, memreq=1000), options(), 0, {})
    assert dict(result.reasons) == {f.CARD_INSUFFICIENT_MEMORY: 1, f.ALLOCATED_INSUFFICIENT: 1}


def test_node_level_refusals() -> None:
    node = NodeSnapshot("n", [device("a")])
    too_many = fit_container(node, ContainerRequest(2, memreq=1), options(), 0, {})
    assert dict(too_many.reasons) == {f.NODE_INSUFFICIENT_DEVICE: 1}
    unknown = fit_container(node, ContainerRequest(1, type="Quantum"), options(), 0, {})
    assert dict(unknown.reasons) == {f.DEVICE_TYPE_NOT_FOUND: 1}


def test_numa_bind_discards_a_run_that_cannot_complete() -> None:
    # spread + numa-bind walks NUMA 1 first: one device there, then NUMA 0 with two.
    node = NodeSnapshot(
        "n", [device("n0-a", 0, index=0), device("n0-b", 0, index=1), device("n1-a", 1, index=2)]
    )
    result = fit_container(node, ContainerRequest(2, memreq=1), options(numa_bind=True), 0, {})
    assert result.ok
    assert {d.uuid for d in result.devices} == {"n0-a", "n0-b"}
    crowded = NodeSnapshot("n", [device("n0-a", 0, index=0), device("n1-a", 1, index=1)])
    refused = fit_container(crowded, ContainerRequest(2, memreq=1), options(numa_bind=True), 0, {})
    assert dict(refused.reasons) == {f.NUMA_NOT_FIT: 1, f.ALLOCATED_INSUFFICIENT: 1}


def test_fit_options_read_annotations() -> None:
    opts = fit_options(
        {
            "nvidia.com/numa-bind": "true",
            "nvidia.com/use-gpuuuid": " GPU-a ,",
            "hami.io/gpu-scheduler-policy": "binpack",
            "nvidia.com/use-gputype": "A100, H100",
            "hami.io/device-scoring-weights": "slot=1,core=0,memory=0",
        },
        CoreConfig(),
    )
    assert (
        opts.numa_bind and opts.use_uuids == frozenset({"GPU-a"}) and opts.policy.raw == "binpack"
    )
    assert opts.use_types == ("a100", "h100") and opts.weights.core == 0
    assert fit_options({}, CoreConfig(gpu_scheduler_policy="binpack")).policy.raw == "binpack"


def gpu_b(usedmem: int = 0) -> NodeSnapshot:
    return NodeSnapshot("n", [device("GPU-b", usedmem=usedmem)])


def test_e7_init_then_app_fits_with_peak_usage() -> None:
    requests = [
        ContainerRequest(1, memreq=30000, coresreq=60),
        ContainerRequest(1, memreq=20000, coresreq=30),
    ]
    result = fit_pod(gpu_b(), requests, [I, A], options())
    assert result.ok and result.node is not None
    after = result.node.devices[0]
    assert (after.used, after.usedmem, after.usedcores) == (1, 30000, 60)


def test_e7_sidecar_plus_app_is_refused() -> None:
    requests = [ContainerRequest(1, memreq=30000), ContainerRequest(1, memreq=20000)]
    result = fit_pod(gpu_b(), requests, [S, A], options())
    assert not result.ok and result.failed_position == 1
    assert result.failure is not None and dict(result.failure.reasons) == {
        f.CARD_INSUFFICIENT_MEMORY: 1
    }


def test_regular_inits_are_fitted_into_copies_charged_with_earlier_sidecars() -> None:
    # sidecar 10000, init 25000, init 25000, app 5000 on one 40000 GPU: every phase fits.
    requests = [ContainerRequest(1, memreq=m) for m in (10000, 25000, 25000, 5000)]
    result = fit_pod(gpu_b(), requests, [S, I, I, A], options())
    assert result.ok and result.node is not None
    assert result.node.devices[0].usedmem == 35000  # max(10000 + 25000, 10000 + 5000)
    # ... but an init that cannot sit beside the sidecar declared before it is refused.
    too_big = [ContainerRequest(1, memreq=m) for m in (10000, 35000, 1000)]
    assert not fit_pod(gpu_b(), too_big, [S, I, A], options()).ok


def test_containers_without_requests_keep_empty_positions() -> None:
    result = fit_pod(gpu_b(), [None, ContainerRequest(1, memreq=1)], [I, A], options())
    assert result.ok and result.rows[0] == () and len(result.rows[1]) == 1


def test_apply_entry_counts_one_slot_per_device() -> None:
    node = gpu_b()
    fitted = fit_container(node, ContainerRequest(1, memreq=7, coresreq=3), options(), 0, {})
    apply_entry(node, fitted.devices)
    assert node.devices[0].as_dict() == {"used": 1, "usedmem": 7, "usedcores": 3}


def test_fit_options_follow_each_pods_annotations() -> None:
    """The parsed settings are remembered by value: pods with the same annotations share them,
    any difference is read, and an invalid value is refused every time."""
    config = CoreConfig()
    plain = f.fit_options({}, config)
    assert f.fit_options({"other": "x"}, config) == plain
    binpack = f.fit_options({keys.GPU_POLICY: "binpack"}, config)
    assert binpack.policy == parse_policy("binpack") and binpack != plain
    assert f.fit_options({}, CoreConfig(gpu_scheduler_policy="binpack")).policy == binpack.policy
    for _ in range(2):
        with pytest.raises(AnnotationError):
            f.fit_options({keys.SCORING_WEIGHTS: "slot=x"}, config)
