"""With NodeResourceTopology the scheduler knows where kubelet will pin a pod: a best-effort pod
is placed on a node whose predicted NUMA node can hold its GPUs whenever such a node exists,
so its refit, and a fallback after it, stay rare.

Pure placement (shared/core/nodes.py) and, end to end, `numafit simulate` with two nodes."""

from __future__ import annotations

from shared.core.fit import FitOptions
from shared.core.model import ContainerKind, DeviceInfo, DeviceUsage, NodeSnapshot
from shared.core.nodes import NodePolicy, place_pod
from shared.core.numa_prediction import NumaPlan
from shared.core.policy import parse_policy
from shared.core.requests import ContainerRequest
from shared.tools.simulate.report import public, simulate
from shared.tools.simulate.scenario import parse_scenario


def device(uuid: str, numa: int, used_mem: int = 0) -> DeviceUsage:
    info = DeviceInfo(uuid, 0, 10, 40960, 100, "NVIDIA A100", numa, "hami-core", True)
    usage = DeviceUsage(info)
    usage.usedmem = used_mem
    usage.used = 1 if used_mem else 0
    return usage


def test_a_node_whose_predicted_numa_node_holds_the_gpus_wins() -> None:
    # node-1 is fuller (binpack picks it first), but its NUMA 0 GPU, where kubelet will pin
    # the pod, has no 20000 MiB left; node-2's has.
    nodes: dict[str, NodeSnapshot | None] = {
        "node-1": NodeSnapshot("node-1", [device("GPU-a", 0, 30000), device("GPU-b", 1)]),
        "node-2": NodeSnapshot("node-2", [device("GPU-c", 0, 5000), device("GPU-d", 1)]),
    }
    request = ContainerRequest(nums=1, type="NVIDIA", memreq=20000, coresreq=10)
    options = FitOptions(policy=parse_policy("spread"))
    plan = NumaPlan(first=((0, 0),), names=((0, "main"),), prefer=True)
    placed = place_pod(
        nodes,
        [request],
        [ContainerKind.APP],
        options,
        NodePolicy.BINPACK,
        numa={"node-1": plan, "node-2": plan},
    )
    assert placed.chosen == "node-2"
    assert [d.uuid for d in placed.rows[0]] == ["GPU-c"]
    # No such node: the fullest node still takes it, on a GPU elsewhere (the refit follows).
    only = {"node-1": nodes["node-1"]}
    placed = place_pod(
        only, [request], [ContainerKind.APP], options, NodePolicy.BINPACK, numa={"node-1": plan}
    )
    assert placed.chosen == "node-1" and [d.uuid for d in placed.rows[0]] == ["GPU-b"]
    # Without the preference (no prediction) binpack's pick stands.
    placed = place_pod(nodes, [request], [ContainerKind.APP], options, NodePolicy.BINPACK)
    assert placed.chosen == "node-1"


NODES = """
nodes:
  - name: node-1
    topologyPolicy: single-numa-node
    nodeResourceTopology: true
    cpus: {0: 16, 1: 16}
    gpus:
      - {uuid: GPU-a, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 0}
      - {uuid: GPU-b, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 1}
  - name: node-2
    topologyPolicy: single-numa-node
    nodeResourceTopology: true
    cpus: {0: 16, 1: 16}
    gpus:
      - {uuid: GPU-c, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 0}
      - {uuid: GPU-d, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 1}
config: {gpuSchedulerPolicy: spread, nodeSchedulerPolicy: binpack}
pods:
"""


def guaranteed(name: str, mem: int, alignment: str | None) -> str:
    annotations = (
        f"\n      annotations: {{hami.io/numa-alignment: {alignment}}}" if alignment else ""
    )
    return f"""
  - metadata:
      name: {name}
      namespace: e2e{annotations}
    spec:
      containers:
        - name: app
          image: busybox
          resources:
            limits: {{nvidia.com/gpu: 1, nvidia.com/gpumem: {mem}, cpu: 2, memory: 1Gi}}"""


async def test_a_best_effort_pod_goes_where_kubelets_numa_node_can_hold_it() -> None:
    # filler lands on node-1's NUMA 0 GPU (binpack, the first node); kubelet will pin `be` to
    # NUMA 0 on either node, and only node-2's NUMA 0 GPU has room for 20000 MiB more.
    scenario = parse_scenario(
        NODES + guaranteed("filler", 30000, None) + guaranteed("be", 20000, "best-effort")
    )
    report = public(await simulate(scenario))
    pods = {p["name"]: p for p in report["pods"]}
    assert pods["filler"]["node"] == "node-1"
    assert pods["filler"]["containers"][0]["gpus"] == ["GPU-a"]
    be = pods["be"]
    assert (be["node"], be["phase"]) == ("node-2", "Running")
    assert be["containers"][0]["gpus"] == ["GPU-c"]
    assert be["containers"][0]["refit"] == "none"  # no refit was needed
    assert report["devices"]["node-1"]["GPU-a"]["usedmem"] == 30000  # nothing over-committed
