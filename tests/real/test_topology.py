"""The NodeResourceTopology CRD (v1alpha2) the svc-scheduler chart ships, installed on the real
API server (tests/real/stack.py applies the chart's crds/), validated there, and read by the
extender: a Guaranteed pod is reserved on a GPU of the NUMA node kubelet's Topology Manager
will pin its CPUs to."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()


def topology(node: str, free_cpus: dict[int, int]) -> dict[str, Any]:
    """What NFD's topology-updater publishes for a single-numa-node kubelet with 8 CPUs per
    NUMA node, `free_cpus` of them not held by guaranteed pods."""
    zones = [
        {
            "name": f"node-{numa}",
            "type": "Node",
            "costs": [
                {"name": f"node-{other}", "value": 10 if other == numa else 20}
                for other in free_cpus
            ],
            "resources": [
                {"name": "cpu", "capacity": "8", "allocatable": "8", "available": str(free)},
                {"name": "memory", "capacity": "32Gi", "allocatable": "32Gi", "available": "32Gi"},
            ],
        }
        for numa, free in free_cpus.items()
    ]
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": zones,
    }


def test_the_crd_validates_what_it_serves(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    bad = topology(cluster.unique("nrt-bad"), {0: 1})
    bad["zones"][0]["resources"][0]["available"] = "lots"
    refused = control_plane.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "zones[0].resources[0].available" in refused.stderr
    del bad["zones"]
    refused = control_plane.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0 and "zones: Required value" in refused.stderr


def test_the_extender_predicts_kubelets_numa_node(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    group = cluster.unique("nrt")
    namespace = cluster.new_namespace(plane, "nrt")

    def place(node: str) -> str:
        """A Guaranteed pod with 2 exclusive CPUs and a GPU share, alone on `node` (two empty
        GPUs, one per NUMA node): the GPU reserved for it."""
        cluster.create(
            plane, cluster.gpu_pod(node, namespace, f"{group}-{node}", memory=10000, cpu="2")
        )
        (device,) = cluster.reserved_gpus(cluster.bound(plane, namespace, node))
        return device[0]

    def gpu_node(node: str) -> None:
        gpus = [Gpu(f"GPU-{node}-0", 0), Gpu(f"GPU-{node}-1", 1)]
        cluster.create_gpu_node(plane, numafit, node, f"{group}-{node}", gpus)

    # Without NodeResourceTopology the GPU policy alone picks one of the two.
    plain = f"{group}-plain"
    gpu_node(plain)
    picked = int(place(plain).rsplit("-", 1)[1])
    # With it, the other NUMA node is the only one with CPUs free: kubelet's single-numa-node
    # Topology Manager will pin the pod's CPUs there, and the extender reserves a GPU beside
    # them. Published before the node's GPUs are registered, so the extender has read it by the
    # time the node can take pods (its watch runs from the service's start).
    other = 1 - picked
    predicted = f"{group}-nrt"
    cluster.create(plane, topology(predicted, {picked: 0, other: 6}))
    gpu_node(predicted)
    assert place(predicted) == f"GPU-{predicted}-{other}"
