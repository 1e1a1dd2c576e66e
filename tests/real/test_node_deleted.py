"""A Node deleted on the real API server: accounting forgets it at once (its pods released, its
series gone), kube-controller-manager's pod garbage collector deletes the pods bound to it, and
a node registered again under the name starts empty."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()
PODGC_WITHIN = 150.0
"""kube-controller-manager deletes a deleted node's pods after a 40 s quarantine, checked every
20 s."""


def test_node_deleted(control_plane: ControlPlane, numafit: NumafitStack) -> None:
    plane = control_plane
    group = cluster.unique("gone")
    node = f"{group}-node"
    gpu = f"GPU-{node}-0"
    cluster.create_gpu_node(plane, numafit, node, group, [Gpu(gpu, 0, 40000)])
    namespace = cluster.new_namespace(plane, "gone")
    cluster.create(plane, cluster.gpu_pod("old", namespace, group, memory=30000))
    old = cluster.bound_and_allocated(plane, numafit, namespace, "old")
    assert list(cluster.ledger_pods(numafit, node) or {}) == [old["metadata"]["uid"]]
    assert cluster.reserved_memory(numafit, node) == {gpu: 30000}

    plane.kubectl("delete", "node", node)
    poll(
        lambda: (
            cluster.ledger_pods(numafit, node) is None
            and cluster.reserved_memory(numafit, node) == {}
        ),
        within=30,
        what="accounting forgot the deleted node",
    )
    poll(
        lambda: plane.kubectl("get", "pod", "old", "-n", namespace, check=False).returncode != 0,
        within=PODGC_WITHIN,
        what="the deleted node's pod garbage-collected",
    )

    # The same name registered again (a node replaced): nothing of the old pod is counted, so
    # 30000 MiB fit again on the 40000 MiB GPU.
    cluster.create_gpu_node(plane, numafit, node, group, [Gpu(gpu, 0, 40000)])
    assert cluster.ledger_pods(numafit, node) == {}
    cluster.create(plane, cluster.gpu_pod("new", namespace, group, memory=30000))
    new = cluster.bound_and_allocated(plane, numafit, namespace, "new")
    assert new["spec"]["nodeName"] == node
    poll(
        lambda: cluster.reserved_memory(numafit, node) == {gpu: 30000},
        within=30,
        what="only the new pod counted",
        last=lambda: cluster.reserved_memory(numafit, node),
    )
