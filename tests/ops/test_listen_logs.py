"""What the API emulator and the extender log when they start listening: the address really
bound (0.0.0.0 in compose's containers), not the loopback URL a client on the same host would
use; and the emulator's "ready" line names the URL its kubeconfig gives clients."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from shared.service.health import Readiness
from shared.testing.kube_emulator import KubeEmulator
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.server import SchedulerHttp
from svc_scheduler.webhook import PodWebhook

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parents[2]


def logged_url(caplog: pytest.LogCaptureFixture, message: str) -> str:
    (record,) = [r for r in caplog.records if r.getMessage() == message]
    url: str = record.__dict__["url"]
    return url


async def test_the_emulator_logs_the_address_it_listens_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="numafit")
    async with KubeEmulator(host="0.0.0.0", port=0) as emulator:
        assert logged_url(caplog, "kube emulator listening") == f"http://0.0.0.0:{emulator.port}"
        # Clients on this host still get the loopback URL.
        assert emulator.url == f"http://127.0.0.1:{emulator.port}"


async def test_the_extender_logs_the_address_it_listens_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="numafit")
    metrics = SchedulerMetrics()
    http = SchedulerHttp(
        None,  # type: ignore[arg-type]  # listening needs no extender
        PodWebhook(metrics=metrics),
        readiness=Readiness(),
        metrics=metrics,
        host="0.0.0.0",
        port=0,
    )
    await http.start()
    try:
        assert logged_url(caplog, "extender listening") == f"http://0.0.0.0:{http.port}"
        assert http.url == f"http://127.0.0.1:{http.port}"
    finally:
        await http.stop(1.0)


async def test_the_emulator_command_names_the_advertised_url_when_ready(tmp_path: Path) -> None:
    advertised = "http://kube-emulator:8080"
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "shared.testing.kube_emulator", "--host", "0.0.0.0", "--port", "0"),
        *("--kubeconfig-out", str(tmp_path / "kubeconfig"), "--advertise-url", advertised),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: dict[str, dict[str, object]] = {}
    try:
        assert process.stderr is not None
        async with asyncio.timeout(10):
            while "ready" not in lines:
                line = await process.stderr.readline()
                assert line, f"the emulator exited before it was ready: {lines}"
                entry = orjson.loads(line)
                lines[entry["msg"]] = entry
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            await process.communicate()
    assert str(lines["kube emulator listening"]["url"]).startswith("http://0.0.0.0:")
    assert lines["ready"]["url"] == advertised
    assert advertised in (tmp_path / "kubeconfig").read_text()
