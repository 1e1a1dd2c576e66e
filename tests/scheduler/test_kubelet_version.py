"""Nodes whose kubelet would reject a pod itself: before v1.31, kubelet strips extended resources
no device plugin advertises (`nvidia.com/gpumem`, `gpucores`) from app containers only, so a pod
whose init containers ask for them fails with `OutOf<resource>` after its GPUs were allocated
(kubernetes/kubernetes#124255). The filter leaves such nodes out for such a pod, with the reason
(shared/core/kubelet_version.py, svc_scheduler/node_watch.py). The filter itself, on the API
emulator's Nodes: tests/scheduler/test_kubelet_version_filter.py."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.kubelet_version import (
    KUBELET_REJECTS_INIT_RESOURCES,
    init_resource_rejection,
    parse_kubelet_version,
)
from shared.core.pods import pod_from_object
from svc_scheduler.node_watch import NodeKubelets
from tests.builders import container, gpu, node, pod


def versioned(name: str, version: str | None, gpu_name: str) -> dict[str, Any]:
    obj = node(name, [gpu(gpu_name, 0)])
    if version is not None:
        obj["status"] = {"nodeInfo": {"kubeletVersion": version}}
    return obj


def init_pod(**init_resources: int) -> dict[str, Any]:
    prep = container("prep", 1, init_resources.get("mem"), init_resources.get("cores"))
    return pod("p", containers=[container("main", 1, 10000, 20)], init=[prep])


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("v1.28.7", (1, 28, 7)),
        ("v1.29.3-eks-ae9a62a", (1, 29, 3)),
        ("v1.30.2+k3s1", (1, 30, 2)),
        ("1.31.0", (1, 31, 0)),
        ("", None),
        ("v1.28", None),
        ("latest", None),
        (None, None),
        ("v" + "9" * 200, None),
    ],
)
def test_kubelet_versions_are_read_as_nodes_report_them(
    text: str | None, parsed: tuple[int, int, int] | None
) -> None:
    assert parse_kubelet_version(text) == parsed


@pytest.mark.parametrize(
    ("version", "rejected"),
    [
        ("v1.28.7", True),
        ("v1.30.14", True),
        ("v1.31.0", False),
        ("v1.33.1", False),
        (None, False),  # unknown: not predicted
    ],
)
def test_only_kubelets_before_1_31_reject_init_containers_asking_for_gpumem(
    version: str | None, rejected: bool
) -> None:
    info = pod_from_object(init_pod(mem=20000, cores=30))
    rejection = init_resource_rejection(version, info.containers, {"nvidia.com/gpu"})
    assert (rejection is not None) is rejected
    if rejection is not None:
        # kubelet checks in map order; the first resource by name stands in for it.
        assert (rejection.resource, rejection.requested, rejection.containers) == (
            "nvidia.com/gpucores",
            30,
            ("prep",),
        )
        assert rejection.kubelet_reason == "OutOfnvidia.com/gpucores"


def test_nothing_is_rejected_without_such_init_containers() -> None:
    for obj in (
        init_pod(),  # the init container asks for GPUs only: advertised
        pod("q", containers=[container("main", 1, 10000, 20)]),  # apps: stripped
    ):
        info = pod_from_object(obj)
        assert init_resource_rejection("v1.28.7", info.containers, {"nvidia.com/gpu"}) is None
    # A node that does advertise the resource (its allocatable lists it) keeps it.
    info = pod_from_object(init_pod(mem=20000))
    advertised = {"nvidia.com/gpu", "nvidia.com/gpumem"}
    assert init_resource_rejection("v1.28.7", info.containers, advertised) is None


def test_the_nodes_kubelets_as_the_watch_keeps_them() -> None:
    kubelets = NodeKubelets()
    kubelets.replace_all(
        [
            versioned("old", "v1.28.7", "GPU-a"),
            versioned("new", "v1.31.1", "GPU-b"),
            versioned("unknown", None, "GPU-c"),
            {"metadata": {}},  # no name: ignored
        ]
    )
    info = pod_from_object(init_pod(mem=20000))
    found = kubelets.rejections(info, ["old", "new", "unknown", "absent"], ["nvidia.com/gpu"])
    assert list(found) == ["old"]
    reason = found["old"].filter_reason()
    assert reason.startswith(
        f"{KUBELET_REJECTS_INIT_RESOURCES}: kubelet v1.28.7 would reject the pod "
        "(OutOfnvidia.com/gpumem): init container prep asks for nvidia.com/gpumem"
    )
    assert "kubernetes/kubernetes#124255" in reason and "v1.31" in reason
    kubelets.drop("old")
    assert kubelets.rejections(info, ["old"], ["nvidia.com/gpu"]) == {}
