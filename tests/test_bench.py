"""`numafit bench` runs and reports every figure the bench contract names (speed goals live in the bench,
not in timed tests: nothing here asserts a duration)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from shared.tools.bench_real import CONFIGURATIONS, skipped_reason, summarize_runs
from shared.tools.bench_real_cluster import counter_values, histogram_sums, profile_delta

NUMAFIT = str(Path(sys.executable).with_name("numafit"))


def test_quick_bench_reports_every_figure() -> None:
    result = subprocess.run(
        [NUMAFIT, "bench", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    trips = figures["round_trip"]
    for kind in ("echo", "patch", "chain", "refit", "echo_same_process"):
        series = trips[kind]
        assert set(series) == {"concurrency_1", "concurrency_8"}
        for value in series.values():
            assert (
                value["requests"] > 0 and value["p50_ms"] > 0 and value["p99_ms"] >= value["p50_ms"]
            )
            assert value["throughput_per_s"] > 0
    # The distance to the floor is computed from the figures shown beside it.
    over = trips["refit_over_floor_ms"]
    assert set(over) == {"concurrency_1", "concurrency_8"}
    for name, value in over.items():
        floor = trips["echo"][name]["p50_ms"] + trips["patch"][name]["p50_ms"]
        assert abs(value - (trips["refit"][name]["p50_ms"] - floor)) < 0.002
    # And from the chain floor: the same hops and PATCH, without numafit's work.
    over_chain = trips["refit_over_chain_ms"]
    assert set(over_chain) == {"concurrency_1", "concurrency_8"}
    for name, value in over_chain.items():
        chain = trips["chain"][name]["p50_ms"]
        assert abs(value - (trips["refit"][name]["p50_ms"] - chain)) < 0.002
    scheduling = figures["scheduling"]
    assert scheduling["pods"] > 0 and scheduling["nodes"] == 20
    assert isinstance(scheduling["pods_per_s"], float) and scheduling["pods_per_s"] > 0
    assert isinstance(scheduling["api_writes_per_pod"], (int, float))
    assert scheduling["api_writes_per_pod"] > 0
    assert set(figures["filter_latency"]) == {"20", "50"}
    memory = figures["accounting_memory"]
    assert memory["reservations"] == 1000 and memory["bytes_per_reservation"] > 0
    check_real_scheduling(figures["real_scheduling"])


def check_real_scheduling(real: dict[str, Any]) -> None:
    """The real-control-plane run: skipped with its reason where the binaries are not there
    (KUBEBUILDER_ASSETS), else every configuration's figures, each a median of its runs."""
    reason = skipped_reason()
    if reason is not None:
        assert real == {"skipped": reason}
        return
    assert set(real) == {"nodes", "pods", *CONFIGURATIONS}
    for name in CONFIGURATIONS:
        value = real[name]
        assert {
            "pods_per_s", "never_bound", "bind_latency_p50_s", "bind_latency_p99_s",
            "api_writes_per_pod", "runs",
        } <= set(value)  # fmt: skip
        assert value["never_bound"] == 0 and value["pods_per_s"] > 0
        assert value["pods_per_s"] == statistics.median(r["pods_per_s"] for r in value["runs"])
        assert value["bind_latency_p99_s"] >= value["bind_latency_p50_s"] > 0
        # Every scheduled pod is written at least once (its Binding).
        assert value["api_writes_per_pod"] >= 1


def test_without_the_binaries_the_real_run_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [NUMAFIT, "bench", "--real-only", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBEBUILDER_ASSETS": str(tmp_path / "nothing")},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["real_scheduling"] == {
        "skipped": f"KUBEBUILDER_ASSETS={tmp_path / 'nothing'} lacks kube-apiserver, "
        "kube-controller-manager, kube-scheduler"
    }
    (line,) = [x for x in result.stderr.splitlines() if "real scheduling" in x]
    assert line.startswith("real scheduling skipped: KUBEBUILDER_ASSETS=")


def test_a_run_summary_is_the_median_of_its_runs() -> None:
    runs = [
        {
            "pods_per_s": pods,
            "never_bound": never,
            "bind_latency_p50_s": p50,
            "bind_latency_p99_s": p50 * 3,
            "api_writes_per_pod": 2.0,
        }
        for pods, never, p50 in ((40.0, 0, 0.5), (60.0, 2, 0.2), (50.0, 0, 0.9))
    ]
    summary = summarize_runs(runs)
    assert summary["pods_per_s"] == 50.0
    assert summary["never_bound"] == 2  # the worst run: one unbound pod is one too many
    assert summary["bind_latency_p50_s"] == 0.5
    assert summary["runs"] == runs


def test_the_profile_is_the_mean_per_call_between_two_readings() -> None:
    before = sums(METRICS.format(filter_sum=1.0, filter_count=10, fit=10))
    after = sums(METRICS.format(filter_sum=1.5, filter_count=110, fit=110))
    means = profile_delta(before, after)
    assert means["filter_ms"] == 5.0 and means["filter_calls"] == 100
    assert means['filter_total{result="fit"}'] == 100


METRICS = """# HELP numafit_scheduler_filter_duration_seconds x
numafit_scheduler_filter_duration_seconds_bucket{{le="0.01"}} 3
numafit_scheduler_filter_duration_seconds_sum {filter_sum}
numafit_scheduler_filter_duration_seconds_count {filter_count}
numafit_scheduler_filter_total{{result="fit"}} {fit}
"""


def sums(text: str) -> dict[str, float]:
    return histogram_sums(
        text, {"filter": "numafit_scheduler_filter_duration_seconds"}
    ) | counter_values(text, ("numafit_scheduler_filter_total",))
