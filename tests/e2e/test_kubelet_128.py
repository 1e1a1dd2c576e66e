"""`numafit simulate` where the kubelet emulator once disagreed with a real kubelet v1.28.7
(../shared/k8s/README.md, "What the real kubelet does that numafit's kubelet emulator did
not"), and where that let a pod run against its own constraints: the JSON report and the pod
status kubelet writes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from shared.tools.simulate.report import public, simulate
from shared.tools.simulate.scenario import ScenarioError, parse_scenario

if TYPE_CHECKING:
    from shared.tools.simulate.cluster import SimCluster

NODE = """
nodes:
  - name: node-1
    topologyPolicy: single-numa-node
    cpus: {cpus}
    gpus:
      - {{uuid: GPU-a, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 0}}
      - {{uuid: GPU-b, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 0}}
      - {{uuid: GPU-c, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 1}}
      - {{uuid: GPU-d, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 1}}
pods:
"""


def container(name: str, limits: str) -> str:
    return f"""
        - name: {name}
          image: busybox
          resources:
            limits: {{{limits}}}"""


def pod_yaml(
    name: str,
    containers: str,
    *,
    init: str = "",
    annotations: str = "",
) -> str:
    meta = f"\n      annotations: {{{annotations}}}" if annotations else ""
    inits = f"\n      initContainers:{init}" if init else ""
    return f"""
  - metadata:
      name: {name}
      namespace: e2e{meta}
    spec:{inits}
      containers:{containers}"""


async def run(text: str, keep: Any = None) -> dict[str, Any]:
    return public(await simulate(parse_scenario(text), keep=keep))


def pod(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in report["pods"] if p["name"] == name)
    return found


async def test_a_burstable_pod_pins_no_cpus_only_its_gpu_follows_the_hint() -> None:
    # CPU limit, no memory limit: Burstable. kubelet's static policy pins nothing
    # (Cpus_allowed_list: all), and the emulator once said "pinned to NUMA 0".
    limits = "nvidia.com/gpu: 1, nvidia.com/gpumem: 1000, cpu: 4"
    report = await run(
        NODE.format(cpus="{0: 8, 1: 8}") + pod_yaml("burst", container("app", limits))
    )
    (app,) = pod(report, "burst")["containers"]
    assert pod(report, "burst")["phase"] == "Running"
    assert app["cpuNuma"] is None and app["gpuNuma"] == [0] and app["aligned"] is True


async def test_an_app_container_reuses_its_init_containers_only_exclusive_cpu() -> None:
    # One exclusive CPU (on NUMA 1, with GPU-c and GPU-d): kubelet hands the init container's
    # CPU and replica to the app container; the emulator once refused the pod
    # (TopologyAffinityError).
    limits = "nvidia.com/gpu: 1, nvidia.com/gpumem: 1000, cpu: 1, memory: 1Gi"
    text = NODE.format(cpus="{0: 0, 1: 1}") + pod_yaml(
        "reuse", container("main", limits), init=container("prep", limits)
    )
    report = await run(text)
    entry = pod(report, "reuse")
    assert (entry["phase"], entry["reason"]) == ("Running", "")
    prep, main = entry["containers"]
    assert prep["cpuNuma"] == main["cpuNuma"] == 1
    assert main["gpus"] == prep["gpus"] and main["ledgerGpus"] == main["gpus"]


async def test_a_two_gpu_pod_not_opted_in_runs_on_two_distinct_gpus() -> None:
    limits = "nvidia.com/gpu: 2, nvidia.com/gpumem: 1000, cpu: 2, memory: 1Gi"
    report = await run(
        NODE.format(cpus="{0: 8, 1: 8}") + pod_yaml("pair", container("app", limits))
    )
    entry = pod(report, "pair")
    assert entry["phase"] == "Running", entry["reason"]
    (app,) = entry["containers"]
    assert len(set(app["gpus"])) == 2 and app["ledgerGpus"] == app["gpus"]


async def test_a_best_effort_pin_kubelet_does_not_offer_fails_the_pod_with_the_reason() -> None:
    # Pinned to GPU-c (NUMA 1) by use-gpuuuid; kubelet pins the CPUs to NUMA 0 and offers only
    # GPU-a and GPU-b. Once, the pod ran on one of them: a GPU it excluded.
    limits = "nvidia.com/gpu: 1, nvidia.com/gpumem: 1000, cpu: 2, memory: 1Gi"
    annotations = "hami.io/numa-alignment: best-effort, nvidia.com/use-gpuuuid: GPU-c"
    statuses: dict[str, Any] = {}

    async def read_status(cluster: SimCluster) -> None:
        obj = await cluster.api.get_pod("e2e", "pinned")
        statuses.update(obj["status"])

    text = NODE.format(cpus="{0: 8, 1: 8}") + pod_yaml(
        "pinned", container("app", limits), annotations=annotations
    )
    report = await run(text, keep=read_status)
    entry = pod(report, "pinned")
    assert (entry["phase"], entry["reason"]) == ("Failed", "UnexpectedAdmissionError")
    assert entry["containers"][0]["gpus"] == []
    # What kubelet writes: its message, prefixed, and the containers it never started.
    assert statuses["message"].startswith(
        "Pod was rejected: Allocate failed due to device plugin GetPreferredAllocation rpc "
        "failed with err: rpc error: code = FailedPrecondition desc = numa-alignment "
        "best-effort: no GPU kubelet offers satisfies the pod: 2/2 CardUuidMismatch"
    )
    (status,) = statuses["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
    assert status["state"]["terminated"]["exitCode"] == 137


INIT_GPUMEM = pod_yaml(
    "etl",
    container("load", "nvidia.com/gpu: 1, nvidia.com/gpumem: 20000, cpu: 2, memory: 1Gi"),
    init=container(
        "extract",
        "nvidia.com/gpu: 1, nvidia.com/gpumem: 30000, nvidia.com/gpucores: 60, cpu: 2, memory: 1Gi",
    ),
)


async def test_a_node_whose_kubelet_would_reject_init_containers_gpumem_is_not_chosen() -> None:
    # The node's kubelet plays v1.28.7 and its Node says so: the scheduler leaves it out for a
    # pod whose init container asks for gpumem and gpucores, instead of a reservation, a refit
    # and a pod kubelet rejects with OutOfnvidia.com/gpucores after the device plugin ran.
    text = NODE.format(cpus="{0: 8, 1: 8}").replace(
        "    topologyPolicy: single-numa-node\n",
        "    topologyPolicy: single-numa-node\n    kubeletVersion: v1.28.7\n",
    )
    report = await run(text + INIT_GPUMEM)
    entry = pod(report, "etl")
    assert (entry["phase"], entry["reason"]) == ("Pending", "Unschedulable")
    assert all(c["refit"] == "none" and c["ledgerGpus"] == [] for c in entry["containers"])
    assert all(u["usedmem"] == 0 for u in report["devices"]["node-1"].values())
    # The same pod on a v1.31 kubelet (the default) runs.
    report = await run(NODE.format(cpus="{0: 8, 1: 8}") + INIT_GPUMEM)
    assert pod(report, "etl")["phase"] == "Running"


def test_kubelet_version_must_be_a_version() -> None:
    text = NODE.format(cpus="{0: 8, 1: 8}").replace(
        "    cpus:", "    kubeletVersion: newest\n    cpus:"
    )
    with pytest.raises(ScenarioError, match=r"kubeletVersion must be a version such as v1\.28"):
        parse_scenario(text)
