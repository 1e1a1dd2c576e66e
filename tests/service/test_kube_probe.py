"""Every service with a Kubernetes client reports the API server's reachability on /readyz the
same way, from one probe: the scheduler's webhook and the refit agree with accounting."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from shared.service.health import Readiness
from shared.service.kube import api_client
from shared.service.runner import KUBE_API, probe_kube
from shared.testing.kube_emulator import KubeEmulator
from tests.integration.harness import wait_for

if TYPE_CHECKING:
    from pathlib import Path


async def test_readiness_follows_the_api_server(tmp_path: Path) -> None:
    emulator = KubeEmulator()
    await emulator.start()
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    api = await api_client(str(kubeconfig))
    readiness = Readiness("nats")
    readiness.set("nats")
    probe = asyncio.create_task(probe_kube(api, readiness, period=0.05))
    try:
        await wait_for(lambda: readiness._state.get(KUBE_API) is True, within=5)
        assert readiness.ready
        # The API server goes away: not ready, with the reason named.
        emulator.faults.add(path_regex="^/version", status=503)
        await wait_for(lambda: not readiness.ready, within=5)
        assert KUBE_API in readiness.missing()
        assert readiness.failure is None  # unreachable is not fatal: it may come back
        emulator.faults.clear()
        await wait_for(lambda: readiness.ready, within=5)
    finally:
        probe.cancel()
        await asyncio.gather(probe, return_exceptions=True)
        await api.close()
        await emulator.stop()
