"""svc_scheduler as a service: its command line, readiness gated on the first snapshot, drain,
and resynchronisation when accounting restarts (a new epoch)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from shared.service.health import Readiness
from shared.testing.kube_emulator import KubeEmulator
from shared.tools.cli import main as numafit_main
from svc_scheduler.__main__ import main
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.server import SchedulerHttp, tls_context
from svc_scheduler.service import SchedulerService
from svc_scheduler.settings import SchedulerOptions
from svc_scheduler.webhook import PodWebhook
from tests.integration.harness import Harness, wait_for
from tests.scheduler.stack import pending_pod, stack, two_nodes

if TYPE_CHECKING:
    from pathlib import Path


def test_help_explains_the_service(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--listen-host",
        "--listen-port",
        "--tls-cert-file",
        "--tls-key-file",
        "--scheduler-name",
        "--node-scheduler-policy",
        "--request-timeout",
        "--nats-url",
        "--kubeconfig",
        "--metrics-port",
        "/filter",
        "/webhook",
    ):
        assert flag in text, flag
    with pytest.raises(SystemExit) as exited:
        numafit_main(["run", "scheduler", "--help"])
    assert exited.value.code == 0
    assert "numafit run scheduler" in capsys.readouterr().out


def test_bad_tls_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--tls-cert-file", "/nonexistent.pem"])
    assert exited.value.code == 2
    assert "--tls-key-file" in capsys.readouterr().err


async def test_ready_only_after_the_first_snapshot(nats_url: str, tmp_path: Path) -> None:
    async with KubeEmulator() as emulator:
        h = Harness(emulator, emulator.write_kubeconfig(tmp_path / "kubeconfig"), nats_url)
        local = SchedulerOptions(host="127.0.0.1", port=0)
        scheduler = SchedulerService(await h._nats("scheduler"), None, local)
        try:
            await scheduler.start()
            assert not scheduler.readiness.ready
            assert "read-model" in scheduler.readiness.missing()
            await h.start_accounting()  # accounting answers from now on
            await wait_for(lambda: scheduler.readiness.ready)
        finally:
            await scheduler.stop(1.0)
            await h.stop()


async def test_draining_refuses_new_requests(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        s.scheduler.readiness.draining = True
        created = await s.h.create("pod", pending_pod("train"))
        status, body = await s.post("/filter", {"Pod": created, "NodeNames": ["node-1"]})
        assert status == 503
        assert "shutting down" in body["Error"]
        s.scheduler.readiness.draining = False


async def test_accounting_restart_resyncs_the_read_model(nats_url: str, tmp_path: Path) -> None:
    async with stack(nats_url, tmp_path, two_nodes()) as s:
        model = s.scheduler.read_model
        first = await s.h.create("pod", pending_pod("first"))
        assert (await s.filter(first, ["node-1", "node-2"]))["NodeNames"] == ["node-1"]
        await s.bind(first, "node-1")  # written to the pod: it survives a restart
        old_epoch = model.epoch
        held = model.view("node-1")
        assert held is not None
        old = s.h.accounting
        assert old is not None
        await old.stop(1.0)
        registry = s.scheduler.metrics.registry

        def snapshots(scope: str) -> float:
            value = registry.get_sample_value(
                "numafit_scheduler_read_model_snapshots_total", {"scope": scope}
            )
            return value or 0.0

        before = {scope: snapshots(scope) for scope in ("all", "node")}
        await s.h.start_accounting()  # rebuilds from the annotations, new epoch, publishes
        # Each node's update under the new epoch makes that node stale (shared/core/freshness.py).
        await wait_for(lambda: model.freshness.needs_fetch("node-1"))
        second = await s.h.create("pod", pending_pod("second", mem=25000))
        result = await s.filter(second, ["node-1", "node-2"])
        # The first pod's 20 GB survived the restart: 25 GB more does not fit GPU-a.
        assert result["NodeNames"] == []
        assert result["FailedNodes"]["node-1"] == "1/1 CardInsufficientMemory"
        assert model.epoch != old_epoch
        view = model.view("node-1")
        assert view is not None and view.epoch != held.epoch
        # The candidates were fetched, each node alone (this commit: an epoch is per node; the
        # read model no longer fetches the whole cluster on an epoch it has not seen).
        assert snapshots("node") > before["node"] and snapshots("all") == before["all"]


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    key_options = ["-newkey", "rsa:2048", "-nodes", "-keyout", str(key)]
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        ["openssl", "req", "-x509", "-days", "1", *key_options, *subject, "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_listener_serves_the_webhook(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    metrics = SchedulerMetrics()
    http = SchedulerHttp(
        None,  # type: ignore[arg-type]  # the webhook needs no extender
        PodWebhook(metrics=metrics),
        readiness=Readiness(),
        metrics=metrics,
        host="127.0.0.1",
        port=0,
        ssl_context=tls_context(str(cert), str(key)),
    )
    await http.start()
    try:
        assert http.url.startswith("https://127.0.0.1:")
        client_tls = ssl.create_default_context(cafile=str(cert))
        body: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
        body["request"] = {"uid": "u1", "operation": "CREATE", "namespace": "ml", "object": {}}
        async with (
            aiohttp.ClientSession() as session,
            session.post(http.url + "/validate", json=body, ssl=client_tls) as response,
        ):
            assert response.status == 200
            reply = await response.json()
        assert reply["response"] == {"uid": "u1", "allowed": True}
    finally:
        await http.stop(1.0)
