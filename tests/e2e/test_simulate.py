"""`numafit simulate` end to end: real nats-server, API emulator, the four services, kubelet
emulators and device plugins over gRPC; assertions on the JSON report."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from shared.tools.simulate.report import public, render_table, simulate
from shared.tools.simulate.scenario import ScenarioError, load_scenario, parse_scenario

if TYPE_CHECKING:
    from shared.tools.simulate.cluster import SimCluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "demo-scenario.yaml"
NUMAFIT = str(Path(sys.executable).with_name("numafit"))


async def run(text_or_path: str | Path) -> dict[str, Any]:
    scenario = (
        load_scenario(text_or_path)
        if isinstance(text_or_path, Path)
        else parse_scenario(text_or_path)
    )
    return public(await simulate(scenario))


def pod(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in report["pods"] if p["name"] == name)
    return found


def metric(report: dict[str, Any], name: str) -> float:
    value: float = report["metrics"].get(name, 0.0)
    return value


NODE = """
nodes:
  - name: node-1
    topologyPolicy: single-numa-node
    cpus: {0: 16, 1: 16}
    gpus:
      - {uuid: GPU-a, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 0}
      - {uuid: GPU-b, model: NVIDIA A100-SXM4-40GB, memory: 40960, numa: 1}
"""


def gpu_pod(name: str, mem: int, alignment: str | None = None, cpu: int = 2, gpus: int = 1) -> str:
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
            limits: {{nvidia.com/gpu: {gpus}, nvidia.com/gpumem: {mem}, cpu: {cpu}}}"""


async def test_a_pod_that_needs_no_refit() -> None:
    # Policy none: kubelet offers every GPU, so the scheduler's choice always stands.
    scenario = (
        NODE.replace("single-numa-node", "none") + "pods:" + gpu_pod("plain", 10000, "best-effort")
    )
    report = await run(scenario)
    container = pod(report, "plain")["containers"][0]
    assert pod(report, "plain")["phase"] == "Running"
    assert container["refit"] == "none" and container["aligned"] is True
    assert container["gpus"] == container["ledgerGpus"] == ["GPU-b"]  # spread's pick, kept
    assert report["devices"]["node-1"]["GPU-b"] == {"used": 1, "usedmem": 10000, "usedcores": 0}


async def test_mismatch_refitted_ends_aligned_on_the_refitted_gpu() -> None:
    report = await run(EXAMPLES / "single-numa-node-mismatch.yaml")
    entry = pod(report, "aligned")
    container = entry["containers"][0]
    assert entry["phase"] == "Running" and entry["node"] == "node-1"
    assert container == {
        "name": "app",
        "gpus": ["GPU-a"],
        "gpuNuma": [0],
        "cpuNuma": 0,
        "ledgerGpus": ["GPU-a"],
        "aligned": True,
        "refit": "moved",
    }
    assert report["devices"]["node-1"] == {
        "GPU-a": {"used": 1, "usedmem": 10000, "usedcores": 20},
        "GPU-b": {"used": 0, "usedmem": 0, "usedcores": 0},
    }
    assert metric(report, 'numafit_refit_requests_total{code="moved",mode="best-effort"}') == 1
    assert (
        metric(report, 'numafit_deviceplugin_refits_total{mode="best-effort",result="moved"}') == 1
    )


async def test_strict_refused_fails_the_pod_and_reserves_nothing() -> None:
    report = await run(EXAMPLES / "strict-refusal.yaml")
    picky = pod(report, "picky")
    assert picky["phase"] == "Failed" and picky["reason"] == "UnexpectedAdmissionError"
    assert picky["containers"][0]["refit"] == "strict_failed"
    assert picky["containers"][0]["ledgerGpus"] == []
    # Only the resident pod is counted.
    assert report["devices"]["node-1"]["GPU-a"]["usedmem"] == 30000
    assert report["devices"]["node-1"]["GPU-b"]["usedmem"] == 0
    assert (
        metric(report, 'numafit_deviceplugin_refits_total{mode="strict",result="strict_failed"}')
        == 1
    )


async def test_a_best_effort_fallback_that_would_over_commit_fails_the_pod_instead() -> None:
    report = await run(EXAMPLES / "best-effort-fallback.yaml")
    easygoing = pod(report, "easygoing")
    container = easygoing["containers"][0]
    assert easygoing["phase"] == "Failed" and easygoing["reason"] == "UnexpectedAdmissionError"
    assert container["refit"] == "refused:no_fit"
    assert container["gpus"] == container["ledgerGpus"] == []
    assert metric(report, "numafit_deviceplugin_fallback_containers") == 0
    assert (
        metric(
            report,
            'numafit_deviceplugin_refits_total{mode="best-effort",result="fallback_refused"}',
        )
        == 1
    )
    # Before: 30000 (resident) + 20000 (easygoing) on GPU-a's 40960 MiB. Now only resident's.
    assert report["devices"]["node-1"]["GPU-a"]["usedmem"] == 30000
    over = "numafit_accounting_device_memory_overcommitted_mib"
    assert metric(report, f'{over}{{node="node-1",uuid="GPU-a"}}') == 0


async def test_init_plus_app_refitted_with_phase_aware_capacity() -> None:
    report = await run(EXAMPLES / "init-and-sidecar.yaml")
    etl = pod(report, "etl")
    assert etl["phase"] == "Running"
    # load is given extract's replica by kubelet (device reuse, no GetPreferredAllocation): its
    # reservation follows it there without a refit of its own.
    assert [c["refit"] for c in etl["containers"]] == ["moved", "reused"]
    assert all(c["ledgerGpus"] == ["GPU-a"] and c["aligned"] for c in etl["containers"])
    # 30000 (init) + 20000 (app) would not fit 40960 together; max() does. After the init
    # exited 0 only the app's 20000 counts, plus the web pod's sidecar 5000 and app 10000.
    assert report["devices"]["node-1"]["GPU-a"] == {"used": 3, "usedmem": 35000, "usedcores": 60}


