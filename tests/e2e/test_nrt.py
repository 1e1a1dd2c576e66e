"""NUMA-aware scheduling from NodeResourceTopology, end to end (`numafit simulate`: real
nats-server, API emulator, the four services, kubelet emulators publishing
NodeResourceTopology, device plugins over gRPC); assertions on the JSON report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from shared.tools.simulate.cluster import SimCluster
from shared.tools.simulate.driver import Driver
from shared.tools.simulate.report import build_report, public, simulate
from shared.tools.simulate.scenario import ScenarioError, load_scenario, parse_scenario

if TYPE_CHECKING:
    from shared.tools.simulate.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "shared" / "data" / "demo-scenario.yaml"
NUMAFIT = str(Path(sys.executable).with_name("numafit"))
PREDICTIONS = "numafit_scheduler_numa_predictions_total"


def node(nrt: bool, *, cpus: str = "{0: 16, 1: 16}", policy: str = "single-numa-node") -> str:
    return f"""
nodes:
  - name: node-1
    topologyPolicy: {policy}
    nodeResourceTopology: {"true" if nrt else "false"}
    cpus: {cpus}
    gpus:
      - {{uuid: GPU-a, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 0}}
      - {{uuid: GPU-b, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 1}}
"""


def gpu_pod(
    name: str, mem: int, cpu: int, alignment: str | None = "best-effort", gpus: int = 1
) -> str:
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
            limits: {{nvidia.com/gpu: {gpus}, nvidia.com/gpumem: {mem}, cpu: {cpu}, memory: 1Gi}}"""


async def run(text: str) -> dict[str, Any]:
    return public(await simulate(parse_scenario(text)))


def pod(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in report["pods"] if p["name"] == name)
    return found


def predictions(report: dict[str, Any]) -> dict[str, float]:
    return {r: report["metrics"][f'{PREDICTIONS}{{result="{r}"}}'] for r in ("hit", "miss", "none")}


# --- a prediction that hits ----------------------------------------------------------------

MISMATCH = "pods:" + gpu_pod("aligned", 10000, 4)


async def test_without_nrt_the_pod_needs_a_refit() -> None:
    report = await run(node(False) + MISMATCH)
    container = pod(report, "aligned")["containers"][0]
    assert container["refit"] == "moved" and container["gpus"] == ["GPU-a"]
    assert predictions(report) == {"hit": 0, "miss": 0, "none": 1}


async def test_the_prediction_hits_and_no_refit_is_needed() -> None:
    report = await run(node(True) + MISMATCH)
    entry = pod(report, "aligned")
    assert entry["phase"] == "Running"
    assert entry["containers"][0] == {
        "name": "app",
        "gpus": ["GPU-a"],
        "gpuNuma": [0],
        "cpuNuma": 0,
        "ledgerGpus": ["GPU-a"],
        "aligned": True,
        "refit": "none",
    }
    assert predictions(report) == {"hit": 1, "miss": 0, "none": 0}
    assert report["metrics"]["numafit_scheduler_topology_nodes"] == 1
    no_refit = 'numafit_deviceplugin_refits_total{mode="best-effort",result="no_mismatch"}'
    assert report["metrics"][no_refit] == 1


# --- NUMA 0's CPUs taken: kubelet (and the prediction) go to NUMA 1 ---------------------------

# binpack puts the second pod beside the first on GPU-a unless it knows better.
CPUS_TAKEN = (
    "config: {gpuSchedulerPolicy: binpack}\npods:"
    + gpu_pod("hog", 10000, 14)
    + gpu_pod("second", 10000, 4)
)


async def test_without_nrt_binpack_reserves_beside_the_first_pod_and_needs_a_refit() -> None:
    report = await run(node(False) + CPUS_TAKEN)
    second = pod(report, "second")["containers"][0]
    assert second["cpuNuma"] == 1 and second["refit"] == "moved" and second["gpus"] == ["GPU-b"]


