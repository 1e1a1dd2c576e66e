"""`numafit bench` runs and reports every figure DESIGN.md names (speed goals live in the bench,
not in timed tests: nothing here asserts a duration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    for kind in ("echo", "patch", "refit", "echo_same_process"):
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
    scheduling = figures["scheduling"]
    assert scheduling["pods"] > 0 and scheduling["nodes"] == 20
    assert isinstance(scheduling["pods_per_s"], float) and scheduling["pods_per_s"] > 0
    assert isinstance(scheduling["api_writes_per_pod"], (int, float))
    assert scheduling["api_writes_per_pod"] > 0
    assert set(figures["filter_latency"]) == {"20", "50"}
    memory = figures["accounting_memory"]
    assert memory["reservations"] == 1000 and memory["bytes_per_reservation"] > 0