async def test_deleted_pods_free_their_capacity_for_the_next() -> None:
    plain = NODE.replace("single-numa-node", "none")  # no NUMA effects: capacity alone
    scenario = (
        plain
        + "pods:"
        + gpu_pod("first", 35000)
        + gpu_pod("second", 35000)
        + """
  - {delete: e2e/first}"""
        + gpu_pod("third", 35000)
    )
    report = await run(scenario)
    names = [p["name"] for p in report["pods"]]
    assert "first" not in names
    assert pod(report, "second")["phase"] == "Running"
    third = pod(report, "third")
    assert third["phase"] == "Running"
    # Without the delete, `third` would fit nowhere (35000 + 35000 > 40960 on either GPU).
    gpus = {g: u["usedmem"] for g, u in report["devices"]["node-1"].items()}
    assert gpus == {"GPU-a": 35000, "GPU-b": 35000}
    assert third["containers"][0]["gpus"] == [first_gpu(report)]


def first_gpu(report: dict[str, Any]) -> str:
    second = pod(report, "second")["containers"][0]["gpus"][0]
    return "GPU-a" if second == "GPU-b" else "GPU-b"


async def test_a_pod_that_fits_nowhere_stays_pending_with_hamis_reason() -> None:
    report = await run(NODE + "pods:" + gpu_pod("huge", 50000))
    huge = pod(report, "huge")
    assert huge["phase"] == "Pending" and huge["reason"] == "Unschedulable"
    assert all(u["used"] == 0 for u in report["devices"]["node-1"].values())


async def test_invalid_numa_alignment_is_refused_at_admission() -> None:
    report = await run(NODE + "pods:" + gpu_pod("typo", 1000, "maybe"))
    typo = pod(report, "typo")
    assert typo["phase"] == "Failed" and typo["reason"] == "AdmissionDenied"
    assert typo["containers"] == []


def test_unknown_keys_and_wrong_types_name_the_line(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"scenario:3: unknown key\(s\) colour"):
        parse_scenario(NODE.replace("    cpus:", "    colour: red\n    cpus:"))
    path = tmp_path / "bad.yaml"
    path.write_text(NODE.replace("memory: 40960, numa: 1", "memory: lots, numa: 1"))
    result = subprocess.run(
        [NUMAFIT, "simulate", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert f"{path}:7:" in result.stderr and "'memory' must be an integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_json_report(tmp_path: Path) -> None:
    result = subprocess.run(
        [NUMAFIT, "simulate", str(EXAMPLES / "single-numa-node-mismatch.yaml"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"pods", "devices", "metrics"}
    assert report["pods"][0]["containers"][0]["refit"] == "moved"
    assert any(k.startswith("numafit_scheduler_filter_total") for k in report["metrics"])


def test_demo_shows_the_story() -> None:
    result = subprocess.run(
        [NUMAFIT, "demo"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "POD" in out and "REFIT" in out and "GPU usage" in out
    assert "so the refit moved the reservation" in out
    assert "strict_failed" in out and "refused:no_fit" in out and "AdmissionDenied" in out
    # ml/bigmodel's fallback would over-commit GPU-0: it fails admission with the reason, and
    # with NodeResourceTopology it stays Pending instead.
    assert "numa-alignment best-effort: no GPU kubelet offers satisfies the pod: 4/4" in out
    assert "over-committed" not in out
    assert "ml/bigmodel: Pending (Unschedulable)" in out
    assert "device reuse" in out  # ml/pipeline fit, on prepare's GPU
    assert "misaligned" not in out


async def test_the_table_says_why_the_fallback_was_refused() -> None:
    report = await simulate(load_scenario(EXAMPLES / "best-effort-fallback.yaml"))
    out = io.StringIO()
    render_table(report, out)
    lines = out.getvalue().splitlines()
    assert "  demo/easygoing app: refit refused:no_fit; the pod failed admission" in lines
    assert any(
        line.startswith("  demo/easygoing: Failed (UnexpectedAdmissionError)")
        and "no GPU kubelet offers satisfies the pod: 1/1 CardInsufficientMemory" in line
        for line in lines
    )
    (gpu_a,) = [line for line in lines if line.startswith("node-1  GPU-a")]
    assert "30000/40960" in gpu_a and "over-committed" not in gpu_a


async def test_the_ledger_always_equals_a_rebuild_from_the_annotations() -> None:
    """The durable record is the pod annotations: after the whole demo (refits, fallbacks,
    drift, init shrink, deletion), a ledger rebuilt from the API equals the live one."""
    from shared.core.pods import pod_from_object
    from svc_accounting.ledger import Ledger

    compared: list[str] = []

    async def rebuild_and_compare(cluster: SimCluster) -> None:
        assert cluster.accounting is not None
        live = cluster.accounting.ledger
        rebuilt = Ledger()
        nodes, _ = await cluster.api.list_nodes()
        for obj in nodes:
            rebuilt.set_node(obj["metadata"]["name"], obj["metadata"].get("annotations") or {})
        pods, _ = await cluster.api.list_pods()
        for obj in pods:
            rebuilt.observe(pod_from_object(obj))
        for name in cluster.nodes:
            assert rebuilt.node(name).usage_table() == live.node(name).usage_table()
            compared.append(name)
        assert set(rebuilt.pod_node) == set(live.pod_node)
        assert rebuilt.quota.used == live.quota.used

    await simulate(load_scenario(DEMO), keep=rebuild_and_compare)
    assert compared == ["gpu-node-1"]
