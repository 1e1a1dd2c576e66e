"""`consumed_entry`: is a consume the repeat of one already applied (a device plugin resending
a consume whose answer it never got)?"""

from __future__ import annotations

from shared.core.accounting import TrackedPod, track_pod
from shared.core.consume import consumed_entry
from shared.core.pods import pod_from_object
from tests.builders import container, pod


def tracked(allocated: str, to_allocate: str) -> TrackedPod:
    obj = pod(
        "p",
        containers=[container("a", 1, 1000), container("b", 1, 1000)],
        uid="uid-p",
        allocated=allocated,
        to_allocate=to_allocate,
    )
    entry = track_pod(pod_from_object(obj), released=False)
    assert entry is not None
    return entry


ALLOCATED = "GPU-a,NVIDIA,1000,0:;GPU-b,NVIDIA,1000,0:;"


def test_a_consumed_container_on_the_same_gpus_is_a_repeat() -> None:
    first_done = tracked(ALLOCATED, ";GPU-b,NVIDIA,1000,0:;")
    (device,) = consumed_entry(first_done, ["GPU-a"], 0) or ()
    assert device.uuid == "GPU-a"


def test_a_pending_container_or_other_gpus_or_no_container_is_no_repeat() -> None:
    first_done = tracked(ALLOCATED, ";GPU-b,NVIDIA,1000,0:;")
    assert consumed_entry(first_done, ["GPU-b"], 0) is None  # other GPUs than consumed
    assert consumed_entry(first_done, ["GPU-b"], 1) is None  # still pending
    assert consumed_entry(first_done, ["GPU-a"], None) is None  # no container named
    assert consumed_entry(first_done, ["GPU-a"], 2) is None  # no such container
    assert consumed_entry(first_done, ["GPU-a"], -1) is None
