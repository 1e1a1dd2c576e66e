"""A kubeconfig that cannot be used is named in the one line a service prints before it exits:
the path and why, for every service (they share `api_client`) and for sim-node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.service.kube import KubeconfigError, api_client

NUMAFIT = str(Path(sys.executable).with_name("numafit"))


async def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kubeconfig"
    with pytest.raises(KubeconfigError) as caught:
        await api_client(str(missing))
    assert str(caught.value) == f"cannot read kubeconfig {missing}: No such file or directory"


async def test_a_directory_is_not_a_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError) as caught:
        await api_client(str(tmp_path))
    assert str(caught.value) == f"cannot read kubeconfig {tmp_path}: Is a directory"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("clusters: [", "while parsing a flow node"),
        ("apiVersion: v1\n", "Expected key current-context"),
    ],
)
async def test_an_unusable_kubeconfig_is_named_in_one_line(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeconfigError) as caught:
        await api_client(str(path))
    message = str(caught.value)
    assert message.startswith(f"kubeconfig {path} is not usable: ")
    assert why in message and "\n" not in message


async def test_outside_a_cluster_without_a_kubeconfig_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(
        KubeconfigError, match=r"^no kubeconfig given \(--kubeconfig or KUBECONFIG\)"
    ):
        await api_client(None)


@pytest.mark.parametrize("target", ["accounting", "refit", "scheduler"])
def test_a_service_names_its_kubeconfig(nats_url: str, tmp_path: Path, target: str) -> None:
    missing = tmp_path / "missing-kubeconfig"
    result = subprocess.run(
        [
            NUMAFIT,
            "run",
            target,
            *("--nats-url", nats_url, "--kubeconfig", str(missing)),
            *("--metrics-port", "0", "--log-format", "text"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": ""},
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert errors == [
        f"error   numafit: service failed error=cannot read kubeconfig {missing}: "
        "No such file or directory"
    ], result.stderr
    assert "Traceback" not in result.stderr


def test_sim_node_names_its_kubeconfig(nats_url: str, tmp_path: Path) -> None:
    topology = tmp_path / "gpus.yaml"
    topology.write_text("gpus:\n  - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 0}\n")
    missing = tmp_path / "missing-kubeconfig"
    result = subprocess.run(
        [
            NUMAFIT,
            "run",
            "sim-node",
            *("--topology", str(topology), "--dir", str(tmp_path / "plugins")),
            *("--nats-url", nats_url, "--kubeconfig", str(missing), "--metrics-port", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"cannot read kubeconfig {missing}: No such file or directory" in result.stderr
    assert "Traceback" not in result.stderr
