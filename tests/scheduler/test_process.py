"""`numafit run scheduler` as an operator runs it: a process beside the emulator and accounting,
probed, scheduling one pod over HTTP, scraped, and drained by SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import TYPE_CHECKING

import aiohttp
import orjson

from shared.core import keys
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from tests.builders import gpu, node
from tests.integration.harness import wait_for
from tests.integration.processes import free_port, get, kube_emulator_process, ready, spawn
from tests.raw_kube import raw
from tests.scheduler.stack import pending_pod

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path


async def test_scheduler_process_serves_and_drains(
    nats_url: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    kubeconfig = await kube_emulator_process(processes, tmp_path)
    api = await api_client(str(kubeconfig))
    kube = Kube(api, "test")
    try:
        response = await raw(
            kube.core.create_node(
                node("node-1", [gpu("GPU-a", 0)]),  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
                _preload_content=False,
            )
        )
        response.release()
        response = await raw(
            kube.core.create_namespaced_pod(
                "ml",
                pending_pod("train"),  # type: ignore[arg-type]  # JSON body, not the model: tests/raw_kube.py
                _preload_content=False,
            )
        )
        created = orjson.loads(await response.read())

        common = ["--nats-url", nats_url, "--kubeconfig", str(kubeconfig)]
        common += ["--metrics-host", "127.0.0.1", "--log-format", "json"]
        accounting_port, metrics_port, listen_port = free_port(), free_port(), free_port()
        spawn(
            processes,
            "accounting",
            *common,
            "--metrics-port",
            str(accounting_port),
            log=tmp_path / "acc.log",
        )
        scheduler = spawn(
            processes,
            "scheduler",
            *common,
            "--metrics-port",
            str(metrics_port),
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            str(listen_port),
            log=tmp_path / "scheduler.log",
        )
        await wait_for(lambda: ready(metrics_port), within=30)

        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{listen_port}/filter",
                json={"Pod": created, "NodeNames": ["node-1"]},
            ) as answer,
        ):
            assert answer.status == 200
            result = await answer.json()
        assert result["NodeNames"] == ["node-1"], result
        meta = created["metadata"]
        bind = {"PodName": "train", "PodNamespace": "ml", "PodUID": meta["uid"], "Node": "node-1"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{listen_port}/bind", json=bind) as answer,
        ):
            assert (answer.status, await answer.json()) == (200, {"Error": ""})
        current = await kube.get_pod("ml", "train")
        assert current["metadata"]["annotations"][keys.VGPU_NODE] == "node-1"
        assert current["spec"]["nodeName"] == "node-1"
    finally:
        await api.close()

    _, metrics = await get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert 'numafit_scheduler_filter_total{result="fit"} 1.0' in metrics
    assert "numafit_scheduler_filter_duration_seconds_bucket" in metrics
    assert (await get(f"http://127.0.0.1:{metrics_port}/healthz"))[0] == 200

    scheduler.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(scheduler.wait, 20) == 0
    lines = [
        json.loads(line)
        for line in (tmp_path / "scheduler.log").read_text().splitlines()
        if line.startswith("{")
    ]
    messages = [line["msg"] for line in lines]
    assert "read model ready" in messages
    assert "pod reserved" in messages
    assert "draining" in messages and "stopped" in messages