async def test_numa_0_cpus_taken_the_pod_is_predicted_onto_numa_1() -> None:
    report = await run(node(True) + CPUS_TAKEN)
    hog = pod(report, "hog")["containers"][0]
    second = pod(report, "second")["containers"][0]
    assert (hog["cpuNuma"], hog["gpus"], hog["refit"]) == (0, ["GPU-a"], "none")
    assert (second["cpuNuma"], second["gpus"], second["refit"]) == (1, ["GPU-b"], "none")
    assert second["ledgerGpus"] == ["GPU-b"] and second["aligned"] is True
    assert predictions(report) == {"hit": 2, "miss": 0, "none": 0}


# --- strict pods no NUMA node can hold stay Pending ----------------------------------------


async def test_a_strict_pod_whose_numa_node_cannot_hold_its_gpu_stays_pending() -> None:
    # GPU-a (NUMA 0) keeps 30000 of 40960 MiB; kubelet pins the next pod's CPUs to NUMA 0
    # and would offer only GPU-a, which cannot hold 20000 MiB more.
    scenario = "pods:" + gpu_pod("resident", 30000, 2) + gpu_pod("picky", 20000, 2, "strict")
    without = await run(node(False) + scenario)
    assert pod(without, "picky")["phase"] == "Failed"  # admission refused, as today
    report = await run(node(True) + scenario)
    picky = pod(report, "picky")
    assert picky["phase"] == "Pending" and picky["reason"] == "Unschedulable"
    assert picky["containers"][0]["refit"] == "none" and picky["node"] == ""
    assert report["devices"]["node-1"]["GPU-b"]["used"] == 0  # nothing reserved for it


