"""The services as an operator runs them: `numafit run ...` processes, probes, metrics, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import orjson

from shared import subjects
from shared.service import natsconn
from tests.integration.harness import wait_for
from tests.integration.processes import (
    NUMAFIT,
    free_port,
    get,
    kube_emulator_process,
    ready,
    spawn,
)
from tests.raw_kube import raw

WORKED = Path(__file__).resolve().parents[2] / "shared" / "data" / "plan-worked-example.json"


async def test_services_run_probe_serve_and_drain(
    nats_url: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    kubeconfig = await kube_emulator_process(processes, tmp_path)

    # Seed the cluster through the emulator with the worked example.
    from shared.service.kube import api_client
    from shared.service.kube_io import Kube

    example = json.loads(WORKED.read_text())
    api = await api_client(str(kubeconfig))
    kube = Kube(api, "test")
    try:
        response = await raw(kube.core.create_node(example["node"], _preload_content=False))
        response.release()
        pod = example["pods"][0]
        pod["metadata"].pop("uid")
        pod["metadata"].pop("resourceVersion")
        response = await raw(kube.core.create_namespaced_pod("ml", pod, _preload_content=False))
        created = orjson.loads(await response.read())
    finally:
        await api.close()

    common = [
        "--nats-url",
        nats_url,
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-host",
        "127.0.0.1",
    ]
    accounting_port, refit_port = free_port(), free_port()
    accounting = spawn(
        processes,
        "accounting",
        *common,
        "--metrics-port",
        str(accounting_port),
        log=tmp_path / "acc.log",
    )
    refit = spawn(
        processes, "refit", *common, "--metrics-port", str(refit_port), log=tmp_path / "refit.log"
    )

    await wait_for(lambda: ready(accounting_port), within=30)
    await wait_for(lambda: ready(refit_port), within=30)
    assert (await get(f"http://127.0.0.1:{accounting_port}/healthz"))[0] == 200

    nc = (await natsconn.connect(nats_url, "test")).client
    try:
        body = {
            "podUID": created["metadata"]["uid"],
            "podNamespace": "ml",
            "podName": "train",
            "nodeName": "node-1",
            "containerIndex": 1,
            "containerName": "main",
            "deviceType": "NVIDIA",
            "allowedDeviceUUIDs": ["GPU-b"],
            "mode": "strict",
            "timeoutMs": 2000,
        }
        reply = orjson.loads(
            (await natsconn.request(nc, subjects.refit("node-1"), orjson.dumps(body), 5)).data
        )
        assert reply["code"] == "moved"
    finally:
        await nc.close()

    _, refit_metrics = await get(f"http://127.0.0.1:{refit_port}/metrics")
    assert 'numafit_refit_requests_total{code="moved",mode="strict"} 1.0' in refit_metrics
    assert "numafit_refit_duration_seconds_bucket" in refit_metrics
    _, accounting_metrics = await get(f"http://127.0.0.1:{accounting_port}/metrics")
    assert 'numafit_accounting_commits_total{op="move",result="ok"} 1.0' in accounting_metrics
    assert (
        'numafit_accounting_device_memory_reserved_mib{node="node-1",uuid="GPU-b"} 30000.0'
        in accounting_metrics
    )
    assert 'numafit_accounting_ledger_revision{node="node-1"}' in accounting_metrics

    for process in (refit, accounting):
        process.send_signal(signal.SIGTERM)
    for process in (refit, accounting):
        assert await asyncio.to_thread(process.wait, 20) == 0
    log = (tmp_path / "acc.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert "accounting ready" in messages and "draining" in messages and "stopped" in messages


def test_run_without_a_reachable_nats_fails_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run(
        [
            NUMAFIT,
            "run",
            "refit",
            "--nats-url",
            f"nats://127.0.0.1:{free_port()}",
            "--kubeconfig",
            str(tmp_path / "missing"),
            "--metrics-port",
            str(port),
            "--log-format",
            "text",
            "--nats-connect-timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": ""},
    )
    assert result.returncode == 1
    assert "cannot reach NATS" in result.stderr and "Traceback" not in result.stderr


def test_run_help_lists_targets_and_options() -> None:
    result = subprocess.run(
        [NUMAFIT, "run", "accounting", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert (
        "--nats-url" in result.stdout
        and "--kubeconfig" in result.stdout
        and "--metrics-port" in result.stdout
    )
