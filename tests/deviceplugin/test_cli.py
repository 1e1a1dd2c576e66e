"""`numafit run deviceplugin` as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NUMAFIT = str(Path(sys.executable).with_name("numafit"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [NUMAFIT, "run", "deviceplugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_inventory_of_a_simulated_topology(tmp_path: Path) -> None:
    topology = tmp_path / "gpus.yaml"
    topology.write_text(
        "gpus:\n"
        "  - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 1}\n"
        "  - {uuid: GPU-b, model: NVIDIA H100, memory: 81920, numa: 0}\n"
    )
    result = run("--inventory", "--topology", str(topology))
    assert result.returncode == 0, result.stderr
    assert "GPU-a" in result.stdout and "GPU-b" in result.stdout and "81920" in result.stdout


def test_inventory_without_a_driver_is_one_line_and_exit_1() -> None:
    pytest.importorskip("pynvml")
    result = run("--inventory")
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:  # no driver here: the plugin must say so in one line
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "NVML is not available" in result.stderr
    else:  # pragma: no cover - a GPU machine
        assert result.returncode == 0


@pytest.mark.parametrize("inventory", [True, False])
def test_bad_topology_is_a_usage_error_in_one_line(tmp_path: Path, inventory: bool) -> None:
    topology = tmp_path / "gpus.yaml"
    topology.write_text("gpus:\n  - {uuid: GPU-a, model: NVIDIA H100, memory: lots, numa: 0}\n")
    mode = ["--inventory"] if inventory else ["--node", "node-1"]
    result = run(*mode, "--topology", str(topology))
    assert result.returncode == 2, result.stderr  # like a bad scenario or plan case
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"numafit run deviceplugin: {topology}: ")
    assert "'memory' must be an integer" in result.stderr


def test_missing_topology_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    result = run("--inventory", "--topology", str(missing))
    assert result.returncode == 2
    assert result.stderr == (
        f"numafit run deviceplugin: {missing}: cannot read topology: No such file or directory\n"
    )


def test_node_is_required(tmp_path: Path) -> None:
    topology = tmp_path / "gpus.yaml"
    topology.write_text("gpus:\n  - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 0}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "NUMAFIT_NODE")}
    result = subprocess.run(
        [NUMAFIT, "run", "deviceplugin", "--topology", str(topology)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert result.returncode == 2 and "--node (or NUMAFIT_NODE) is required" in result.stderr


@pytest.mark.parametrize("node", ["Node_1", "node 1", "n" * 300])
def test_a_bad_node_name_is_refused_at_start(tmp_path: Path, node: str) -> None:
    topology = tmp_path / "gpus.yaml"
    topology.write_text("gpus:\n  - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 0}\n")
    result = run(
        "--topology",
        str(topology),
        "--node",
        node,
        "--nats-url",
        "nats://127.0.0.1:1",
        "--nats-connect-timeout",
        "1",
        "--metrics-port",
        "0",
    )
    assert result.returncode == 2, result.stderr
    assert "--node (or NUMAFIT_NODE)" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and len(result.stderr) < 300  # bounded, one line


def test_an_xid_file_needs_simulated_gpus(tmp_path: Path) -> None:
    result = run("--node", "node-1", "--xid-file", str(tmp_path / "xids"))
    assert result.returncode == 2 and "--xid-file needs --topology" in result.stderr
