"""How much a replaced reservation adds to a node, counted as a snapshot counts a pod
(d.2: `Used += max(Slots, 1)`); what it frees is not given back."""

from __future__ import annotations

from shared.core.model import DeviceInfo, DeviceUsage, NodeSnapshot, Usage
from shared.core.nodes import usage_growth, with_added, without_pod

GPU_A = DeviceInfo("GPU-a", 0, 10, 40000, 100, "NVIDIA A100", 0)
GPU_B = DeviceInfo("GPU-b", 1, 10, 40000, 100, "NVIDIA A100", 0)


def test_growth_per_device() -> None:
    old = {"GPU-a": Usage(20000, 30, 1), "GPU-b": Usage(10000, 10, 0)}
    new = {"GPU-a": Usage(25000, 20, 1), "GPU-b": Usage(10000, 10, 2), "GPU-c": Usage(1, 0, 0)}
    assert usage_growth(old, new) == {
        "GPU-a": Usage(5000, 0, 0),  # more memory, fewer cores: only the growth counts
        "GPU-b": Usage(0, 0, 1),  # 0 slots were counted as 1
        "GPU-c": Usage(1, 0, 1),  # a new device counts one slot
    }
    assert usage_growth(new, new) == {}
    assert usage_growth(new, {}) == {}  # moving away frees nothing here


def test_added_and_taken_out_as_a_snapshot_counts() -> None:
    node = NodeSnapshot("n", [DeviceUsage(GPU_A, 2, 30000, 60), DeviceUsage(GPU_B)])
    added = with_added(node, [{"GPU-a": Usage(1000, 10, 1)}, {"GPU-b": Usage(5, 5, 1)}])
    assert [d.as_dict() for d in added.devices] == [
        {"used": 3, "usedmem": 31000, "usedcores": 70},
        {"used": 1, "usedmem": 5, "usedcores": 5},
    ]
    assert node.devices[0].used == 2  # the snapshot given is not modified
    taken = without_pod(node, {"GPU-a": Usage(30000, 60, 0)})
    assert taken.devices[0].as_dict() == {"used": 1, "usedmem": 0, "usedcores": 0}