def test_the_reason_names_the_numa_zone(tmp_path: Path) -> None:
    scenario = "pods:" + gpu_pod("resident", 30000, 2) + gpu_pod("picky", 20000, 2, "strict")
    path = tmp_path / "picky.yaml"
    path.write_text(node(True) + scenario)
    result = subprocess.run(
        [NUMAFIT, "simulate", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert (
        "e2e/picky: Pending (Unschedulable) 0/1 nodes are available: node-1: "
        "NumaZoneInsufficient: kubelet would pin container app to NUMA 0, whose GPUs cannot "
        "hold it: 1/1 CardInsufficientMemory"
    ) in result.stdout


async def test_a_pod_no_numa_node_has_the_cpus_for_stays_pending() -> None:
    # 20 exclusive CPUs fit neither NUMA node (16 each): kubelet would refuse it whatever the
    # GPUs (TopologyAffinityError), so it is not placed there, strict or not.
    scenario = "pods:" + gpu_pod("wide", 1000, 20, "strict") + gpu_pod("wide-be", 1000, 20)
    without = await run(node(False) + scenario)
    assert {pod(without, n)["reason"] for n in ("wide", "wide-be")} == {"TopologyAffinityError"}
    report = await run(node(True) + scenario)
    for name in ("wide", "wide-be"):
        entry = pod(report, name)
        assert entry["phase"] == "Pending" and entry["reason"] == "Unschedulable"


async def test_a_best_effort_pod_kubelets_numa_node_cannot_hold_stays_pending() -> None:
    scenario = "pods:" + gpu_pod("resident", 30000, 2) + gpu_pod("easy", 20000, 2)
    report = await run(node(True) + scenario)
    easy = pod(report, "easy")
    # No NUMA 0 GPU can hold it and kubelet pins it there, offering only NUMA 0's GPUs: its
    # refit would be refused and its fallback never over-commits a GPU, so admission would
    # fail. The filter says so and the pod waits (before: it ran over-committed on GPU-a).
    assert easy["phase"] == "Pending" and easy["reason"] == "Unschedulable"
    assert easy["containers"][0]["refit"] == "none"
    assert report["devices"]["node-1"]["GPU-a"]["usedmem"] == 30000
    assert predictions(report) == {"hit": 1, "miss": 0, "none": 0}


# --- a stale NodeResourceTopology ----------------------------------------------------------


async def run_with_stale_topology(scenario: Scenario) -> dict[str, Any]:
    """Run `scenario` with the node's NodeResourceTopology frozen after its first object:
    the scheduler only knows what it placed since then."""
    cluster = SimCluster(scenario)
    try:
        await cluster.start()
        publisher = cluster.nodes["node-1"].kubelet.topology
        assert publisher is not None and publisher.published == 1
        publisher.paused = True
        async with aiohttp.ClientSession() as session:
            driver = Driver(cluster, session)
            for step in scenario.steps:
                await driver.run(step)
        assert publisher.published == 1
        assert cluster.scheduler is not None
        assert cluster.scheduler.topology.state.assumed("node-1") == 2
        return public(build_report(cluster, list(driver.reports.values()), driver.deleted))
    finally:
        await cluster.stop()


async def test_pods_bound_since_the_last_update_are_counted_against_it() -> None:
    # The frozen object says 32 CPUs free on NUMA 0 (and 32 on NUMA 1). The first pod takes
    # 24 of NUMA 0's; the second needs 16: kubelet pins it to NUMA 1, and so does the
    # prediction, because the first pod is counted against the stale figures.
    text = (
        node(True, cpus="{0: 32, 1: 32}")
        + "config: {gpuSchedulerPolicy: binpack}\npods:"
        + gpu_pod("first", 10000, 24)
        + gpu_pod("second", 10000, 16)
    )
    report = await run_with_stale_topology(parse_scenario(text))
    first = pod(report, "first")["containers"][0]
    second = pod(report, "second")["containers"][0]
    assert (first["cpuNuma"], first["gpus"], first["refit"]) == (0, ["GPU-a"], "none")
    assert (second["cpuNuma"], second["gpus"], second["refit"]) == (1, ["GPU-b"], "none")


# --- the demo -----------------------------------------------------------------------------


async def test_the_demo_with_nrt_needs_a_refit_only_where_no_numa_node_can_hold_it() -> None:
    scenario = load_scenario(DEMO)
    assert scenario.compare == "nodeResourceTopology"
    assert not any(n.node_resource_topology for n in scenario.nodes)
    report = await simulate(scenario.with_node_resource_topology_flipped())
    running = [c for p in report["pods"] for c in p["containers"] if c["gpus"]]
    assert len(running) == 7 and all(c["aligned"] for c in running)
    needed = {
        f"{p['name']}/{c['name']}": c["refit"]
        for p in [*report["_table"]["deleted"], *report["pods"]]
        for c in p["containers"]
        if c["refit"] != "none"
    }
    # No refit at all; pipeline's app container runs on its init container's GPU (kubelet's
    # device reuse). Both big models would be pinned to NUMA 0, whose GPUs have no 70000 MiB
    # left: strict and best-effort alike wait, nothing is over-committed.
    assert needed == {"pipeline/fit": "reused"}
    for name in ("bigmodel-strict", "bigmodel"):
        entry = pod(report, name)
        assert entry["phase"] == "Pending" and entry["reason"] == "Unschedulable"


def test_the_demo_shows_both_refit_counts() -> None:
    result = subprocess.run(
        [NUMAFIT, "demo", "--json"], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stderr
    comparison = json.loads(result.stdout)["comparison"]["nodeResourceTopology"]
    assert comparison["without"]["refits"] == 8 and comparison["without"]["moved"] == 6
    assert comparison["with"]["refits"] == 0 and comparison["with"]["moved"] == 0
    assert comparison["with"]["predictions"] == {"hit": 8, "miss": 0, "none": 0}
    assert comparison["without"]["predictions"]["none"] == 10


# --- the scenario keys ---------------------------------------------------------------------


def test_node_resource_topology_must_be_a_boolean() -> None:
    with pytest.raises(ScenarioError, match="nodeResourceTopology must be true or false"):
        parse_scenario(node(True).replace("nodeResourceTopology: true", "nodeResourceTopology: 1"))
    assert parse_scenario(node(True)).nodes[0].node_resource_topology is True
    plain = node(True).replace("    nodeResourceTopology: true\n", "")
    assert parse_scenario(plain).nodes[0].node_resource_topology is False


def test_compare_takes_only_node_resource_topology() -> None:
    with pytest.raises(ScenarioError, match="compare must be nodeResourceTopology"):
        parse_scenario(node(True) + "compare: everything\n")
    assert parse_scenario(node(True) + "compare: nodeResourceTopology\n").compare == (
        "nodeResourceTopology"
    )
